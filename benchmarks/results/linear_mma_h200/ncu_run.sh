#!/usr/bin/env bash
# ncu (full set, source-level) of linear_mma_kernel through the linear microbenchmark, on the
# device from the repository root: OUT=/path bash benchmarks/results/linear_mma_h200/ncu_run.sh
# Two launches at 32,000 atoms: SevenNet-0's layer-1 linear_2 forward (K = 3,136 over ir_mul
# sources) and MACE-MP-0 medium's layer-1 linear transpose (K = 128 per mul_ir source, d up to 7).
set -uo pipefail
REPO=$PWD; LOG=$OUT/run.log; STAGE=/tmp/e3fuse-stage; PY=python3; SUMMARY=()
source scripts/gpu_common.sh
gpu_setup_carry
gpu_build build/gpu "$OUT/build.log" -DE3FUSE_MICROBENCH=ON -- _core e3fuse_linear_micro
$PY -c 'import sys; from pathlib import Path; sys.path.insert(0, "benchmarks/micro"); import conv_micro; [print(n, *conv_micro.model_files(n, Path("benchmarks/models")), flush=True) for n in sys.argv[1:]]' 7net-0 mp0-medium 2>&1 | tee -a "$LOG"
profile() { # name model launch-skip
  timeout 200 ncu --kernel-name regex:linear_mma --launch-skip "$3" --launch-count 1 --set full \
    --import-source yes -f -o "/tmp/$1" build/gpu/e3fuse_linear_micro --model "$2" --atoms 32000 \
    --warmup 0 --repeats 1 >>"$LOG" 2>&1
  echo "ncu $1 rc $?" | tee -a "$LOG"
  ncu --import "/tmp/$1.ncu-rep" --page details >"$OUT/$1_details.txt" 2>&1
  ncu --import "/tmp/$1.ncu-rep" --page source --csv --print-source sass >"$OUT/$1_sass.csv" 2>&1
  xz -9 "$OUT/$1_sass.csv"
}
profile 7net-0_linear_2_fwd benchmarks/models/7net-0.e3f 10
profile mace_linear_bwd benchmarks/models/mace-mp0-medium-random.e3f 15
