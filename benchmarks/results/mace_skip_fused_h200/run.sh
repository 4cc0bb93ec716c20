# Issue 21: MACE's first interaction with skip(linear(y)) as one element-dependent linear
# (fe51627). One device call, carry .carry/reference-tests.tar.xz: build, the MACE CUDA tests,
# then the model call's kernel timeline (benchmarks/diag/call_timeline.py) of MACE-MP-0 and
# MACE-OMAT-0 medium (random weights) at 864 and 32,000 atoms, to set beside
# ../call_timeline_h200/ (the same script on the base, a8f40bc, device call 2):
#   OUT=$OUT bash benchmarks/results/mace_skip_fused_h200/run.sh
set -uo pipefail
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
REPO=$PWD; STAGE=/tmp/e3fuse-stage; PY=python3; LOG=$OUT/run.log; SUMMARY=()
export PYTHONUNBUFFERED=1
source scripts/gpu_common.sh
gpu_setup_carry
gpu_machine_info
gpu_build build/gpu "$OUT/build.log" -- _core
echo "built at $SECONDS s"
timeout ${TEST_S:-170} $PY -m pytest -q -m "not slow" -p no:cacheprovider -p no:warnings -rfE \
  --timeout 150 -k "cuda or gpu" tests/test_mace.py tests/test_mace_foundation_combos.py \
  tests/test_mace_zbl.py tests/test_mace_radial.py tests/test_mace_nonlinear.py \
  tests/test_mace_options.py tests/test_mace_omol_mh.py >"$OUT/gpu_tests_mace.log" 2>&1
tail -4 "$OUT/gpu_tests_mace.log"
echo "tests done at $SECONDS s"
mkdir -p benchmarks/models
for arch in mp0-medium omat0-medium; do
  f=benchmarks/models/mace-$arch-random.e3f
  [[ -f $f ]] || (cd benchmarks && $PY -c 'import sys; from pathlib import Path; import mace_models; mace_models.model_files(sys.argv[1], Path("models"))' "$arch") >>"$LOG" 2>&1
done
timeout ${TL_S:-100} $PY benchmarks/diag/call_timeline.py \
  --model mace-mp0-medium=benchmarks/models/mace-mp0-medium-random.e3f \
  --model mace-omat0-medium=benchmarks/models/mace-omat0-medium-random.e3f \
  --sizes 864 32000 --json "$OUT/call_timeline.json" 2>&1 | tee "$OUT/call_timeline.txt" | grep "atoms: wall"
echo "elapsed $SECONDS s"
