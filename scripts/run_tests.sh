#!/usr/bin/env bash
# Installs e3fuse and the reference packages, then runs the test suite
# (large reference comparisons are marked slow and excluded; pass -m "" to run all).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest -q -m "not slow" tests "$@"
