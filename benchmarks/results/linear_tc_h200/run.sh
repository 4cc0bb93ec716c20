#!/usr/bin/env bash
# Device call (one GPU): build; the stage profile of MACE-MP-0 / OMAT-0 medium and SevenNet-0
# at 864 and 32,000 atoms with the float32 linears on the FMA kernel (E3FUSE_LINEAR_SIMT=1) and
# on the tensor cores (default); then the GPU tests of the session's CUDA changes (the
# linears, the density scale, the convolution; MORE_TESTS: more files) in the time left.
# Usage (repository root, on the device): OUT=<folder> bash benchmarks/results/linear_tc_h200/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
O=${OUT:?}
for v in 1 0; do
  E3FUSE_LINEAR_SIMT=$v PROFILE_SIZES="864 32000" PROFILE_RADIAL=table OUT=$O/profile_simt$v \
    timeout $((v == 1 ? 330 : 150)) bash scripts/gpu_suite.sh profile:mace-both profile:7net-0
done
TESTS_FILES="tests/test_ops.py tests/test_mace.py tests/test_mace_radial.py \
tests/test_mace_foundation_combos.py ${MORE_TESTS:-}" \
  TESTS_K="cuda or gpu" PYTEST_ADDOPTS="-p no:warnings -rfE --timeout 150" OUT=$O/tests \
  timeout $((585 - SECONDS)) bash scripts/gpu_suite.sh tests
