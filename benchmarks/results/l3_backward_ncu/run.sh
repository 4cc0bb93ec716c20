# SevenNet-l3i5's l = 3 backward at 3 blocks per SM: why it loses (../l3_backward_occupancy/).
# ncu of layer 1's backward at 32,000 atoms, then timing: base = the device's committed tree
# (2 blocks per SM), new = base + minb3_d7.patch (3 blocks), ec2 = new + ec2_over_minb3_d7.patch
# (3 blocks, 2-edge chunks: half the shared memory, so more L1). One device call, carry
# .carry/reference-tests.tar.xz:
#   OUT=... bash benchmarks/results/l3_backward_ncu/run.sh
# Everything is packed into $OUT/ab.tar.gz beside the summary and the log (the device tool
# returns at most 8 files).
set -uo pipefail
DIR=benchmarks/results/l3_backward_ncu
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
BASE=HEAD OUT=$OUT/ab NCU=both NCU_LAYER=1 NCU_VARIANTS="base new" ROUNDS=${ROUNDS:-2} REPEATS=3 \
  MICRO_MODELS=7net-l3i5 MICRO_SIZES="32000 864" PATCH=$DIR/minb3_d7.patch \
  VARIANTS="ec2=$DIR/ec2_over_minb3_d7.patch" timeout ${AB_S:-560} bash scripts/gpu_ab.sh
echo "elapsed $SECONDS s"
cp "$OUT"/ab/ab_summary.md "$OUT"/ab/ab.log "$OUT"/ 2>/dev/null
tar -czf "$OUT"/ab.tar.gz -C "$OUT" ab && rm -rf "$OUT"/ab
