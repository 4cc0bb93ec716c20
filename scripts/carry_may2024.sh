#!/usr/bin/env bash
# Packs sevenn's SevenNet-0 checkpoint of 22 May 2024 (unnormalized spherical harmonics; the
# reference carry of ../shared/gpu/prepare_carry.sh leaves it out) into .carry/may2024.tar,
# as ref/site/sevenn/pretrained_potentials/SevenNet_0__22May2024/, for the GPU tests of
# tests/test_models.py::test_sevennet0_may2024_unnormalized_sh. gpu_setup_carry
# (scripts/gpu_common.sh) unpacks it over the reference carry. Carry both:
#   bash scripts/carry_may2024.sh [PYTHON]      # default .venv/bin/python (sevenn 0.13.0)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
src=$("$PY" -c 'import pathlib, sevenn; print(pathlib.Path(sevenn.__file__).parent / "pretrained_potentials" / "SevenNet_0__22May2024")')
[[ -f $src/checkpoint_sevennet_0.pth ]] || { echo "no checkpoint in $src" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/ref/site/sevenn/pretrained_potentials" .carry
cp -r "$src" "$work/ref/site/sevenn/pretrained_potentials/"
"$PY" scripts/strip_checkpoint_training_state.py "$work"/ref/site/sevenn/pretrained_potentials/*/*.pth
tar -cf .carry/may2024.tar -C "$work" ref
ls -l .carry/may2024.tar
