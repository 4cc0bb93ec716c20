set -uo pipefail
mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
REPO=$PWD; LOG=$OUT/suite.log; STAGE=/tmp/e3fuse-stage; PY=python3; SUMMARY=()
source scripts/gpu_common.sh
gpu_setup_carry; gpu_machine_info
gpu_build build/gpu $OUT/build.log
timeout 400 python3 -m pytest -q -m "not slow" -p no:cacheprovider -p no:warnings -rfE --timeout 150 -k "cuda or gpu" tests/test_ops.py tests/test_models.py tests/test_mace.py tests/test_calculator.py tests/test_mace_foundation_combos.py tests/test_mace_radial.py tests/test_mace_zbl.py tests/test_mace_nonlinear.py tests/test_graph_reuse.py tests/test_regions.py tests/test_lammps.py tests/test_radial_table.py > $OUT/gpu_tests_full.log 2>&1
tail -15 $OUT/gpu_tests_full.log
echo elapsed $SECONDS
