#!/usr/bin/env bash
# The main job on the embedded default model: convert SevenNet-0 (shipped inside the
# sevenn wheel) to models/7net-0.e3f, verifying it against sevenn, then run a short
# NVE MD of a copper supercell with ASE and print the energy drift and time per step.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p models
if [ ! -f models/7net-0.e3f ]; then
  .venv/bin/e3fuse convert sevennet 7net-0 -o models/7net-0.e3f
fi
.venv/bin/e3fuse info models/7net-0.e3f
.venv/bin/python examples/ase/md_copper.py --model models/7net-0.e3f "$@"
