#!/usr/bin/env bash
# ncu of SevenNet-l3i5's layer-1 backward at 32,000 atoms: the engine's conv_backward_kernel and
# the frame kernel (EC 8, one pair ahead), with per-instruction stall samples, to settle what the
# frame tasks wait on (README, "What remains"). Only the microbenchmark is built; the model file
# and structures are carried as benchmarks/models (made here, as run_ahead.sh says):
#   OUT=... bash benchmarks/results/frame_backward/run_ncu.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:?OUT is required}
if [[ -d build/gpu ]]; then  # a warm machine's engine build: add the micro's target only
  build=build/gpu
  cmake -S . -B $build -DE3FUSE_MICROBENCH=ON >"$OUT/build.log" 2>&1
else
  build=build/gpu-frame
  cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DE3FUSE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DE3FUSE_MICROBENCH=ON -DPython_EXECUTABLE="$(command -v python3)" \
    -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" >"$OUT/build.log" 2>&1
fi
ninja -C $build e3fuse_frame_backward_micro >>"$OUT/build.log" 2>&1 || {
  tail -30 "$OUT/build.log"
  exit 2
}
echo "built at $SECONDS s"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
exe=$build/e3fuse_frame_backward_micro
args=(--model benchmarks/models/7net-l3i5.e3f --structure benchmarks/models/cu32000.bin --ec 8 --ahead 1)
timeout 60 $exe "${args[@]}" --warmup 1 --repeats 3 --json-out "$OUT/timing.json" >/dev/null
echo "timed at $SECONDS s"
# each kernel launches twice per layer (the check, then --repeats 1): SKIP=2 is layer 1 (0: layer
# 0). One report per kernel.
for kernel in conv_backward_kernel frame_backward_kernel; do
  timeout 200 ncu --kernel-name "regex:$kernel" --launch-skip "${SKIP:-2}" --launch-count 1 --set full \
    --import-source yes -f -o "$OUT/$kernel" "$exe" "${args[@]}" --warmup 0 --repeats 1 \
    >"$OUT/ncu_run_$kernel.log" 2>&1
  echo "ncu $kernel rc=$? at $SECONDS s"
  ncu --import "$OUT/$kernel.ncu-rep" --page details >"$OUT/${kernel}_details.txt" 2>&1
  ncu --import "$OUT/$kernel.ncu-rep" --page source --csv --print-source sass \
    >"$OUT/${kernel}_sass.csv" 2>&1
  python3 benchmarks/results/ncu_lines_h200/blocks.py "$OUT/${kernel}_sass.csv" --top 25 \
    >"$OUT/${kernel}_blocks.txt" 2>&1
done
grep -E "Duration|Executed Ipc A|Issue Slots Busy|Achieved Occupancy|Registers Per|No Eligible|Stall|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth" \
  "$OUT"/*_details.txt | head -80
cd "$OUT" && tar -cJf ncu.tar.xz ./*.ncu-rep ./*_sass.csv ./ncu_run_*.log && rm -f ./*.ncu-rep ./*_sass.csv ./ncu_run_*.log
ls -la "$OUT"
echo "elapsed $SECONDS s"
