#!/usr/bin/env bash
# Device call for issue 22 (several GPUs): build, the GPU tests of the overlapped halo
# exchange, SevenNet-0 weak scaling 1 -> 2 -> 4 GPUs with the overlap, and the 2-GPU case
# again in the synchronous order (E3FUSE_HALO_OVERLAP=0) for the overlap's A/B.
# Usage (repository root, on the device): OUT=<folder> bash benchmarks/results/lammps_overlap_h200x4/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
O=${OUT:?}
TESTS_FILES="tests/test_lammps.py tests/test_graph_reuse.py" \
  TESTS_K="halo_overlap or cuda_aware or own_exchange or device_cuda" \
  PYTEST_ADDOPTS="-p no:warnings -rfE --timeout 120" OUT=$O/tests \
  timeout 330 bash scripts/gpu_suite.sh tests
DEADLINE_S=150 LAMMPS_SCALING_ARGS="--ranks 1,2,4 --strong-atoms 0 --steps 3 --warmup 1 \
  --case-timeout-s 90 --check-atoms 2000" OUT=$O/scaling \
  timeout 200 bash scripts/gpu_suite.sh lammps-scaling:7net-0
# the same 2-GPU case in the synchronous order (no overlap)
REPO=$PWD STAGE=/tmp/e3fuse-stage PY=python3 LOG=$O/sync_env.log
source scripts/gpu_common.sh
gpu_setup_carry
E3FUSE_HALO_OVERLAP=0 timeout 75 python3 benchmarks/bench_lammps_scaling.py \
  --model 7net-0=benchmarks/models/7net-0.e3f --device cuda --ranks 2 --strong-atoms 0 \
  --steps 3 --warmup 1 --case-timeout-s 70 --plugin /tmp/e3fuse-stage/e3fuse/lammps_plugins/e3fusepairplugin.so \
  --workdir /tmp/e3fuse-sync --log-dir $O/sync_logs --out $O/sync --tag sync --no-merge \
  > $O/sync.txt 2>&1
tail -5 $O/sync.txt
