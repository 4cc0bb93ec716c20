#!/usr/bin/env bash
# One device call for pinned_upload.patch (README.md): the package built with it, then
# 1. ../linear_pair/compare.py: SevenNet-0 and SevenNet-l3i5 at 864 atoms with the pinned
#    upload (E3FUSE_PINNED_UPLOAD=1) and without, in two processes: bitwise equal;
# 2. the model call's timeline at 864 atoms (gpu_timeline: SevenNet-0, MACE-MP-0 medium,
#    SevenNet-l3i5) without and with, twice each, interleaved;
# 3. the CUDA tests of test_calculator, test_step_graph, test_graph_reuse and test_models.
# Carry .carry/reference-tests.tar.xz:
#   OUT=... bash benchmarks/results/pinned_upload/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
REPO=$PWD; STAGE=/tmp/e3fuse-stage; PY=python3; LOG=$OUT/run.log; SUMMARY=()
export PYTHONUNBUFFERED=1
git apply benchmarks/results/pinned_upload/pinned_upload.patch || {
  echo "pinned_upload.patch does not apply"
  exit 1
}
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
gpu_start -- _core
gpu_timeline_models
gpu_switch_bitwise E3FUSE_PINNED_UPLOAD
say "models and bitwise check done at $SECONDS s"
for run in p0a p1a p0b p1b; do
  E3FUSE_PINNED_UPLOAD=${run:1:1} gpu_timeline "$OUT/timeline_$run" 864 "${TL_S:-50}" |
    sed "s/^/$run /"
done
say "timelines done at $SECONDS s"
timeout "${TEST_S:-150}" $PY -m pytest -q -m "not slow" -p no:cacheprovider -p no:warnings -rfE \
  --timeout 150 tests/test_calculator.py tests/test_step_graph.py tests/test_graph_reuse.py \
  tests/test_models.py -k "cuda or gpu or replays" >"$OUT/tests.log" 2>&1
tail -8 "$OUT/tests.log"
say "elapsed $SECONDS s"
