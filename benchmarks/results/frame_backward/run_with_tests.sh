#!/usr/bin/env bash
# One device call: the whole GPU test suite (the command of ../gpu_tests_9c375e9_h100/run.sh),
# then the microbenchmark built in the same folder and the frame kernel with and without loading one
# (edge, path) pair ahead (--ahead) beside the engine. Carries .carry/reference-tests.tar.xz,
# .carry/lammps.tar.xz and .carry/may2024.tar:
#   OUT=... bash benchmarks/results/frame_backward/run_with_tests.sh
# Environment: TESTS (test files, default the whole suite), TEST_S (their time limit, 400 s: the whole suite took about 345 s on an H100 in the twenty-fourth session),
# BUILD_TARGETS (ninja targets, default all), FRAME=0 (the tests only).
set -uo pipefail
cd "$(dirname "$0")/../../.."
REPO=$PWD
OUT=${OUT:?OUT is required}
LOG=$OUT/suite.log
STAGE=/tmp/e3fuse-stage
PY=python3
SUMMARY=()
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
gpu_setup_carry
gpu_machine_info
# shellcheck disable=SC2086
gpu_build build/gpu "$OUT/build.log" ${BUILD_TARGETS:+-- $BUILD_TARGETS}
say "build done at $SECONDS s"
# TESTS: the test files (default the whole GPU suite)
TESTS=${TESTS:-"tests/test_ops.py tests/test_models.py tests/test_mace.py tests/test_calculator.py
  tests/test_mace_foundation_combos.py tests/test_mace_radial.py tests/test_mace_zbl.py
  tests/test_mace_nonlinear.py tests/test_graph_reuse.py tests/test_regions.py tests/test_lammps.py
  tests/test_radial_table.py"}
# shellcheck disable=SC2086
timeout "${TEST_S:-400}" python3 -m pytest -q -m "not slow" -p no:cacheprovider -p no:warnings -rfE \
  --timeout 150 -k "cuda or gpu" $TESTS >"$OUT/gpu_tests_full.log" 2>&1
tail -15 "$OUT/gpu_tests_full.log"
say "tests done at $SECONDS s"
if [[ ${FRAME:-1} == 0 ]]; then
  say "elapsed $SECONDS s (FRAME=0: no frame runs)"
  exit 0
fi
# the microbenchmark after the tests: the option adds targets only, the library is not rebuilt
cmake -S . -B build/gpu -DE3FUSE_MICROBENCH=ON >>"$OUT/build.log" 2>&1 &&
  ninja -C build/gpu e3fuse_frame_backward_micro >>"$OUT/build.log" 2>&1 || die "micro build failed"
say "micro built at $SECONDS s"
exe=build/gpu/e3fuse_frame_backward_micro
mkdir -p "$OUT/frame"
$PY -c 'import sys; from pathlib import Path; sys.path.insert(0, "benchmarks/micro"); import conv_micro; [print(n, *conv_micro.model_files(n, Path("benchmarks/models")), flush=True) for n in sys.argv[1:]]' 7net-l3i5 7net-0 2>&1 | tail -2
for atoms in 32000 864; do
  $PY -c 'import sys; from pathlib import Path; sys.path.insert(0, "benchmarks/micro"); import conv_micro as m; m.write_structure(m.structure(int(sys.argv[1])), Path(sys.argv[2]))' "$atoms" "benchmarks/models/cu$atoms.bin"
done
for run in "7net-l3i5 32000 1" "7net-l3i5 32000 0" "7net-l3i5 864 1" "7net-0 32000 1"; do
  read -r model atoms ahead <<<"$run"
  json=$OUT/frame/frame_${model}_${atoms}_ec8_ahead$ahead.json
  timeout 60 "$exe" --model "benchmarks/models/$model.e3f" --structure "benchmarks/models/cu$atoms.bin" \
    --ec 8 --ahead "$ahead" --warmup 2 --repeats 5 --json-out "$json" >/dev/null 2>>"$LOG"
  $PY benchmarks/results/frame_backward/summary.py "$json" 2>&1 | tee -a "$LOG"
done
tar -czf "$OUT/frame.tar.gz" -C "$OUT" frame && rm -rf "$OUT/frame"
say "elapsed $SECONDS s"
