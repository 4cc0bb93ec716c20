#!/usr/bin/env bash
# The radial-weights microbenchmark (benchmarks/micro/radial_micro.cu, issue 21) in one device
# call: the cubic table against the radial MLP on the tensor cores over tiles of a receiver's
# edges, per convolution layer.
#
#   OUT=/path bash scripts/gpu_radial.sh
#
# Builds _core and e3fuse_radial_micro (build/gpu-ab, -DE3FUSE_MICROBENCH=ON), then runs
# benchmarks/micro/radial_micro.py with RADIAL_ARGS (its options; default: 7net-l3i5, 7net-0
# and mp0-medium at 32,000 and 864 atoms, four configurations) -> $OUT/radial_summary.md, the
# JSON of every run and radial.log. Needs .carry/reference.tar.xz (sevenn and mace-torch make
# the model files; the tests' carry, moved to that name, is enough).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUTDIR=${OUT:-$REPO/benchmarks/results/gpu_radial}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
LOG=$OUTDIR/radial.log
: >"$LOG"
STAGE=/tmp/e3fuse-stage
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
SUMMARY=()
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh

gpu_setup_carry
gpu_machine_info
gpu_build build/gpu-ab "$OUTDIR/build.log" -DE3FUSE_MICROBENCH=ON -- _core e3fuse_radial_micro
say "radial weights: table against the tensor-core MLP"
# shellcheck disable=SC2086
$PY benchmarks/micro/radial_micro.py --exe build/gpu-ab/e3fuse_radial_micro --out "$OUTDIR" \
  ${RADIAL_ARGS:-} 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
SUMMARY+=("$(printf '%-28s rc=%-3s' radial_micro "$rc")")
printf '%s\n' "${SUMMARY[@]}" | tee -a "$LOG"
exit "$rc"
