# Prepared (twenty-first session), not yet run: two blocks per row for the rows of the last,
# partial wave of blocks only (tail_split.patch, README.md), one device call, carries
# .carry/reference-tests.tar.xz and .carry/may2024.tar, about 8 minutes:
#   OUT=... bash benchmarks/results/tail_split/run.sh
# 1. gpu_ab: conv microbenchmark of all layers, three models, 864, 2,048 and 32,000 atoms,
#    base (the tree) against new (the tree + tail_split.patch), two rounds;
# 2. with the new build staged by gpu_ab, the CUDA model tests against sevenn / mace-torch in
#    float64 and the calculator's CUDA tests (finite differences, determinism): their small
#    systems split every row (less than half a wave of blocks).
# If it wins: the whole GPU test suite (the LAMMPS tests run the ConvRows path, `listed`)
# before it lands.
set -uo pipefail
DIR=benchmarks/results/tail_split
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
BASE=HEAD OUT=$OUT/ab ROUNDS=${ROUNDS:-2} REPEATS=5 MICRO_SIZES="864 2048 32000" \
  PATCH=$DIR/tail_split.patch timeout ${AB_S:-440} bash scripts/gpu_ab.sh
echo "A/B done at $SECONDS s"
source scripts/gpu_common.sh
gpu_adhoc_env  # the reference packages on PYTHONPATH, the build that gpu_ab staged first
timeout ${TEST_S:-120} python3 -m pytest -q -m "not slow" -p no:cacheprovider -p no:warnings -rfE \
  --timeout 100 -k "cuda" tests/test_models.py tests/test_calculator.py >"$OUT"/tests.log 2>&1
tail -12 "$OUT"/tests.log
echo "elapsed $SECONDS s"
cp "$OUT"/ab/ab_summary.md "$OUT"/ 2>/dev/null
tar -czf "$OUT"/ab.tar.gz -C "$OUT" ab && rm -rf "$OUT"/ab
