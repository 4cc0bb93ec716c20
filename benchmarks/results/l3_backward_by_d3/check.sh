# A quick GPU check of by_d3.patch (nineteenth session, the last 280 s of device time): build
# with the patch, then SevenNet-l3i5 in float32 on CUDA against the float64 references, and the
# calculator's determinism cases. Carry .carry/reference-tests.tar.xz:
#   OUT=... bash benchmarks/results/l3_backward_by_d3/check.sh
set -uo pipefail
mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
git apply benchmarks/results/l3_backward_by_d3/by_d3.patch || exit 1
REPO=$PWD; LOG=$OUT/suite.log; STAGE=/tmp/e3fuse-stage; PY=python3; SUMMARY=()
source scripts/gpu_common.sh
gpu_setup_carry
gpu_build build/gpu $OUT/build.log
echo "built at $SECONDS s"
timeout 100 python3 -m pytest -q -p no:cacheprovider -p no:warnings -rfE --timeout 60 \
  -k "cuda and (l3i5 or determin)" tests/test_models.py tests/test_calculator.py \
  > $OUT/check.log 2>&1
tail -15 $OUT/check.log
echo elapsed $SECONDS
