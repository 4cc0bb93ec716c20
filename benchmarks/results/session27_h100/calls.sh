#!/usr/bin/env bash
# Twenty-seventh session: the labelled model call and ASE MD step of every engine
# (scripts/gpu_suite.sh calls), SevenNet-l3i5, SevenNet-0 and MACE-MP-0 medium at 864 and
# 32,000 atoms beside sevenn / mace-torch with cuEquivariance, on the tree as it is.
# Carry .carry/reference.tar.xz:
#   OUT=... bash benchmarks/results/session27_h100/calls.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
DEADLINE_S=${DEADLINE_S:-100} BENCH_ARGS="--sizes 864 32000 --repeats 5 --warmup 2" \
  bash scripts/gpu_suite.sh calls:7net-l3i5 calls:7net-0 calls:mace
# results.tar.gz holds the tables, the JSON and the per-step logs: only it and suite.log come back
rm -rf "$OUT"/logs
ls "$OUT"
