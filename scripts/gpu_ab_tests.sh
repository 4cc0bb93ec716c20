#!/usr/bin/env bash
# One device call for a convolution kernel change: scripts/gpu_ab.sh (base against the working
# tree, with PATCH / VARIANTS), its folder packed into $OUT/ab.tar.gz at once (the device tool
# returns at most 8 files, and a call cut short during the tests still returns the A/B), then
# the CUDA tests of TESTS (default tests/test_models.py and tests/test_calculator.py: against
# sevenn / mace-torch in float64, finite differences, determinism) on the build gpu_ab staged.
# Carry .carry/reference-tests.tar.xz (and .carry/may2024.tar for the May 2024 SevenNet-0's
# cases):
#
#   BASE=HEAD PATCH=x.patch MICRO_SIZES="864 32000" OUT=/path bash scripts/gpu_ab_tests.sh
#
# Environment: gpu_ab.sh's (BASE, PATCH, VARIANTS, ROUNDS, REPEATS, MICRO_SIZES, ...; OUT is
# the folder that comes back, the A/B goes to $OUT/ab), AB_S (seconds for gpu_ab, default
# 440), TESTS (test files), TEST_S (seconds for the tests, default 120).
set -uo pipefail
cd "$(dirname "$0")/.."
[[ -n ${OUT:-} ]] || {
  echo "OUT (the folder that comes back) is required" >&2
  exit 2
}
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
gpu_test_carry_as_reference
OUT=$OUT/ab timeout "${AB_S:-440}" bash scripts/gpu_ab.sh
echo "A/B done at $SECONDS s"
cp "$OUT"/ab/ab_summary.md "$OUT"/ 2>/dev/null
tar -czf "$OUT"/ab.tar.gz -C "$OUT" ab && rm -rf "$OUT"/ab
gpu_adhoc_env # the reference packages on PYTHONPATH, the build that gpu_ab staged first
# shellcheck disable=SC2086 # TESTS: one argument per file
timeout "${TEST_S:-120}" python3 -m pytest -q -m "not slow" -p no:cacheprovider -p no:warnings \
  -rfE --timeout 100 -k "cuda" ${TESTS:-tests/test_models.py tests/test_calculator.py} \
  >"$OUT"/tests.log 2>&1
tail -12 "$OUT"/tests.log
echo "elapsed $SECONDS s"
