#!/usr/bin/env bash
# Per-kernel work and hardware fractions on a GPU machine, after `scripts/gpu_suite.sh` has
# built and staged e3fuse (PYTHONPATH=/tmp/e3fuse-stage): for each model in MODELS
# (benchmarks/models/NAME.e3f) and each size in SIZES, ncu collects, for every kernel of
# `e3fuse bench scaling --steps 1` (a warm-up call and one timed call, float32), its duration,
# executed FP32 / FP64 operations, DRAM / L2 / L1 bytes and throughput as a percentage of the
# hardware's peak; benchmarks/roofline.py sums them per kernel and per call into
# $OUT/roofline_<model>_<size>.md. ncu runs the kernels at its locked base clocks, so the
# durations are longer than in a timed run; the percentages are of the peak at those clocks.
# NCU_ARGS adds ncu options (e.g. --kernel-name regex:conv_forward), TAG names the files
# (roofline_<model>_<size><TAG>.md).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu_suite}
MODELS=${MODELS:-"7net-0 mace-mp0-medium-cu"}
SIZES=${SIZES:-"864 32000"}
NCU_ARGS=${NCU_ARGS:-}
TAG=${TAG:-}
mkdir -p "$OUT"
METRICS=$(python3 benchmarks/roofline.py --metrics)
for model in $MODELS; do
  for size in $SIZES; do
    name=roofline_${model}_${size}${TAG}
    csv=$OUT/$name.csv
    # shellcheck disable=SC2086
    timeout 240 ncu --csv --page raw --print-units base --metrics "$METRICS" $NCU_ARGS \
      python3 -m e3fuse.cli bench scaling --model "benchmarks/models/$model.e3f" --device cuda \
      --sizes "$size" --steps 1 >"$csv" 2>"$OUT/$name.err"
    python3 benchmarks/roofline.py "$csv" --calls 2 --title "$model, $size atoms$TAG" \
      >"$OUT/$name.md" 2>&1
  done
done
