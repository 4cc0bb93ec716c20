#!/usr/bin/env bash
# Twenty-sixth session: the whole GPU test suite with the step graph, the paired linear
# launches and linear policy 3 landed, then the model call's GPU timeline at 864 and 32,000
# atoms (the issue's targets). Carries .carry/reference-tests.tar.xz, .carry/lammps.tar.xz and
# .carry/may2024.tar:
#   OUT=... bash benchmarks/results/session26_h100/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
REPO=$PWD; LOG=$OUT/suite.log; STAGE=/tmp/e3fuse-stage; PY=python3; SUMMARY=()
export PYTHONUNBUFFERED=1
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
gpu_setup_carry
gpu_machine_info
gpu_build build/gpu "$OUT/build.log"
say "build done at $SECONDS s"
timeout "${TEST_S:-400}" python3 -m pytest -q -m "not slow" -p no:cacheprovider -p no:warnings -rfE \
  --timeout 150 -k "cuda or gpu or replays" tests/test_ops.py tests/test_models.py tests/test_mace.py \
  tests/test_calculator.py tests/test_step_graph.py tests/test_mace_foundation_combos.py tests/test_mace_radial.py \
  tests/test_mace_zbl.py tests/test_mace_nonlinear.py tests/test_graph_reuse.py \
  tests/test_regions.py tests/test_lammps.py tests/test_radial_table.py \
  >"$OUT/gpu_tests_full.log" 2>&1
tail -15 "$OUT/gpu_tests_full.log"
say "tests done at $SECONDS s"
mkdir -p benchmarks/models
for m in 7net-0 7net-l3i5; do
  [[ -f benchmarks/models/$m.e3f ]] ||
    $PY -m e3fuse.cli convert sevennet $m -o benchmarks/models/$m.e3f >>"$LOG" 2>&1
done
f=benchmarks/models/mace-mp0-medium-random.e3f
[[ -f $f ]] || (cd benchmarks && $PY -c 'from pathlib import Path; import mace_models; mace_models.model_files("mp0-medium", Path("models"))') >>"$LOG" 2>&1
timeout "${TL_S:-120}" $PY benchmarks/diag/call_timeline.py --model 7net-0=benchmarks/models/7net-0.e3f \
  --model mace-mp0-medium=$f --model 7net-l3i5=benchmarks/models/7net-l3i5.e3f \
  --sizes ${SIZES:-864 32000} --json "$OUT/call_timeline.json" >"$OUT/call_timeline.txt" 2>&1
head -30 "$OUT/call_timeline.txt"
say "elapsed $SECONDS s"
