#!/usr/bin/env bash
# Device call (one GPU) at the session's last engine change, in the order of what matters:
# 1. build (with the convolution microbenchmark); 2. the GPU tests (-k "cuda or gpu") of every
# file that runs the CUDA engine; 3. the conv microbenchmark at 32,000 atoms (the radial
# tables with their coarse tail, against the same harness earlier in the session,
# ../conv_row_order_h200/); 4. benchmarks/bench_atom_order.py: the engine's model call on
# lattice-ordered and shuffled rattled fcc Cu (SevenNet-0, MACE-MP-0 medium), 32,000 atoms.
# Usage (repository root, on the device, carrying .carry/reference-tests.tar.xz and
# .carry/lammps.tar.xz): OUT=<folder> bash benchmarks/results/session_final2_h200/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
O=${OUT:?}
mkdir -p "$O"
REPO=$PWD STAGE=/tmp/e3fuse-stage PY=python3 LOG=$O/suite.log
export PYTHONUNBUFFERED=1
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
gpu_setup_carry
gpu_machine_info
gpu_build build/gpu "$O/build.log" -DE3FUSE_MICROBENCH=ON
timeout 330 $PY -m pytest -q -m "not slow" -p no:cacheprovider -p no:warnings -rfE --timeout 150 \
  -k "cuda or gpu" tests/test_ops.py tests/test_models.py tests/test_mace.py tests/test_calculator.py \
  tests/test_mace_foundation_combos.py tests/test_mace_radial.py tests/test_mace_zbl.py \
  tests/test_mace_nonlinear.py tests/test_graph_reuse.py tests/test_regions.py tests/test_lammps.py \
  tests/test_radial_table.py 2>&1 | tee "$O/gpu_tests.log" | tail -25
timeout $((560 - SECONDS)) $PY benchmarks/micro/conv_micro.py --exe build/gpu/e3fuse_conv_micro \
  --models 7net-l3i5 7net-0 mp0-medium --engines e3fuse --sizes 32000 --repeats 3 \
  --deadline-s 400 --json "$O/micro_coarse_tail.json" 2>&1 | tee "$O/micro.log" | grep -E "^\||all" | tail -12
export E3FUSE_BENCH_PYTHON=$STAGE
timeout $((590 - SECONDS)) $PY benchmarks/bench_atom_order.py benchmarks/models/7net-0.e3f \
  benchmarks/models/mace-mp0-medium-random.e3f --sizes 32000 --repeats 5 \
  --json "$O/atom_order.json" 2>&1 | tee "$O/atom_order.log"
echo "elapsed ${SECONDS}s"
