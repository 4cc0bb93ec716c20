# Prepared, not yet run (eighteenth session): the float32 backward of layers with l = 3 inputs
# (SevenNet-l3i5's layers 1-3) budgeted for 3 or 4 blocks per SM instead of 2. Each variant is
# a patch of conv_backward's kernel choice; base and new are the device's committed tree (new =
# base: the spread between them is the noise). One device call, carry
# .carry/reference-tests.tar.xz, about 7 minutes:
#   OUT=... bash benchmarks/results/l3_backward_occupancy/run.sh
# SevenNet-0's l = 2 layers at 3 blocks: VARIANTS="minb3_d5=$DIR/minb3_d5.patch" MODELS=7net-0.
set -uo pipefail
DIR=benchmarks/results/l3_backward_occupancy
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
BASE=HEAD OUT=$OUT/ab ROUNDS=${ROUNDS:-2} REPEATS=3 MICRO_MODELS="${MODELS:-7net-l3i5}" \
  MICRO_SIZES="864 32000" \
  VARIANTS="${VARIANTS:-minb3_d7=$DIR/minb3_d7.patch minb4_d7=$DIR/minb4_d7.patch}" \
  timeout ${AB_S:-570} bash scripts/gpu_ab.sh
echo "elapsed $SECONDS s"
