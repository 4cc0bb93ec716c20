#!/usr/bin/env bash
# Chunk pipelining in the convolution kernels (chunk_pipeline.patch, README.md): one device
# call, the A/B of the conv microbenchmark (864 and 32,000 atoms, two rounds) against the
# device's git HEAD, then the CUDA tests of test_models.py and test_calculator.py on the
# patched build. Carry .carry/reference-tests.tar.xz and .carry/may2024.tar:
#   OUT=... bash benchmarks/results/chunk_pipeline/run.sh
# About 9 minutes with the default models (the twenty-fourth session's SevenNet-l3i5-only A/B
# took 280 s: 149 s of builds, 25 s a round); MACE-MP-0 medium (MICRO_MODELS="mp0-medium",
# its model is built and converted on the machine) in a call of its own.
set -uo pipefail
cd "$(dirname "$0")/../../.."
BASE=${BASE:-HEAD} PATCH=benchmarks/results/chunk_pipeline/chunk_pipeline.patch ROUNDS=2 REPEATS=5 \
  MICRO_SIZES="864 32000" MICRO_MODELS=${MICRO_MODELS:-"7net-l3i5 7net-0"} AB_S=${AB_S:-400} \
  TEST_S=${TEST_S:-140} OUT=$OUT bash scripts/gpu_ab_tests.sh
