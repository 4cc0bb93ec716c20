# Two thread blocks per row for small graphs (RowSplit, issue 21: the 864-atom targets): the
# working tree (uncommitted edits over the device's committed tree) against that tree, one
# device call, carry .carry/reference-tests.tar.xz:
#   OUT=... bash benchmarks/results/row_split/run.sh
# 1. gpu_ab: conv microbenchmark of all layers, three models, 864, 2,048 and 4,000 atoms;
#    configurations base, new (row_parts' rule) and new under E3FUSE_CONV_SPLIT=1 (one block
#    per row everywhere) and =2 (two everywhere);
# 2. with the new build staged by gpu_ab, the CUDA model tests against sevenn in float64 and
#    the calculator's CUDA tests (finite differences, determinism): small systems, so two
#    blocks per row by the rule.
set -uo pipefail
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
BASE=HEAD OUT=$OUT/ab ROUNDS=${ROUNDS:-1} REPEATS=5 MICRO_SIZES="864 2048 4000" \
  NEW_ENVS="E3FUSE_CONV_SPLIT=1;E3FUSE_CONV_SPLIT=2" \
  timeout ${AB_S:-400} bash scripts/gpu_ab.sh
echo "A/B done at $SECONDS s"
source scripts/gpu_common.sh
gpu_adhoc_env  # the reference packages on PYTHONPATH, the build that gpu_ab staged first
timeout ${TEST_S:-150} python3 -m pytest -q -m "not slow" -p no:cacheprovider -p no:warnings -rfE \
  --timeout 100 -k "cuda" tests/test_models.py tests/test_calculator.py >"$OUT"/tests.log 2>&1
tail -12 "$OUT"/tests.log
echo "elapsed $SECONDS s"
cp "$OUT"/ab/ab_summary.md "$OUT"/ 2>/dev/null
tar -czf "$OUT"/ab.tar.gz -C "$OUT" ab && rm -rf "$OUT"/ab
