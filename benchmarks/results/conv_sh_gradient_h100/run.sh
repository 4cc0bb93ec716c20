#!/usr/bin/env bash
# Device call (issue 21): the working tree against itself with REVERSE (a patch) undone, conv
# microbenchmark rounds alternated; the patch is the change under test, so "before" is the tree
# without it and "after" the tree as it is. On the device, from the repository root, carrying
# .carry/reference.tar.xz:
#   REVERSE=<patch> OUT=<folder> [ROUNDS=2] [TESTS=1] bash benchmarks/results/conv_sh_gradient_h100/run.sh
# Writes <before|after>_round<r>.json and run.log to OUT; with TESTS=1 also gpu_tests.log (the
# GPU tests of the convolution paths on the "after" build).
set -uo pipefail
cd "$(dirname "$0")/../../.."
REPO=$PWD
OUTDIR=${OUT:?}
mkdir -p "$OUTDIR"
LOG=$OUTDIR/run.log
: >"$LOG"
STAGE=/tmp/e3fuse-stage
PY=python3
export PYTHONUNBUFFERED=1
SUMMARY=()
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
gpu_setup_carry
gpu_machine_info
patch_file=$(cd "$(dirname "${REVERSE:?}")" && pwd)/$(basename "$REVERSE")
before=/tmp/e3fuse-before
if [[ ! -x $before/build/gpu/e3fuse_conv_micro ]]; then
  rm -rf "$before" && mkdir -p "$before"
  tar --exclude=./build --exclude=./.carry --exclude=./benchmarks/models --exclude=./.git \
    --exclude=./.venv -cf - . | tar -xf - -C "$before" || die "no copy of the tree"
  (cd "$before" && git apply -R "$patch_file") >>"$LOG" 2>&1 || die "$REVERSE does not undo"
  (cd "$before" && cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DE3FUSE_CUDA=ON \
    -DE3FUSE_MICROBENCH=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DPython_EXECUTABLE="$(command -v $PY)" \
    -Dpybind11_DIR="$($PY -m pybind11 --cmakedir)" && ninja -C build/gpu e3fuse_conv_micro) \
    >"$OUTDIR/build_before.log" 2>&1 &
  pid=$!
fi
gpu_build build/gpu-ab "$OUTDIR/build_after.log" -DE3FUSE_MICROBENCH=ON -- _core e3fuse_conv_micro
[[ -n ${pid:-} ]] && { wait "$pid" || die "the build without the patch failed"; }
models="7net-l3i5 7net-0 mp0-medium"
# shellcheck disable=SC2086
$PY -c 'import sys; from pathlib import Path; sys.path.insert(0, "benchmarks/micro"); import conv_micro; [print(n, *conv_micro.model_files(n, Path("benchmarks/models")), flush=True) for n in sys.argv[1:]]' $models >>"$LOG" 2>&1 || die "the model files could not be made"
for r in $(seq "${ROUNDS:-2}"); do
  for cfg in before after; do
    exe=$before/build/gpu/e3fuse_conv_micro
    [[ $cfg == after ]] && exe=build/gpu-ab/e3fuse_conv_micro
    say "round $r: $cfg"
    # shellcheck disable=SC2086
    $PY benchmarks/micro/conv_micro.py --exe "$exe" --engines e3fuse --models $models \
      --sizes 32000 864 --warmup 2 --repeats 3 --json "$OUTDIR/${cfg}_round$r.json" 2>&1 |
      grep "e3fuse:" | tee -a "$LOG"
  done
done
if [[ ${TESTS:-0} == 1 ]]; then
  $PY -m pytest -q -m "not slow" -p no:cacheprovider -p no:warnings -rfE --timeout 150 -x \
    -k "cuda or gpu" tests/test_models.py tests/test_mace.py tests/test_ops.py \
    tests/test_mace_nonlinear.py tests/test_calculator.py tests/test_radial_table.py \
    2>&1 | tee "$OUTDIR/gpu_tests.log" | tail -3
fi
echo "elapsed ${SECONDS}s" | tee -a "$LOG"
