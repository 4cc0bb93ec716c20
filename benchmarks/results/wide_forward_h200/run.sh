# The wide forward kernel (issue 21): SevenNet-l3i5's convolution, the device's committed tree
# (base) against the working tree with the change uncommitted (new). One device call, carry
# .carry/reference-tests.tar.xz:
#   OUT=... bash benchmarks/results/wide_forward_h200/run.sh
set -uo pipefail
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
BASE=HEAD OUT=$OUT/ab ROUNDS=${ROUNDS:-2} REPEATS=3 MICRO_MODELS="${MODELS:-7net-l3i5}" \
  MICRO_SIZES="864 32000" timeout ${AB_S:-560} bash scripts/gpu_ab.sh
echo "elapsed $SECONDS s"
