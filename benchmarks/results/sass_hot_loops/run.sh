#!/usr/bin/env bash
# The hot loops of the float32 convolution backward kernels, from their SASS, on a machine
# without a GPU (issue 21): compiles cuda/conv_backward_f32.cu for sm_90 with -lineinfo (as
# the build does, plus line info), disassembles it with nvdisasm (from NVIDIA's
# nvidia-cuda-nvdisasm wheel, fetched into $CACHE when not on PATH) and runs hot_loops.py on
# the kernels that the three reference models' heaviest layers launch. From the repository
# root:
#
#   bash benchmarks/results/sass_hot_loops/run.sh
#
# Writes <kernel>.txt beside this script and ptxas.txt (registers and spills of every kernel).
# Environment: NVCC (default nvcc), CACHE (default /tmp/e3fuse-sass), PYTHON (default
# .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/../../.."
HERE=benchmarks/results/sass_hot_loops
NVCC=${NVCC:-nvcc}
CACHE=${CACHE:-/tmp/e3fuse-sass}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$CACHE"

NVDISASM=$(command -v nvdisasm || true)
if [ -z "$NVDISASM" ]; then
  NVDISASM=$(find "$CACHE/wheel" -name nvdisasm -type f 2>/dev/null | head -1 || true)
fi
if [ -z "$NVDISASM" ]; then
  "$PY" -m pip download -q --no-deps -d "$CACHE" nvidia-cuda-nvdisasm
  "$PY" -m zipfile -e "$(ls "$CACHE"/nvidia_cuda_nvdisasm-*.whl | head -1)" "$CACHE/wheel"
  NVDISASM=$(find "$CACHE/wheel" -name nvdisasm -type f | head -1)
  chmod +x "$NVDISASM"
fi

"$NVCC" -std=c++17 -arch=sm_90 -cubin -O3 -lineinfo --expt-relaxed-constexpr -Xptxas -v \
  -DE3FUSE_WITH_CUDA=1 -I kernels/src -I kernels/include \
  -o "$CACHE/conv_backward_f32.cubin" kernels/src/cuda/conv_backward_f32.cu 2>"$HERE/ptxas.txt"
"$NVDISASM" -gi -c "$CACHE/conv_backward_f32.cubin" >"$CACHE/conv_backward_f32.sass"

# conv_backward_kernel<float, EC, TABLE, MINB, MAX_D1, MAX_D3, ...> (conv_kernels.cuh,
# conv_backward_launch) with the radial table, at the chunk each one launches with
# (max_edge_chunk, launch_largest_chunk): 16 edges, 4 for l = 3 inputs
#   7net-0 layers 1-3 (l <= 2 inputs):      MINB 3, MAX_D1 5
#   MACE-MP-0 medium layer 2 (l <= 1):      MINB 3, MAX_D1 3
#   7net-l3i5 layers 1-3 (l <= 3):          MINB 2, MAX_D1 7, 4 edges
for kernel in IfLi16ELb1ELi3ELi5ELi7ELb0ELb0ELb0E IfLi16ELb1ELi3ELi3ELi7ELb0ELb0ELb0E \
  IfLi4ELb1ELi2ELi7ELi7ELb0ELb0ELb0E; do
  "$PY" "$HERE/hot_loops.py" "$CACHE/conv_backward_f32.sass" \
    --kernel "conv_backward_kernel$kernel" >"$HERE/$kernel.txt"
  echo "$HERE/$kernel.txt"
done
