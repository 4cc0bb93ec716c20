#!/usr/bin/env bash
# The small-system changes of issue 21 in one device call: the CUDA graph of a step
# (step_graph.patch, README.md) and the paired linear launches (../linear_pair/). Both patches
# go onto the working tree and the package is built once. Then:
# 1. ../linear_pair/compare.py: SevenNet-0 and SevenNet-l3i5 at 864 atoms with the pairs
#    (E3FUSE_LINEAR_PAIR=1) and without, in two processes: the results must be bitwise equal;
# 2. benchmarks/diag/call_timeline.py at 864 atoms (SevenNet-0, MACE-MP-0 medium,
#    SevenNet-l3i5) under the four settings of E3FUSE_STEP_GRAPH x E3FUSE_LINEAR_PAIR;
# 3. the CUDA tests: tests/test_step_graph.py and the CUDA cases of test_calculator,
#    test_graph_reuse, test_models and test_mace.
# Carry .carry/reference-tests.tar.xz (and .carry/may2024.tar):
#   OUT=... bash benchmarks/results/step_graph/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
REPO=$PWD; STAGE=/tmp/e3fuse-stage; PY=python3; LOG=$OUT/run.log; SUMMARY=()
export PYTHONUNBUFFERED=1
for patch in step_graph/step_graph.patch linear_pair/linear_pair.patch; do
  git apply "benchmarks/results/$patch" || {
    echo "$patch does not apply"
    exit 1
  }
done
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
gpu_setup_carry
gpu_machine_info
gpu_build build/gpu "$OUT/build.log" -- _core
say "build done at $SECONDS s"
gpu_timeline_models
f=benchmarks/models/mace-mp0-medium-random.e3f
for m in 7net-0 7net-l3i5; do
  for pair in 1 0; do
    E3FUSE_LINEAR_PAIR=$pair timeout 60 $PY benchmarks/results/linear_pair/compare.py save \
      "$OUT/pair_${m}_$pair.npz" --model benchmarks/models/$m.e3f >>"$LOG" 2>&1
  done
  $PY benchmarks/results/linear_pair/compare.py check "$OUT/pair_${m}_1.npz" "$OUT/pair_${m}_0.npz" |
    tee -a "$LOG"
done
rm -f "$OUT"/pair_*.npz
say "models and pair check done at $SECONDS s"
for run in g0p0 g1p0 g0p1 g1p1; do
  E3FUSE_STEP_GRAPH=${run:1:1} E3FUSE_LINEAR_PAIR=${run:3:1} timeout "${TL_S:-50}" \
    $PY benchmarks/diag/call_timeline.py --model 7net-0=benchmarks/models/7net-0.e3f \
    --model mace-mp0-medium=$f --model 7net-l3i5=benchmarks/models/7net-l3i5.e3f \
    --sizes ${SIZES:-864} >"$OUT/timeline_$run.txt" 2>&1
  grep "atoms: wall" "$OUT/timeline_$run.txt" | sed "s/^/$run /"
done
say "timelines done at $SECONDS s"
timeout "${TEST_S:-120}" $PY -m pytest -q -m "not slow" -p no:cacheprovider -p no:warnings -rfE \
  --timeout 150 tests/test_step_graph.py tests/test_calculator.py tests/test_graph_reuse.py \
  tests/test_models.py tests/test_mace.py -k "cuda or gpu or replays" >"$OUT/tests.log" 2>&1
tail -8 "$OUT/tests.log"
say "elapsed $SECONDS s"
