#!/usr/bin/env bash
# One device call for two prepared changes (the twenty-fifth session could start no machine):
# 1. ../linear_policy/linear_policy.patch (a measurement switch; by default the engine's rule)
#    goes onto the working tree;
# 2. scripts/gpu_ab_tests.sh: chunk pipelining (chunk_pipeline.patch) timed A/B against the
#    device's git HEAD (SevenNet-l3i5 and SevenNet-0 at 864 and 32,000 atoms), then the CUDA
#    tests of test_ops.py, test_mace.py, test_models.py and test_calculator.py on the patched
#    build;
# 3. on that build, the linear layers under each E3FUSE_LINEAR_POLICY
#    (../linear_policy/run_policies.sh).
# Carry .carry/reference-tests.tar.xz (and .carry/may2024.tar for the May 2024 SevenNet-0):
#   OUT=... bash benchmarks/results/chunk_pipeline/run.sh
# Each part has its own time limit (AB_S 300, TEST_S 120, LIN_S 100) and packs its results
# when it ends, so that a call cut short still returns the parts it finished.
set -uo pipefail
cd "$(dirname "$0")/../../.."
git apply benchmarks/results/linear_policy/linear_policy.patch || {
  echo "linear_policy.patch does not apply"
  exit 1
}
BASE=HEAD PATCH=benchmarks/results/chunk_pipeline/chunk_pipeline.patch ROUNDS=2 REPEATS=5 \
  MICRO_SIZES="864 32000" MICRO_MODELS="7net-l3i5 7net-0" AB_S=${AB_S:-300} \
  TEST_S=${TEST_S:-120} TESTS="tests/test_ops.py tests/test_mace.py tests/test_models.py
  tests/test_calculator.py" bash scripts/gpu_ab_tests.sh
mkdir -p "$OUT"/lin
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
gpu_adhoc_env
OUT=$OUT/lin timeout "${LIN_S:-100}" bash benchmarks/results/linear_policy/run_policies.sh
echo "linear policies at $SECONDS s"
cp "$OUT"/lin/linear_policy.md "$OUT"/ 2>/dev/null
tar -czf "$OUT"/lin.tar.gz -C "$OUT" lin && rm -rf "$OUT"/lin
