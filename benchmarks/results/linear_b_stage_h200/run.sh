# Issue 21: linear_mma_kernel with the B fragments staged in shared memory (cp.async) against
# the kernel before it (1495e5e0c9dd1c675e8ae47d52a2f2d599d71304), then the GPU test suite of
# the new build (test_lammps skips without the lammps carry). One device call,
# carry .carry/reference-tests.tar.xz:
#   OUT=$OUT bash benchmarks/results/linear_b_stage_h200/run.sh
set -uo pipefail
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
# BASE=HEAD: the device's git metadata is the session's first commit (a8f40bc here), whose
# kernels/ is 1495e5e's; the working tree is the new side.
MICRO=linear BASE=HEAD OUT=$OUT/ab ROUNDS=${ROUNDS:-2} REPEATS=${REPEATS:-5} \
  MICRO_MODELS="7net-0 7net-l3i5 mp0-medium" MICRO_SIZES="864 32000" timeout ${AB_S:-300} bash scripts/gpu_ab.sh
echo "A/B done at $SECONDS s"
# the staged module is the new tree's (gpu_ab.sh builds the new tree last)
REPO=$PWD; STAGE=/tmp/e3fuse-stage; PY=python3; LOG=$OUT/run.log; SUMMARY=()
source scripts/gpu_common.sh && gpu_adhoc_env
timeout ${TEST_S:-270} python3 -m pytest -q -m "not slow" -p no:cacheprovider -p no:warnings -rfE \
  --timeout 150 -k "cuda or gpu" tests/test_ops.py tests/test_models.py tests/test_mace.py \
  tests/test_calculator.py tests/test_mace_foundation_combos.py tests/test_mace_radial.py \
  tests/test_mace_zbl.py tests/test_mace_nonlinear.py tests/test_graph_reuse.py tests/test_regions.py \
  tests/test_lammps.py tests/test_radial_table.py >"$OUT/gpu_tests.log" 2>&1
tail -15 "$OUT/gpu_tests.log"
echo elapsed $SECONDS
