#!/usr/bin/env bash
# Device call (one GPU) at the session's last engine change: build; the GPU tests of every
# file the session's CUDA changes touch (-k "cuda or gpu"); then the stage profile of
# MACE-MP-0 / OMAT-0 medium and SevenNet-0 at 864 and 32,000 atoms in the time left.
# Usage (repository root, on the device): OUT=<folder> bash benchmarks/results/session_final_h200/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
O=${OUT:?}
TESTS_FILES="tests/test_ops.py tests/test_models.py tests/test_mace.py tests/test_calculator.py \
tests/test_mace_foundation_combos.py tests/test_mace_radial.py tests/test_mace_zbl.py \
tests/test_mace_nonlinear.py tests/test_graph_reuse.py tests/test_regions.py tests/test_lammps.py" \
  TESTS_K="cuda or gpu" PYTEST_ADDOPTS="-p no:warnings -rfE --timeout 150" OUT=$O/tests \
  timeout 420 bash scripts/gpu_suite.sh tests
PROFILE_SIZES="864 32000" PROFILE_RADIAL=table OUT=$O/profile \
  timeout $((590 - SECONDS)) bash scripts/gpu_suite.sh profile:mace-both profile:7net-0
