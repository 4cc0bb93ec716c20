#!/usr/bin/env bash
# The convolution microbenchmark and the labelled model-call / ASE-MD-step benchmark (issue 21)
# in one device call, for a GPU machine without network (what gpu_suite.sh needs, with the
# reference carry .carry/reference.tar.xz for sevenn, mace-torch and cuEquivariance):
#
#   OUT=/path bash scripts/gpu_micro.sh
#
# 1. builds e3fuse with CUDA and -DE3FUSE_MICROBENCH=ON (targets _core, e3fuse_conv_micro);
# 2. benchmarks/micro/conv_micro.py: each convolution layer of SevenNet-0, SevenNet-l3i5 and the
#    MACE-MP-0 medium architecture at 864 and 32,000 atoms, forward and backward: e3fuse's
#    kernels (e3fuse_conv_micro) and cuEquivariance's fused TP + scatter with the package's
#    radial MLP beside it (benchmarks/micro/README.md);
# 3. benchmarks/bench_gpu.py --kinds model-call md-step for the three models at the same sizes:
#    e3fuse and sevenn / mace-torch with cuEquivariance (and without, at 864 atoms, when E3NN=1).
#
# Writes three files to $OUT: micro_summary.md (the tables), micro_results.json (every number,
# with commit, GPU and command) and micro.log. Wall time about 6-7 minutes on a fresh H100
# machine (build ~2 min, model files ~1 min); the benchmark stages stop starting new cases at
# their deadlines (TOTAL_S) and write what they measured.
#
# Environment: OUT (default benchmarks/results/gpu_micro), TOTAL_S (wall-time target, default
# 420 s from the start), MICRO_SIZES / CALL_SIZES (default "864 32000"), MICRO_MODELS (default
# "7net-0 7net-l3i5 mp0-medium"), REPEATS (micro, default 10), CALL_REPEATS (default 5),
# E3NN (1: also sevenn / mace-torch without cuEquivariance at 864 atoms), CALLS (0: the
# microbenchmark only), MICRO_ENGINES (default "e3fuse cueq"), E3FUSE_BUILD
# (default build/gpu), CUDA_ARCH (default 90).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
START=$SECONDS
OUTDIR=${OUT:-$REPO/benchmarks/results/gpu_micro}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
LOG=$OUTDIR/micro.log
: >"$LOG"
WORK=$(mktemp -d /tmp/e3fuse-micro.XXXXXX)
BUILD=${E3FUSE_BUILD:-build/gpu}
STAGE=/tmp/e3fuse-stage
PY=${PYTHON:-python3}
TOTAL_S=${TOTAL_S:-420}
export PYTHONUNBUFFERED=1
SUMMARY=()
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh

left() { echo $((TOTAL_S - (SECONDS - START))); }

gpu_setup_carry
gpu_machine_info
gpu_build "$BUILD" "$WORK/build.log" -DE3FUSE_MICROBENCH=ON -- _core e3fuse_conv_micro
[[ -x $BUILD/e3fuse_conv_micro ]] || die "e3fuse_conv_micro was not built"
export E3FUSE_COMMIT=${E3FUSE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}

FAILED=0
models=${MICRO_MODELS:-"7net-0 7net-l3i5 mp0-medium"}
say "model files: $models (converted here; the MACE architecture built with random weights)"
# shellcheck disable=SC2086
$PY -c 'import sys; from pathlib import Path; sys.path.insert(0, "benchmarks/micro"); import conv_micro; [print(n, *conv_micro.model_files(n, Path("benchmarks/models")), flush=True) for n in sys.argv[1:]]' $models 2>&1 | tee -a "$LOG"
[[ ${PIPESTATUS[0]} -eq 0 ]] || die "the model files could not be made"
say "convolution microbenchmark ($(left) s left)"
# the microbenchmark starts cases until 150 s before the end (at least 120 s from now), the
# labelled calls get the rest
micro_deadline=$(($(left) - 150))
[[ $micro_deadline -lt 120 ]] && micro_deadline=120
# shellcheck disable=SC2086
$PY benchmarks/micro/conv_micro.py --exe "$BUILD/e3fuse_conv_micro" --models $models \
  --engines ${MICRO_ENGINES:-e3fuse cueq} \
  --sizes ${MICRO_SIZES:-864 32000} --repeats "${REPEATS:-10}" \
  --deadline-s "$micro_deadline" --json "$WORK/micro.json" --markdown "$WORK/micro.md" \
  2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
SUMMARY+=("$(printf '%-28s rc=%-3s %5ss' conv_micro "$rc" "$((SECONDS - START))")")
[[ $rc -ne 0 ]] && FAILED=1

remaining=$(echo $models | wc -w)
[[ ${CALLS:-1} == 0 ]] && models=""
for model in $models; do
  case $model in
  mp0-medium) fam=mace upstream=mace ;;
  *) fam=sevennet upstream=sevenn ;;
  esac
  engines="e3fuse $upstream-cueq"
  [[ ${E3NN:-0} == 1 ]] && engines="$engines $upstream"
  # an equal share of what is left for each model still to run
  budget=$((($(left) - 10) / remaining))
  remaining=$((remaining - 1))
  if [[ $budget -le 20 ]]; then
    echo "calls $model: skipped, the wall-time target is reached" | tee -a "$LOG"
    FAILED=1
    continue
  fi
  say "model call and ASE MD step: $model (budget $budget s)"
  # shellcheck disable=SC2086
  $PY benchmarks/bench_gpu.py --family "$fam" --model "$model" --kinds model-call md-step \
    --engines $engines --sizes ${CALL_SIZES:-864 32000} --repeats "${CALL_REPEATS:-5}" \
    --warmup 2 --budget-s 3 --e3nn-max-atoms 864 --timeout "$budget" --deadline-s "$budget" \
    --out-dir "$WORK/calls" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  SUMMARY+=("$(printf '%-28s rc=%-3s %5ss' "calls-$model" "$rc" "$((SECONDS - START))")")
  [[ $rc -ne 0 ]] && FAILED=1
done

# ------------------------------------------------------------------ the three files
{
  echo "# gpu_micro.sh at $E3FUSE_COMMIT"
  echo
  [[ -f $WORK/micro.md ]] && cat "$WORK/micro.md"
  for f in "$WORK"/calls/calls_*.md; do
    [[ -f $f ]] && echo && cat "$f"
  done
} >"$OUTDIR/micro_summary.md"
$PY - "$WORK" "$OUTDIR/micro_results.json" <<'EOF'
import json, sys
from pathlib import Path
work, out = Path(sys.argv[1]), Path(sys.argv[2])
doc = {"micro": None, "calls": []}
if (work / "micro.json").is_file():
    doc["micro"] = json.loads((work / "micro.json").read_text())
for f in sorted((work / "calls").glob("calls_*.json")):
    doc["calls"].append(json.loads(f.read_text()))
out.write_text(json.dumps(doc, indent=1) + "\n")
EOF
{
  echo
  echo "================ summary ================"
  printf '%s\n' "${SUMMARY[@]}"
  echo "total $((SECONDS - START)) s; results: $OUTDIR/micro_summary.md, $OUTDIR/micro_results.json"
} | tee -a "$LOG"
tail -30 "$WORK/build.log" >>"$LOG"
rm -rf "$WORK"
exit $FAILED
