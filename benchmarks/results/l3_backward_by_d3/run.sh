# Prepared (nineteenth session), not yet run: SevenNet-l3i5's l = 3 backward with its
# tasks compiled once per output dimension (tp_backward_task_by_d3, by_d3.patch) against the
# device's committed tree, at 2 blocks per SM (new) and 3 (minb3). ncu of layer 1's backward
# first (the no-instruction stall is the question), then timing. One device call, carry
# .carry/reference-tests.tar.xz, about 8 minutes:
#   OUT=... bash benchmarks/results/l3_backward_by_d3/run.sh
# If it wins, the GPU test suite must run before it lands (the force sums change order).
set -uo pipefail
DIR=benchmarks/results/l3_backward_by_d3
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
BASE=HEAD OUT=$OUT/ab NCU=both NCU_LAYER=1 ROUNDS=${ROUNDS:-2} REPEATS=3 \
  MICRO_MODELS=7net-l3i5 MICRO_SIZES="32000 864" PATCH=$DIR/by_d3.patch \
  VARIANTS="minb3=$DIR/minb3_over_by_d3.patch" timeout ${AB_S:-560} bash scripts/gpu_ab.sh
echo "elapsed $SECONDS s"
cp "$OUT"/ab/ab_summary.md "$OUT"/ab/ab.log "$OUT"/ 2>/dev/null
tar -czf "$OUT"/ab.tar.gz -C "$OUT" ab && rm -rf "$OUT"/ab
