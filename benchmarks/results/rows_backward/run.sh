# Probe (issue 21), prepared in the fifteenth session, not yet run: the l = 3 backward with
# task bodies generic in d1 (rows_backward.patch: tp_backward_task_rows) against the tree it
# applies to, then the float32 CUDA tests of the patched build. One device call, carry
# .carry/reference-tests.tar.xz; the tree must be 0b6af70 or later with the patch unapplied.
#   OUT=... bash benchmarks/results/rows_backward/run.sh
set -uo pipefail
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
D=benchmarks/results/rows_backward
BASE=HEAD PATCH=$D/rows_backward.patch OUT=$OUT/ab ROUNDS=${ROUNDS:-2} REPEATS=3 \
  MICRO_MODELS=7net-l3i5 MICRO_SIZES="32000 864" timeout ${AB_S:-330} bash scripts/gpu_ab.sh
echo "A/B done at $SECONDS s"
# the staged module is the patched tree's (gpu_ab.sh builds the new tree last)
REPO=$PWD; STAGE=/tmp/e3fuse-stage; PY=python3; LOG=$OUT/run.log; SUMMARY=()
source scripts/gpu_common.sh && gpu_adhoc_env
timeout ${TEST_S:-240} python3 -m pytest -q -m "not slow" -p no:cacheprovider -p no:warnings -rfE \
  --timeout 150 -k "(cuda or gpu) and (float32 or f32)" tests/test_ops.py tests/test_models.py \
  tests/test_calculator.py tests/test_graph_reuse.py tests/test_regions.py \
  tests/test_radial_table.py tests/test_sevenn_multifidelity.py >"$OUT/tests_rows.log" 2>&1
tail -15 "$OUT/tests_rows.log"
echo elapsed $SECONDS
