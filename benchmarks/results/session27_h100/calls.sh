#!/usr/bin/env bash
# Twenty-seventh session: the labelled model call and ASE MD step of every engine
# (scripts/gpu_suite.sh calls), SevenNet-l3i5, SevenNet-0 and MACE-MP-0 medium at 864 and
# 32,000 atoms beside sevenn / mace-torch with cuEquivariance, on the tree as it is. One
# gpu_suite.sh run per model, so that a call cut short keeps the models it finished; each
# model's tables (calls_<model>_<gpu>.md, .json) are copied to $OUT as they come, and the
# suite logs go to $OUT/suite.log. LIMIT_S (default 480): no model is started after it, and
# the one running is stopped there. MODELS: the models' gpu_suite names, in order. PATCHES:
# patch files applied to the tree first (the device re-sends the tree at each call).
# Carry .carry/reference.tar.xz:
#   OUT=... bash benchmarks/results/session27_h100/calls.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
LIMIT_S=${LIMIT_S:-480}
LOG=$OUT/suite.log
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
# shellcheck disable=SC2086 # PATCHES: one argument per file
gpu_apply_patches ${PATCHES:-}
started=$(mktemp) # the tables written after it are this call's (not a file under $OUT)
for m in ${MODELS:-7net-l3i5 7net-0 mace}; do
  left=$((LIMIT_S - SECONDS))
  ((left > 30)) || break
  OUT=$OUT/suite_$m DEADLINE_S=${DEADLINE_S:-80} \
    BENCH_ARGS="--sizes 864 32000 --repeats 5 --warmup 2" \
    timeout "$left" bash scripts/gpu_suite.sh "calls:$m" >/dev/null 2>&1
  echo "== $m: rc $? at $SECONDS s" | tee -a "$LOG"
  cat "$OUT/suite_$m/suite.log" >>"$LOG" 2>/dev/null
  rm -rf "$OUT/suite_$m"
  find benchmarks/results -maxdepth 1 -name 'calls_*' -newer "$started" -exec cp {} "$OUT"/ \;
done
grep -h -A12 "^--- benchmarks/results/calls" "$LOG"
ls "$OUT"
