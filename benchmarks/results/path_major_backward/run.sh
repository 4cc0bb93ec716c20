# Probe of the path-major backward (path_major.patch applied to the working tree): one build,
# conv_micro for SevenNet-l3i5 with E3FUSE_PATH_MAJOR unset (the engine's kernel), 4 and 8.
set -uo pipefail
mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
REPO=$PWD; LOG=$OUT/run.log; STAGE=/tmp/e3fuse-stage; PY=python3; SUMMARY=()
source scripts/gpu_common.sh
gpu_setup_carry
gpu_build build/gpu-ab "$OUT/build.log" -DE3FUSE_MICROBENCH=ON -- _core e3fuse_conv_micro
for mode in base 4 8; do
  if [[ $mode == base ]]; then unset E3FUSE_PATH_MAJOR; else export E3FUSE_PATH_MAJOR=$mode; fi
  timeout 120 python3 benchmarks/micro/conv_micro.py --exe build/gpu-ab/e3fuse_conv_micro \
    --models 7net-l3i5 --engines e3fuse --sizes ${SIZES:-32000 864} --repeats 3 \
    --json "$OUT/pm_$mode.json" 2>&1 | grep -v "^# " | tee -a "$LOG"
done
