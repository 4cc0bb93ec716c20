# The CUDA backward with unnormalized spherical harmonics (SevenNet-0 of 22 May 2024, whose
# checkpoint the reference-tests carry leaves out): build _core, then that model's tests on
# CUDA in float64 and float32 against sevenn in float64. Carries .carry/reference-tests.tar.xz
# and .carry/may2024.tar (ref/site/sevenn/pretrained_potentials/SevenNet_0__22May2024 from the
# sevenn 0.13.0 wheel):
#   OUT=... bash benchmarks/results/edge_frame_backward/check_unnormalized.sh
set -uo pipefail
mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
REPO=$PWD; LOG=$OUT/suite.log; STAGE=/tmp/e3fuse-stage; PY=python3; SUMMARY=()
source scripts/gpu_common.sh
gpu_setup_carry
tar -xf .carry/may2024.tar -C .carry || exit 1
gpu_build build/gpu "$OUT"/build.log -- _core
echo "built at $SECONDS s"
timeout ${TEST_S:-90} python3 -m pytest -q -p no:cacheprovider -p no:warnings -rfE --timeout 80 \
  -k "unnormalized and cuda" tests/test_models.py >"$OUT"/check.log 2>&1
tail -12 "$OUT"/check.log
echo "elapsed $SECONDS s"
