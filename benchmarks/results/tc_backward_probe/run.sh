# Probe (issue 21), prepared in the seventeenth session, not yet run: tc_backward_micro on the
# device, every (d1, d3) of {1, 3, 5, 7}^2, its three versions timed and checked; then ncu on
# the (7, 7) launches. One device call, no carry, about 2 minutes:
#   OUT=... bash benchmarks/results/tc_backward_probe/run.sh
set -uo pipefail
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee "$OUT/machine.txt"
nvcc -std=c++17 -arch=sm_90 -O3 --expt-relaxed-constexpr -Xptxas -v -DE3FUSE_WITH_CUDA=1 \
  -I kernels/src -I kernels/include -I benchmarks/micro benchmarks/micro/tc_backward_micro.cu \
  -o /tmp/tc_backward_micro >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
/tmp/tc_backward_micro --json-out "$OUT/tc_backward.json" 2>&1 | tee "$OUT/tc_backward.log"
timeout 240 ncu --kernel-name regex:backward_kernel --launch-skip 3 --launch-count 1 \
  --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
  --section InstructionStats --section Occupancy \
  /tmp/tc_backward_micro --d1 7 --d3 7 --warmup 3 --repeats 1 >"$OUT/ncu_fma_77.txt" 2>&1
timeout 240 ncu --kernel-name regex:tc_backward_kernel --launch-skip 3 --launch-count 1 \
  --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
  --section InstructionStats --section Occupancy \
  /tmp/tc_backward_micro --d1 7 --d3 7 --warmup 3 --repeats 1 >"$OUT/ncu_tc_77.txt" 2>&1
echo "elapsed $SECONDS s"
