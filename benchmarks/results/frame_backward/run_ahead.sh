#!/usr/bin/env bash
# The frame kernel with and without --ahead beside the engine, on SevenNet-l3i5, in the least
# device time: only the microbenchmark is built (with e3fuse_core), and the model file and
# structures come made on this machine, carried as benchmarks/models (ignored by git):
#   python -c '...conv_micro.model_files("7net-l3i5", Path("benchmarks/models"))...'  (here)
#   OUT=... bash benchmarks/results/frame_backward/run_ahead.sh                       (device)
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:?OUT is required}
build=build/gpu-frame
cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DE3FUSE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DE3FUSE_MICROBENCH=ON -DPython_EXECUTABLE="$(command -v python3)" \
  -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" >"$OUT/build.log" 2>&1 &&
  ninja -C $build e3fuse_frame_backward_micro >>"$OUT/build.log" 2>&1 || {
  tail -30 "$OUT/build.log"
  exit 2
}
echo "built at $SECONDS s"
nvidia-smi --query-gpu=name --format=csv,noheader
for run in "32000 1" "32000 0" "864 1" "864 0"; do
  read -r atoms ahead <<<"$run"
  json=$OUT/frame_7net-l3i5_${atoms}_ec8_ahead$ahead.json
  timeout 60 $build/e3fuse_frame_backward_micro --model benchmarks/models/7net-l3i5.e3f \
    --structure "benchmarks/models/cu$atoms.bin" --ec 8 --ahead "$ahead" --warmup 1 --repeats 3 \
    --json-out "$json" >/dev/null
  python3 benchmarks/results/frame_backward/summary.py "$json"
  echo "at $SECONDS s"
done
