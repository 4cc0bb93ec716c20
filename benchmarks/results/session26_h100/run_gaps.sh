#!/usr/bin/env bash
# Twenty-sixth session, call 3 (the last 285 s of device time): on a fresh machine, the
# slimmed test carry (sevenn's checkpoints without their training state, scripts/slim_carry.sh)
# converts SevenNet-0 and SevenNet-l3i5 on the device, and call_timeline.py, which now names
# the largest idle gaps, times them at 864 atoms on 94f69f8's engine (57e5e8a's kernels).
# Carry .carry/reference-tests.tar.xz:
#   OUT=... bash benchmarks/results/session26_h100/run_gaps.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
REPO=$PWD; STAGE=/tmp/e3fuse-stage; PY=python3; LOG=$OUT/run.log; SUMMARY=()
export PYTHONUNBUFFERED=1
mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
gpu_setup_carry
gpu_build build/gpu "$OUT/build.log" -- _core
say "build done at $SECONDS s"
mkdir -p benchmarks/models
for m in 7net-0 7net-l3i5; do
  $PY -m e3fuse.cli convert sevennet $m -o benchmarks/models/$m.e3f >>"$LOG" 2>&1 ||
    echo "convert $m failed"
done
say "converted at $SECONDS s"
timeout "${TL_S:-40}" $PY benchmarks/diag/call_timeline.py --model 7net-0=benchmarks/models/7net-0.e3f \
  --model 7net-l3i5=benchmarks/models/7net-l3i5.e3f --sizes 864 --json "$OUT/call_timeline.json" \
  >"$OUT/call_timeline.txt" 2>&1
grep -v "^ .*us .*x " "$OUT/call_timeline.txt" | grep -v Warn
say "elapsed $SECONDS s"
