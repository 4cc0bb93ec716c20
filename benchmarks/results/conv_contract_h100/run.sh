#!/usr/bin/env bash
# Device call: the chunk's {M, K} contraction with one thread per entry for a group of edges
# (conv.cu chunk_contract_sh, issue 21) against the base, conv microbenchmark A/B
# (scripts/gpu_ab.sh), then the GPU tests of the convolution paths with the new build.
# Usage (repository root, on the device, carrying .carry/reference.tar.xz):
#   BASE=<commit> OUT=<folder> bash benchmarks/results/conv_contract_h100/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
O=${OUT:?}
mkdir -p "$O"
git log -1 --oneline
MICRO_MODELS="7net-l3i5 7net-0 mp0-medium" MICRO_SIZES="32000 864" ROUNDS=${ROUNDS:-2} REPEATS=3 \
  OUT=$O/ab timeout 440 bash scripts/gpu_ab.sh
REPO=$PWD STAGE=/tmp/e3fuse-stage PY=python3 LOG=$O/tests.log
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
gpu_adhoc_env
timeout $((592 - SECONDS)) $PY -m pytest -q -m "not slow" -p no:cacheprovider -p no:warnings -rfE \
  --timeout 150 -x -k "cuda or gpu" tests/test_models.py tests/test_mace.py tests/test_ops.py \
  tests/test_mace_nonlinear.py tests/test_calculator.py tests/test_radial_table.py \
  2>&1 | tee "$O/gpu_tests.log" | tail -15
echo "elapsed ${SECONDS}s"
