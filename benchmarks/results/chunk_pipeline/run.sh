#!/usr/bin/env bash
# Chunk pipelining in the convolution kernels (chunk_pipeline.patch, README.md): one device
# call, the A/B of the conv microbenchmark (all three models, 864 and 32,000 atoms, two rounds)
# against the device's git HEAD, then the CUDA tests of test_models.py and test_calculator.py
# on the patched build. Carry .carry/reference-tests.tar.xz and .carry/may2024.tar:
#   OUT=... bash benchmarks/results/chunk_pipeline/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
BASE=${BASE:-HEAD} PATCH=benchmarks/results/chunk_pipeline/chunk_pipeline.patch ROUNDS=2 REPEATS=5 \
  MICRO_SIZES="864 32000" AB_S=${AB_S:-430} TEST_S=${TEST_S:-150} OUT=$OUT \
  bash scripts/gpu_ab_tests.sh
