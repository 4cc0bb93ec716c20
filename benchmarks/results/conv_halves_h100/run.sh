#!/usr/bin/env bash
# Device call: half-warp backward tasks for 32-channel blocks (issue 21) against the base,
# conv microbenchmark A/B (scripts/gpu_ab.sh), then the GPU tests of the SevenNet paths with
# the new build. The variant travels as variant_halves.patch (on 7078493, applied by
# gpu_ab.sh's PATCH); variant_inline.patch goes on top of it. Usage (repository root at
# 7078493, on the device, carrying .carry/reference.tar.xz):
#   BASE=7078493 OUT=<folder> bash benchmarks/results/conv_halves_h100/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
O=${OUT:?}
mkdir -p "$O"
PATCH=benchmarks/results/conv_halves_h100/variant_halves.patch \
  VARIANTS="inline=benchmarks/results/conv_halves_h100/variant_inline.patch" \
  MICRO_MODELS="7net-l3i5 7net-0" MICRO_SIZES="32000 864" ROUNDS=${ROUNDS:-2} REPEATS=3 OUT=$O/ab \
  timeout 450 bash scripts/gpu_ab.sh
REPO=$PWD STAGE=/tmp/e3fuse-stage PY=python3 LOG=$O/tests.log
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
gpu_adhoc_env
timeout $((590 - SECONDS)) $PY -m pytest -q -m "not slow" -p no:cacheprovider -p no:warnings -rfE \
  --timeout 150 -k "cuda or gpu" tests/test_models.py tests/test_ops.py tests/test_calculator.py \
  tests/test_radial_table.py 2>&1 | tee "$O/gpu_tests.log" | tail -15
echo "elapsed ${SECONDS}s"
