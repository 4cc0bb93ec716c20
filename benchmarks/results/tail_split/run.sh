# Twenty-second session, device call 1, as it ran (prepared in the twenty-first): two blocks per
# row for the rows of the last, partial wave of blocks only (tail_split.patch, README.md), one
# device call, carries .carry/reference-tests.tar.xz and .carry/may2024.tar, about 8 minutes:
#   OUT=... bash benchmarks/results/tail_split/run.sh
# scripts/gpu_ab_tests.sh: the conv microbenchmark of all layers, three models, 864, 2,048 and
# 32,000 atoms, base (the tree) against new (the tree + tail_split.patch), two rounds; then
# with the new build the CUDA model and calculator tests, whose small systems split every row
# (less than half a wave of blocks).
# If it wins: the whole GPU test suite (the LAMMPS tests run the ConvRows path, `listed`)
# before it lands.
set -uo pipefail
BASE=HEAD ROUNDS=${ROUNDS:-2} REPEATS=5 MICRO_SIZES="864 2048 32000" \
  PATCH=benchmarks/results/tail_split/tail_split.patch bash scripts/gpu_ab_tests.sh
