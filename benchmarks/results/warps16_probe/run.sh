# Probe (issue 21), prepared in the sixteenth session, not yet run: the convolution kernels with
# 16 warps per block instead of 8 (warps16.patch), the same register budget per thread, against
# the tree it applies to. One device call, carry .carry/reference-tests.tar.xz; the tree must
# be the device's session-start commit with the patch unapplied:
#   OUT=... bash benchmarks/results/warps16_probe/run.sh
set -uo pipefail
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
D=benchmarks/results/warps16_probe
BASE=HEAD PATCH=$D/warps16.patch OUT=$OUT/ab ROUNDS=${ROUNDS:-2} REPEATS=3 \
  MICRO_MODELS="${MODELS:-7net-0 7net-l3i5 mp0-medium}" MICRO_SIZES="864 32000" \
  timeout ${AB_S:-560} bash scripts/gpu_ab.sh
echo "elapsed $SECONDS s"
