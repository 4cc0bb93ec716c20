# Probe (issue 21, eighteenth session): tile_backward_micro on the device (SevenNet-l3i5 layer 1's
# input blocks: fma tasks against channel x column tiles on the tensor cores, the tiles also with
# registers for 3 blocks per SM; chunks of 8 and 4 edges), then ncu on the fma and tile kernels
# of the d1 = 7 block. One device call, no carry, about a minute:
#   OUT=... bash benchmarks/results/tile_backward_probe/run.sh
# (The device tool returns at most 8 files: the logs are combined.)
set -uo pipefail
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv >"$OUT/build.log"
nvcc -std=c++17 -arch=sm_90 -O3 --expt-relaxed-constexpr -Xptxas -v -DE3FUSE_WITH_CUDA=1 \
  -I kernels/src -I kernels/include -I benchmarks/micro benchmarks/micro/tile_backward_micro.cu \
  -o /tmp/tile_backward_micro >>"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
for chunk in 8 4; do
  /tmp/tile_backward_micro --chunk $chunk --json-out "$OUT/tile_chunk$chunk.json" 2>>"$OUT/tile.log" \
    >/dev/null
done
cat "$OUT/tile.log"
# launches of --d1 7 --warmup 1 --repeats 1: fma 0, 1; tile 2, 3; tile_3blocks 4, 5
for v in "fma 1" "tile 3"; do
  set -- $v
  timeout 150 ncu --kernel-name regex:backward_kernel --launch-skip $2 --launch-count 1 \
    --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
    --section InstructionStats --section Occupancy --section ComputeWorkloadAnalysis \
    --metrics smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active \
    /tmp/tile_backward_micro --d1 7 --warmup 1 --repeats 1 >"$OUT/ncu_${1}_d1_7.txt" 2>&1
done
echo "elapsed $SECONDS s"
