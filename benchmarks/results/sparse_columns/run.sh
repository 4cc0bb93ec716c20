# Issue 21: the {M, K} / M contraction over each column's nonzero Clebsch-Gordan coefficients
# only (the working tree) against HEAD, and the variant diagonal.patch (l2 = 0 paths: M diagonal,
# K zero), in one device call. Carry .carry/reference-tests.tar.xz.
#   OUT=... bash benchmarks/results/sparse_columns/run.sh
# (Recorded as run. At 0b6af70: git apply sparse_l3_backward.patch first, and BASE=cfac07f.)
set -uo pipefail
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
D=benchmarks/results/sparse_columns
BASE=HEAD OUT=$OUT/ab ROUNDS=${ROUNDS:-1} REPEATS=${REPEATS:-3} \
  MICRO_MODELS="7net-l3i5 7net-0 mp0-medium" MICRO_SIZES="32000 864" \
  VARIANTS="diag=$D/diagonal.patch" timeout ${AB_S:-560} bash scripts/gpu_ab.sh
echo elapsed $SECONDS
