# Prepared (twenty-first session), not yet run: why half a row costs about 0.66 of a whole
# one in SevenNet-l3i5's layers 1-3 backward (README.md: two blocks per row cost 1.32x at
# 4,000 atoms where the chunks grow by 5-9 %). One device call, carry
# .carry/reference-tests.tar.xz, about 6 minutes:
#   OUT=... bash benchmarks/results/row_split/ncu_half_rows.sh
# ncu of layer 1's backward at 4,000 atoms (15 waves of blocks: no tail), base (one block
# per row) against base + row_split.patch with every row in two blocks (E3FUSE_CONV_SPLIT=2,
# which the base does not read): instructions, stall reasons, L1 / L2 traffic per launch.
set -uo pipefail
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
E3FUSE_CONV_SPLIT=2 BASE=HEAD NCU=1 NCU_LAYER=1 MICRO_MODELS=7net-l3i5 MICRO_SIZES=4000 \
  PATCH=benchmarks/results/row_split/row_split.patch OUT=$OUT/ncu \
  timeout ${NCU_S:-500} bash scripts/gpu_ab.sh
echo "elapsed $SECONDS s"
tar -czf "$OUT"/ncu.tar.gz -C "$OUT" ncu && rm -rf "$OUT"/ncu
