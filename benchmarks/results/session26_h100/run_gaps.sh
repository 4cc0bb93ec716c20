#!/usr/bin/env bash
# Prepared for call 3 of the twenty-sixth session (refused: too little device time left to
# start a machine), for the next session. On a fresh machine: the slimmed test carry (sevenn's
# checkpoints without their training state, scripts/slim_carry.sh) converts SevenNet-0 and
# SevenNet-l3i5 on the device, then call_timeline.py, which now names the largest idle gaps,
# times them and MACE-MP-0 medium at 864 atoms.
# Carry .carry/reference-tests.tar.xz:
#   OUT=... bash benchmarks/results/session26_h100/run_gaps.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
REPO=$PWD; STAGE=/tmp/e3fuse-stage; PY=python3; LOG=$OUT/run.log; SUMMARY=()
export PYTHONUNBUFFERED=1
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
gpu_start -- _core
gpu_timeline_models
say "converted at $SECONDS s"
gpu_timeline "$OUT/call_timeline" 864 "${TL_S:-60}"
say "elapsed $SECONDS s"
