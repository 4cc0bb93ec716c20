# Probe of the sparse backward (issue 21): one build with E3FUSE_MICROBENCH, then the conv
# microbenchmark with E3FUSE_SPARSE_BACKWARD unset (the engine's {M, K} kernel), 1 (sparse,
# the l = 3 chunk cap kept) and 2 (sparse, no cap; SevenNet-l3i5 only, the only model it
# changes), then the float32 CUDA tests with the switch at 1. Carry .carry/reference-tests.tar.xz.
#   OUT=... bash benchmarks/results/sparse_backward/run.sh
set -uo pipefail
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
REPO=$PWD; LOG=$OUT/run.log; STAGE=/tmp/e3fuse-stage; PY=python3; SUMMARY=()
source scripts/gpu_common.sh
gpu_setup_carry
gpu_build build/gpu "$OUT/build.log" -DE3FUSE_MICROBENCH=ON -- _core e3fuse_conv_micro
grep -c "spill" "$OUT/build.log" >/dev/null || true
micro() {  # mode models...
  local mode=$1; shift
  if [[ $mode == base ]]; then unset E3FUSE_SPARSE_BACKWARD; else export E3FUSE_SPARSE_BACKWARD=$mode; fi
  timeout 150 python3 benchmarks/micro/conv_micro.py --exe build/gpu/e3fuse_conv_micro \
    --models "$@" --engines e3fuse --sizes ${SIZES:-32000 864} --repeats 3 \
    --json "$OUT/sb_$mode.json" 2>&1 | grep -v "^# " | tee -a "$LOG"
}
if [[ ${TESTS_ONLY:-0} != 1 ]]; then
  micro base 7net-l3i5 7net-0 mp0-medium
  micro 1 7net-l3i5 7net-0 mp0-medium
  micro 2 7net-l3i5
fi
export E3FUSE_SPARSE_BACKWARD=1
timeout ${TEST_S:-300} python3 -m pytest -q -m "not slow" -p no:cacheprovider -p no:warnings -rfE \
  --timeout 150 -k "(cuda or gpu) and (float32 or f32)" tests/test_ops.py tests/test_models.py \
  tests/test_mace.py tests/test_calculator.py tests/test_mace_foundation_combos.py \
  tests/test_mace_radial.py tests/test_mace_zbl.py tests/test_mace_nonlinear.py \
  tests/test_graph_reuse.py tests/test_regions.py tests/test_radial_table.py \
  >"$OUT/tests_sparse.log" 2>&1
tail -15 "$OUT/tests_sparse.log"
echo elapsed $SECONDS
