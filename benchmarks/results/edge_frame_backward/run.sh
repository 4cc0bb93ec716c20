# The convolution backward in each edge's frame (issue 21): the working tree (uncommitted
# edits over the device's committed tree) against that tree, one device call, carry
# .carry/reference-tests.tar.xz:
#   OUT=... bash benchmarks/results/edge_frame_backward/run.sh
# 1. gpu_ab: conv microbenchmark of all layers, three models, 32,000 and 864 atoms;
# 2. with the new build staged by gpu_ab, the CUDA model tests against sevenn in float64
#    (SevenNet-0, SevenNet-l3i5 and the unnormalized SevenNet-0 of May 2024, float64 and
#    float32) and the calculator's CUDA tests (finite differences, determinism).
set -uo pipefail
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
BASE=HEAD OUT=$OUT/ab ROUNDS=${ROUNDS:-2} REPEATS=3 MICRO_SIZES="32000 864" \
  timeout ${AB_S:-400} bash scripts/gpu_ab.sh
echo "A/B done at $SECONDS s"
source scripts/gpu_common.sh
gpu_adhoc_env  # the reference packages on PYTHONPATH, the build that gpu_ab staged first
timeout ${TEST_S:-140} python3 -m pytest -q -m "not slow" -p no:cacheprovider -p no:warnings -rfE \
  --timeout 100 -k "cuda" tests/test_models.py tests/test_calculator.py >"$OUT"/tests.log 2>&1
tail -12 "$OUT"/tests.log
echo "elapsed $SECONDS s"
cp "$OUT"/ab/ab_summary.md "$OUT"/ 2>/dev/null
tar -czf "$OUT"/ab.tar.gz -C "$OUT" ab && rm -rf "$OUT"/ab
