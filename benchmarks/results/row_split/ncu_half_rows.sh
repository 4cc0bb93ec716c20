# Prepared (twenty-first session, rewritten in the twenty-second for the tree after ecf0445),
# not yet run: why half a row costs about 0.66 of a whole one in SevenNet-l3i5's layers 1-3
# backward (README.md: two blocks per row cost 1.32x at 4,000 atoms where the chunks grow by
# 5-9 %). One device call, carry .carry/reference-tests.tar.xz, about 7 minutes:
#   OUT=... bash benchmarks/results/row_split/ncu_half_rows.sh
# ncu of layer 1's backward at 4,000 atoms (15 waves of blocks: no tail), then one round of
# the conv microbenchmark there: base (the tree: one block per row at that size) against the
# tree + split_every_row.patch with every row in two blocks (E3FUSE_CONV_SPLIT=2, which only
# the patch reads; the kernels are the landed SPLIT ones): instructions, stall reasons,
# L1 / L2 traffic per launch, and the time.
set -uo pipefail
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
E3FUSE_CONV_SPLIT=2 BASE=HEAD NCU=both NCU_LAYER=1 ROUNDS=1 MICRO_MODELS=7net-l3i5 \
  MICRO_SIZES=4000 PATCH=benchmarks/results/row_split/split_every_row.patch OUT=$OUT/ncu \
  timeout ${NCU_S:-540} bash scripts/gpu_ab.sh
echo "elapsed $SECONDS s"
tar -czf "$OUT"/ncu.tar.gz -C "$OUT" ncu && rm -rf "$OUT"/ncu
