#!/usr/bin/env bash
# The linear layers under each E3FUSE_LINEAR_POLICY (measurement switch in
# kernels/src/cuda/linear.cu, run_linear_tables: 0 the engine's rule; 1 small tiles split per
# component below 8 large-tile blocks per SM; 2 large tiles split per component there; 3 small
# below 2, large split below 8), on one build: the switch picks tiles and grids, never the
# kernel's code, so policy 0 is the base. Needs a configured microbenchmark build (BUILD,
# default build/gpu-ab, as scripts/gpu_ab.sh leaves it) and the model files in
# benchmarks/models:
#   OUT=... bash benchmarks/results/linear_policy/run_policies.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
HERE=benchmarks/results/linear_policy
BUILD=${BUILD:-build/gpu-ab}
ninja -C "$BUILD" e3fuse_linear_micro >"$OUT"/linear_build.log 2>&1 || {
  tail -20 "$OUT"/linear_build.log
  exit 1
}
for policy in 0 1 2 3; do
  json=$OUT/policy_$policy.json
  E3FUSE_LINEAR_POLICY=$policy python3 benchmarks/micro/linear_micro.py --exe "$BUILD"/e3fuse_linear_micro \
    --models ${MICRO_MODELS:-7net-0 7net-l3i5} --sizes ${MICRO_SIZES:-864 32000} \
    --repeats "${REPEATS:-10}" --json "$json" >"$OUT"/policy_$policy.log 2>&1 || echo "policy $policy: exit $?"
done
python3 $HERE/summary.py "$OUT" | tee "$OUT"/linear_policy.md
