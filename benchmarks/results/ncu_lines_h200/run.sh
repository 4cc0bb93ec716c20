#!/usr/bin/env bash
# ncu at the level of source lines and SASS instructions of the convolution kernels (issue 21):
# one launch each of layer 1's backward and forward at 32,000 atoms, float32, radial table,
# through the microbenchmark executable (benchmarks/micro). On the device, from the repository root:
#
#   OUT=/path bash benchmarks/results/ncu_lines_h200/run.sh
#
# Writes to $OUT: run.log, and ncu_lines.tar.xz holding, per model and pass, the ncu
# details page (<model>_<pass>_details.txt) and the source page as CSV, per SASS instruction
# (<model>_<pass>_sass.csv) and per CUDA line (<model>_<pass>_cuda.csv). The kernels are built
# with -lineinfo (CMakeLists.txt). Environment: NCU_MODELS (default "7net-l3i5 7net-0
# mp0-medium"), NCU_PASSES (default "backward forward"), ATOMS (default 32000).
set -uo pipefail
cd "$(dirname "$0")/../../.."
REPO=$PWD
OUTDIR=${OUT:-$REPO/benchmarks/results/ncu_lines_h200/out}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
LOG=$OUTDIR/run.log
: >"$LOG"
BUILD=build/gpu
STAGE=/tmp/e3fuse-stage
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
SUMMARY=()
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
WORK=$(mktemp -d /tmp/e3fuse-ncu.XXXXXX)

gpu_setup_carry
gpu_machine_info
gpu_build "$BUILD" "$WORK/build.log" -DE3FUSE_MICROBENCH=ON -- _core e3fuse_conv_micro
models=${NCU_MODELS:-"7net-l3i5 7net-0 mp0-medium"}
atoms=${ATOMS:-32000}
# shellcheck disable=SC2086
$PY -c 'import sys; from pathlib import Path; sys.path.insert(0, "benchmarks/micro"); import conv_micro; [print(n, *conv_micro.model_files(n, Path("benchmarks/models")), flush=True) for n in sys.argv[1:]]' $models 2>&1 | tee -a "$LOG"
[[ ${PIPESTATUS[0]} -eq 0 ]] || die "the model files could not be made"
structure=benchmarks/models/cu$atoms.bin # rattled fcc Cu, as conv_micro.py times it
$PY -c 'import sys; from pathlib import Path; sys.path.insert(0, "benchmarks/micro"); import conv_micro as m; m.write_structure(m.structure(int(sys.argv[1])), Path(sys.argv[2]))' "$atoms" "$structure" || die "no structure file"
ncu --version | tee -a "$LOG"
for model in $models; do
  e3f=benchmarks/models/$model.e3f
  [[ $model == mp0-medium ]] && e3f=benchmarks/models/mace-mp0-medium-random.e3f
  for pass in ${NCU_PASSES:-backward forward}; do
    rep=$WORK/${model}_$pass
    say "ncu $model $pass, layer 1, $atoms atoms"
    # layer 1: skip layer 0's launch of the same kernel family
    timeout 240 ncu --clock-control none --kernel-name "regex:conv_$pass" --launch-skip 1 \
      --launch-count 1 --set full --import-source yes -f -o "$rep" \
      "$BUILD/e3fuse_conv_micro" --model "$e3f" --structure "$structure" \
      --warmup 0 --repeats 1 >>"$LOG" 2>&1
    SUMMARY+=("$(printf '%-34s rc=%s' "ncu $model $pass" "$?")")
    ncu --import "$rep.ncu-rep" --page details >"$WORK/${model}_${pass}_details.txt" 2>&1
    ncu --import "$rep.ncu-rep" --page source --csv --print-source sass \
      >"$WORK/${model}_${pass}_sass.csv" 2>&1
    SUMMARY+=("$(printf '%-34s rc=%s' "  source sass" "$?")")
    ncu --import "$rep.ncu-rep" --page source --csv --print-source cuda \
      >"$WORK/${model}_${pass}_cuda.csv" 2>&1
    SUMMARY+=("$(printf '%-34s rc=%s' "  source cuda" "$?")")
    head -c 600 "$WORK/${model}_${pass}_sass.csv" | tee -a "$LOG"
    echo | tee -a "$LOG"
  done
done
ls -la "$WORK" | tee -a "$LOG"
(cd "$WORK" && tar -cJf "$OUTDIR/ncu_lines.tar.xz" ./*.txt ./*.csv)
# the first report whole, in case the CSV pages need another reading
first=$(find "$WORK" -name '*.ncu-rep' | sort | head -1)
[[ -n $first && $(stat -c %s "$first") -lt 15000000 ]] && cp "$first" "$OUTDIR/"
say "summary"
printf '%s\n' "${SUMMARY[@]}" | tee -a "$LOG"
