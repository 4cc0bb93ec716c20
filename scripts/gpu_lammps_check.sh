#!/usr/bin/env bash
# One device call (../.library/device): the LAMMPS path against the engine on one GPU, the LAMMPS
# device tests, and ncu of the MACE convolutions at 32,000 atoms. Carry: .carry/lammps.tar.xz,
# .carry/ase.tar.xz (ase alone, unpacked into .carry/ref/site), .carry/models (7net-0.e3f,
# mace-mp0-medium-cu.e3f: the MACE-MP-0 medium architecture with Cu only). Results in $OUT.
set -u
OUT=${OUT:-benchmarks/results/gpu_suite}
export OUT; mkdir -p "$OUT"; mkdir -p benchmarks/models; tar -xJf .carry/ase.tar.xz -C .carry; cp .carry/models/*.e3f benchmarks/models/
LAMMPS_MODELS="7net-0 mace-mp0-medium-cu" timeout 300 bash scripts/gpu_suite.sh lammps >/dev/null 2>&1; cp $OUT/suite.log $OUT/lammps.log
export PYTHONPATH=/tmp/e3fuse-stage:$PWD/.carry/lmp/site:$PWD/.carry/ref/site:$PWD/benchmarks LD_LIBRARY_PATH=$PWD/.carry/lmp/site/lib:$PWD/.carry/lmp/site/lammps.libs PATH=$PWD/.carry/lmp/bin:$PATH E3FUSE_LAMMPS_PLUGIN=/tmp/e3fuse-stage/e3fuse/lammps_plugins/e3fusepairplugin.so E3FUSE_TEST_MODELS=$PWD/.carry/models
timeout 150 python3 -m pytest -q -rs -k "cuda or sorting or close or python_engine" -p no:cacheprovider tests/test_lammps.py > $OUT/lammps_tests.txt 2>&1
timeout 100 ncu --kernel-name regex:"conv_(forward|backward)_kernel" --launch-skip 4 --launch-count 4 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats python3 -m e3fuse.cli bench scaling --model benchmarks/models/mace-mp0-medium-cu.e3f --device cuda --sizes 32000 --steps 1 > $OUT/ncu_mace32k.txt 2>&1
rm -rf $OUT/logs $OUT/results.tar.gz
