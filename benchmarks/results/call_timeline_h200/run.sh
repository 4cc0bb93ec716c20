# Issue 21, small systems: where the wall time of e3fuse's model call goes on the GPU
# (benchmarks/diag/call_timeline.py under torch.profiler's CUDA trace). One device call,
# carry .carry/reference-tests.tar.xz:
#   OUT=... bash benchmarks/results/call_timeline_h200/run.sh
set -uo pipefail
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
REPO=$PWD; STAGE=/tmp/e3fuse-stage; PY=python3; LOG=$OUT/run.log; SUMMARY=()
export PYTHONUNBUFFERED=1
source scripts/gpu_common.sh
gpu_setup_carry
gpu_machine_info
gpu_build build/gpu "$OUT/build.log" -- _core
mkdir -p benchmarks/models
for m in 7net-0 7net-l3i5; do
  [[ -f benchmarks/models/$m.e3f ]] || $PY -m e3fuse.cli convert sevennet $m -o benchmarks/models/$m.e3f >>"$LOG" 2>&1
done
f=benchmarks/models/mace-mp0-medium-random.e3f
[[ -f $f ]] || (cd benchmarks && $PY -c 'from pathlib import Path; import mace_models; mace_models.model_files("mp0-medium", Path("models"))') >>"$LOG" 2>&1
ls -la benchmarks/models | tee -a "$LOG"
timeout ${TL_S:-300} $PY benchmarks/diag/call_timeline.py --model 7net-0=benchmarks/models/7net-0.e3f \
  --model mace-mp0-medium=$f --model 7net-l3i5=benchmarks/models/7net-l3i5.e3f \
  --sizes ${SIZES:-864 4000 32000} --json "$OUT/call_timeline.json" 2>&1 | tee "$OUT/call_timeline.txt"
echo "elapsed $SECONDS s"
