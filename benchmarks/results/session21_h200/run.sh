# Twenty-first session (issue 21): the model-call harness for MACE-MP-0 medium at the current
# kernels (its last run was at 3da28e8), the stage profile of the three models, and ncu's
# per-kernel table of SevenNet-l3i5 at 32,000 atoms; one device call, carry
# .carry/reference.tar.xz (cuEquivariance for the anchors):
#   OUT=... bash benchmarks/results/session21_h200/run.sh
set -uo pipefail
DEADLINE_S=100 BENCH_ARGS="--sizes 864 32000 --repeats 5 --warmup 2" PROFILE_RADIAL=table \
  PROFILE_SIZES="864 32000" OUT=$OUT timeout ${SUITE_S:-420} bash scripts/gpu_suite.sh \
  calls:mace profile:all
echo "suite done at $SECONDS s"
source scripts/gpu_common.sh
gpu_adhoc_env
OUT=$OUT MODELS="7net-l3i5" SIZES=32000 timeout ${NCU_S:-150} bash scripts/gpu_roofline.sh
rm -f "$OUT"/*.csv
echo "elapsed $SECONDS s"
