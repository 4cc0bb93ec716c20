# The float32 backward at 3 and 4 blocks per SM for the layers with l = 3 inputs (SevenNet-l3i5
# layers 1-3) and l = 2 inputs (SevenNet-0 layers 1-3) in one device call: base = the device's
# committed tree, new = base + minb3.patch (both kernel choices at 3 blocks), minb4 = new +
# minb4_over_minb3.patch (both at 4). Carry .carry/reference-tests.tar.xz:
#   OUT=... bash benchmarks/results/l3_backward_occupancy/run_both.sh
# The device tool returns at most 8 files: everything is packed into $OUT/ab.tar.gz beside the
# summary and the log.
set -uo pipefail
DIR=benchmarks/results/l3_backward_occupancy
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
BASE=HEAD OUT=$OUT/ab ROUNDS=${ROUNDS:-2} REPEATS=3 MICRO_MODELS="${MODELS:-7net-l3i5 7net-0}" \
  MICRO_SIZES="864 32000" PATCH=$DIR/minb3.patch VARIANTS="minb4=$DIR/minb4_over_minb3.patch" \
  timeout ${AB_S:-560} bash scripts/gpu_ab.sh
echo "elapsed $SECONDS s"
cp "$OUT"/ab/ab_summary.md "$OUT"/ab/ab.log "$OUT"/ab/resources.txt "$OUT"/ 2>/dev/null
tar -czf "$OUT"/ab.tar.gz -C "$OUT" ab && rm -rf "$OUT"/ab
