# Probe of the split backward (split_backward.patch applied to the working tree): one build,
# the conv microbenchmark for SevenNet-l3i5 with E3FUSE_SPLIT_BACKWARD unset (one launch) and
# set (two launches), then the float32 CUDA tests of SevenNet-l3i5 with it set.
# Carry .carry/reference-tests.tar.xz.
#   git apply benchmarks/results/split_backward/split_backward.patch
#   OUT=... bash benchmarks/results/split_backward/run.sh
set -uo pipefail
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
REPO=$PWD; LOG=$OUT/run.log; STAGE=/tmp/e3fuse-stage; PY=python3; SUMMARY=()
source scripts/gpu_common.sh
gpu_setup_carry
gpu_build build/gpu "$OUT/build.log" -DE3FUSE_MICROBENCH=ON -- _core e3fuse_conv_micro
for mode in one split; do
  if [[ $mode == one ]]; then unset E3FUSE_SPLIT_BACKWARD; else export E3FUSE_SPLIT_BACKWARD=1; fi
  timeout 150 python3 benchmarks/micro/conv_micro.py --exe build/gpu/e3fuse_conv_micro \
    --models 7net-l3i5 --engines e3fuse --sizes ${SIZES:-32000 864} --repeats 3 \
    --json "$OUT/split_$mode.json" 2>&1 | grep -v "^# " | tee -a "$LOG"
done
export E3FUSE_SPLIT_BACKWARD=1
timeout ${TEST_S:-200} python3 -m pytest -q -m "not slow" -p no:cacheprovider -p no:warnings -rfE \
  --timeout 150 -k "(cuda or gpu) and (float32 or f32) and not mace" tests/test_models.py \
  tests/test_calculator.py tests/test_graph_reuse.py tests/test_regions.py \
  tests/test_radial_table.py >"$OUT/tests_split.log" 2>&1
tail -15 "$OUT/tests_split.log"
echo elapsed $SECONDS
