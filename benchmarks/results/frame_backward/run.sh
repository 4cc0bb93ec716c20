#!/usr/bin/env bash
# The edge-frame backward (benchmarks/micro/frame_backward_micro.cu) beside the engine's
# conv_backward: builds e3fuse with the microbenchmarks, makes the model files and rattled fcc
# Cu structures (conv_micro.py's), and runs the frame micro for each model and size. One device
# call, carry .carry/reference-tests.tar.xz:
#   OUT=... bash benchmarks/results/frame_backward/run.sh
# Environment: FRAME_MODELS (default "7net-l3i5 7net-0"), FRAME_SIZES (default "32000 864"),
# FRAME_EC (default "4"), REPEATS (default 5), NCU=1 for ncu of layer 1 of the first model and
# size (both kernels; the micro launches each twice per layer before the timed ones).
set -uo pipefail
cd "$(dirname "$0")/../../.."
REPO=$PWD
OUT=${OUT:?OUT is required}
mkdir -p "$OUT"
LOG=$OUT/run.log
: >"$LOG"
STAGE=/tmp/e3fuse-stage
PY=${PYTHON:-python3}
SUMMARY=()
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
gpu_setup_carry
gpu_machine_info
gpu_build build/gpu-frame "$OUT/build.log" -DE3FUSE_MICROBENCH=ON -- _core e3fuse_frame_backward_micro
say "build done at $SECONDS s"
exe=build/gpu-frame/e3fuse_frame_backward_micro
models=${FRAME_MODELS:-"7net-l3i5 7net-0"}
# shellcheck disable=SC2086
$PY -c 'import sys; from pathlib import Path; sys.path.insert(0, "benchmarks/micro"); import conv_micro; [print(n, *conv_micro.model_files(n, Path("benchmarks/models")), flush=True) for n in sys.argv[1:]]' $models 2>&1 | tee -a "$LOG"
for atoms in ${FRAME_SIZES:-32000 864}; do
  $PY -c 'import sys; from pathlib import Path; sys.path.insert(0, "benchmarks/micro"); import conv_micro as m; m.write_structure(m.structure(int(sys.argv[1])), Path(sys.argv[2]))' "$atoms" "benchmarks/models/cu$atoms.bin" || die "no structure file"
done
if [[ ${NCU:-0} != 0 ]]; then
  read -r model _ <<<"$models"
  read -r atoms _ <<<"${FRAME_SIZES:-32000 864}"
  say "ncu $model $atoms atoms, layer 1: engine then frame"
  timeout 240 ncu --kernel-name regex:"conv_backward_kernel|frame_backward_kernel" --launch-skip 4 \
    --launch-count 2 --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section SchedulerStats --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section InstructionStats \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    "$exe" --model "benchmarks/models/$model.e3f" --structure "benchmarks/models/cu$atoms.bin" \
    --warmup 0 --repeats 1 >"$OUT/ncu_${model}_$atoms.txt" 2>&1
  say "ncu rc=$? at $SECONDS s"
fi
for model in $models; do
  for atoms in ${FRAME_SIZES:-32000 864}; do
    for ec in ${FRAME_EC:-4}; do
      say "$model $atoms atoms, EC $ec"
      timeout 200 "$exe" --model "benchmarks/models/$model.e3f" --structure "benchmarks/models/cu$atoms.bin" \
        --ec "$ec" --warmup 2 --repeats "${REPEATS:-5}" --json-out "$OUT/frame_${model}_${atoms}_ec$ec.json" \
        >/dev/null 2>>"$LOG"
      say "rc=$? at $SECONDS s"
      $PY - "$OUT/frame_${model}_${atoms}_ec$ec.json" <<'PYEOF' 2>&1 | tee -a "$LOG"
import json, statistics, sys
r = json.load(open(sys.argv[1]))
te = tf = 0.0
for l in r["layers"]:
    e, f = statistics.median(l["engine_ms"]), statistics.median(l["frame_ms"])
    te += e; tf += f
    print(f"  layer {l['layer']}: engine {e:.3f} ms, frame {f:.3f} ms ({f / e:.3f}); diff {l['relative_difference']}; {l['warp_cost']}")
print(f"  layers run: engine {te:.3f} ms, frame {tf:.3f} ms ({tf / max(te, 1e-9):.3f})")
PYEOF
    done
  done
done
say "elapsed $SECONDS s"
