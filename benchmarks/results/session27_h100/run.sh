#!/usr/bin/env bash
# The pinned upload (../pinned_upload/pinned_upload.patch, switch E3FUSE_PINNED_UPLOAD) and
# linear_pair_cleanup.patch (run_linear_pair hands its 1 or 2 products to launch_products in
# one call), applied here, measured and tested; two parts, each its own device call on one
# warm machine (the device re-sends the tree each call, so both apply the patches again; the
# second finds the first's build):
# PART=ab (default, about 5.5 minutes on a fresh machine):
# 1. SevenNet-0 and SevenNet-l3i5 at 864 atoms with and without it, in separate processes:
#    bitwise equal (gpu_switch_bitwise);
# 2. the model call's timeline at 864 atoms without / with, twice each, interleaved, and
#    whether pinned is faster for all three models (mean of both rounds);
# PART=tests (about 4.5 minutes): the GPU test suite (gpu_cuda_tests) with the switch at its
# default (on).
# Carries .carry/reference-tests.tar.xz, .carry/lammps.tar.xz and .carry/may2024.tar:
#   OUT=... [PART=tests] bash benchmarks/results/session27_h100/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
REPO=$PWD; LOG=$OUT/run.log; STAGE=/tmp/e3fuse-stage; PY=python3; SUMMARY=()
export PYTHONUNBUFFERED=1
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
gpu_apply_patches benchmarks/results/pinned_upload/pinned_upload.patch \
  benchmarks/results/session27_h100/linear_pair_cleanup.patch
gpu_start
if [[ ${PART:-ab} == tests ]]; then
  gpu_cuda_tests "$OUT/gpu_tests_full.log" "${TEST_S:-400}" | tee -a "$LOG"
  say "elapsed $SECONDS s"
  exit 0
fi
gpu_timeline_models
gpu_switch_bitwise E3FUSE_PINNED_UPLOAD
say "models and bitwise check done at $SECONDS s"
mkdir -p "$OUT/timelines"
for run in p0a p1a p0b p1b; do
  E3FUSE_PINNED_UPLOAD=${run:1:1} gpu_timeline "$OUT/timelines/$run" 864 "${TL_S:-50}" |
    sed "s/^/$run /" | tee -a "$LOG"
done
$PY - "$OUT/timelines" <<'PY' | tee -a "$LOG"
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
walls = {}
for run in ("p0a", "p1a", "p0b", "p1b"):
    for row in json.loads((d / f"{run}.json").read_text())["rows"]:
        walls.setdefault(row["model"], {}).setdefault(run[1], []).append(row["wall_ms_median"])
wins = []
for model, w in walls.items():
    off, on = sum(w["0"]) / len(w["0"]), sum(w["1"]) / len(w["1"])
    wins.append(on < off)
    print(f"{model}: without {off:.3f} ms, with {on:.3f} ms ({on / off:.3f})")
print("pinned faster for all three:", len(wins) == 3 and all(wins))
PY
tar -czf "$OUT/timelines.tar.gz" -C "$OUT" timelines && rm -rf "$OUT/timelines"
say "elapsed $SECONDS s"
