# Tasks dealt by sub-partition (issue 21): the convolution kernels of the device's committed
# tree (base) against the working tree with the change to deal_tasks (conv.cu) uncommitted
# (new). One device call, carry .carry/reference-tests.tar.xz:
#   OUT=... bash benchmarks/results/subpartition_deal_h200/run.sh
set -uo pipefail
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
BASE=HEAD OUT=$OUT/ab ROUNDS=${ROUNDS:-2} REPEATS=3 \
  MICRO_MODELS="${MODELS:-7net-l3i5 7net-0 mp0-medium}" MICRO_SIZES="864 32000" \
  timeout ${AB_S:-570} bash scripts/gpu_ab.sh
echo "elapsed $SECONDS s"
