#!/usr/bin/env bash
# CUDA graph of a step (step_graph.patch, README.md): one device call. The patch goes onto the
# working tree, the package is built, then benchmarks/diag/call_timeline.py times the model
# call at 864 and 4,000 atoms with direct launches (E3FUSE_STEP_GRAPH=0) and with replays, in
# two rounds (off, on, on, off), and the CUDA tests run: tests/test_step_graph.py (replays
# bitwise equal to direct launches) and the CUDA cases of test_calculator, test_graph_reuse,
# test_models and test_mace. Carry .carry/reference-tests.tar.xz (and .carry/may2024.tar):
#   OUT=... bash benchmarks/results/step_graph/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
REPO=$PWD; STAGE=/tmp/e3fuse-stage; PY=python3; LOG=$OUT/run.log; SUMMARY=()
export PYTHONUNBUFFERED=1
git apply benchmarks/results/step_graph/step_graph.patch || {
  echo "step_graph.patch does not apply"
  exit 1
}
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
gpu_setup_carry
gpu_machine_info
gpu_build build/gpu "$OUT/build.log" -- _core
say "build done at $SECONDS s"
mkdir -p benchmarks/models
for m in 7net-0 7net-l3i5; do
  [[ -f benchmarks/models/$m.e3f ]] ||
    $PY -m e3fuse.cli convert sevennet $m -o benchmarks/models/$m.e3f >>"$LOG" 2>&1
done
# MACE-MP-0 medium with random weights: built by mace-torch, converted by the staged package
f=benchmarks/models/mace-mp0-medium-random.e3f
[[ -f $f ]] || (cd benchmarks && $PY -c 'from pathlib import Path; import mace_models; mace_models.model_files("mp0-medium", Path("models"))') >>"$LOG" 2>&1
say "models done at $SECONDS s"
for run in off1 on1 on2 off2; do
  graph=1
  [[ $run == off* ]] && graph=0
  sizes=${SIZES:-864 4000}
  [[ $run == *2 ]] && sizes=864 # the second round at 864 atoms only: the call's time
  # shellcheck disable=SC2086 # sizes: one argument per size
  E3FUSE_STEP_GRAPH=$graph timeout "${TL_S:-55}" $PY benchmarks/diag/call_timeline.py \
    --model 7net-0=benchmarks/models/7net-0.e3f --model mace-mp0-medium=$f \
    --model 7net-l3i5=benchmarks/models/7net-l3i5.e3f --sizes $sizes >"$OUT/timeline_$run.txt" 2>&1
  grep "atoms: wall" "$OUT/timeline_$run.txt" | sed "s/^/$run /"
done
say "timelines done at $SECONDS s"
timeout "${TEST_S:-130}" $PY -m pytest -q -m "not slow" -p no:cacheprovider -p no:warnings -rfE \
  --timeout 150 tests/test_step_graph.py tests/test_calculator.py tests/test_graph_reuse.py \
  tests/test_models.py tests/test_mace.py -k "cuda or gpu or replays" >"$OUT/tests.log" 2>&1
tail -8 "$OUT/tests.log"
say "elapsed $SECONDS s"
