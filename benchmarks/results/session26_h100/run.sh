#!/usr/bin/env bash
# Twenty-sixth session: the whole GPU test suite with the step graph, the paired linear
# launches and linear policy 3 landed, then the model call's GPU timeline at 864 and 32,000
# atoms (the issue's targets). Carries .carry/reference-tests.tar.xz, .carry/lammps.tar.xz and
# .carry/may2024.tar:
#   OUT=... bash benchmarks/results/session26_h100/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
REPO=$PWD; LOG=$OUT/suite.log; STAGE=/tmp/e3fuse-stage; PY=python3; SUMMARY=()
export PYTHONUNBUFFERED=1
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
gpu_start
gpu_cuda_tests "$OUT/gpu_tests_full.log" "${TEST_S:-400}"
say "tests done at $SECONDS s"
gpu_timeline_models
gpu_timeline "$OUT/call_timeline" "${SIZES:-864 32000}" "${TL_S:-120}"
say "elapsed $SECONDS s"
