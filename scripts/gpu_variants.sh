#!/usr/bin/env bash
# Timing variants of the CUDA kernels on a GPU machine, after `scripts/gpu_suite.sh` has
# built and staged e3fuse (PYTHONPATH=/tmp/e3fuse-stage): for each environment setting in
# VARIANTS (required; ";"-separated VAR=value settings, e.g. "E3FUSE_X=1;E3FUSE_X=0"), each model
# in MODELS and each size in SIZES, `e3fuse bench scaling` (float32) prints ms per step.
# Same build, same machine, one after another: the rows compare.
set -uo pipefail
cd "$(dirname "$0")/.."
[[ -n ${VARIANTS:-} ]] || {
  echo "VARIANTS (the settings to compare) is required" >&2
  exit 2
}
MODELS=${MODELS:-"benchmarks/models/7net-0.e3f"}
SIZES=${SIZES:-"864 32000"}
STEPS=${STEPS:-10}
IFS=';' read -r -a settings <<<"$VARIANTS"
for model in $MODELS; do
  for setting in "${settings[@]}"; do
    echo "== $model, $setting"
    # shellcheck disable=SC2086
    env $setting python3 -m e3fuse.cli bench scaling --model "$model" --device cuda \
      --sizes $SIZES --steps "$STEPS" 2>&1 | grep -E "^\s+[0-9,]+\s" || echo "(failed)"
  done
done
