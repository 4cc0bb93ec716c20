"""Stall samples and executed instructions of one kernel by source region (issue 21).

ncu's source page (`ncu --import R.ncu-rep --page source --csv --print-source sass`) gives each
SASS instruction's executed count and stall samples but, in CSV, no source line. This script
takes the line of every instruction from a local compile of the same translation unit (same
nvcc, flags and sources as the device build: the SASS must match instruction for instruction,
which it checks opcode by opcode) and sums the samples per region of conv_kernels.cuh
(take_chunk, chunk_geometry, contraction, task dispatch, tasks, edge forces, kernel body) and
per helper header.

    nvcc -std=c++17 -arch=sm_90 -O3 --expt-relaxed-constexpr -lineinfo -DE3FUSE_WITH_CUDA=1 \\
        -I kernels/src -I kernels/include -cubin -o /tmp/u.cubin \\
        kernels/src/cuda/conv_backward_f32.cu
    python benchmarks/diag/ncu_regions.py /tmp/u.cubin \\
        'conv_backward_kernelIfLi4ELb1ELi2ELi7ELi7ELb0ELb0ELb0E' conv_backward_kernel_sass.csv

nvdisasm comes with the CUDA toolkit or the nvidia-cuda-nvdisasm wheel (NVDISASM=path).
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from collections import defaultdict

# conv_kernels.cuh line ranges (as of this file's commit) -> region. An inlined helper's
# instructions carry the helper's lines, whoever calls it.
REGIONS = [
    (139, 197, "take_chunk, edge_vector"),
    (263, 405, "chunk_geometry"),
    (406, 415, "table_entry"),
    (507, 523, "load4_shared (inlined: tasks' {M, K} reads, contraction's Y reads)"),
    (524, 700, "{M, K} contraction"),
    (700, 806, "task dispatch"),
    (807, 1228, "tasks"),
    (1229, 1313, "edge forces"),
    (1433, 1700, "kernel body (barriers)"),
]
STALLS = ["stall_barrier", "stall_no_inst", "stall_short_sb", "stall_long_sb", "stall_wait"]


def sass_lines(cubin: str, kernel: str) -> list[tuple[str, tuple[str, int] | None]]:
    """(opcode, (file, line)) of each instruction of the kernel whose symbol contains `kernel`."""
    nvdisasm = os.environ.get("NVDISASM", "nvdisasm")
    text = subprocess.run(
        [nvdisasm, "-g", "-c", cubin], check=True, capture_output=True, text=True
    ).stdout.split("\n")
    start = next(i for i, s in enumerate(text) if ".section" in s and ".text." in s and kernel in s)
    out, src = [], None
    for s in text[start + 1 :]:
        if re.match(r"\s*\.section", s):
            break
        m = re.search(r'//## File "([^"]+)", line (\d+)', s)
        if m:
            src = (m.group(1).rsplit("/", 1)[-1], int(m.group(2)))
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,6}\*/\s+(.*?);", s)
        if m:
            out.append((opcode(m.group(1)), src))
    return out


def opcode(instruction: str) -> str:
    parts = instruction.split()
    return parts[1] if parts[0].startswith("@") else parts[0]


def region(src: tuple[str, int] | None) -> str:
    if src is None:
        return "?"
    name, line = src
    if name != "conv_kernels.cuh":
        return name
    return next((r for a, b, r in REGIONS if a <= line <= b), f"conv_kernels.cuh:{line}")


def main() -> None:
    cubin, kernel, sass_csv = sys.argv[1:4]
    code = sass_lines(cubin, kernel)
    rows = list(csv.reader(open(sass_csv)))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    names = rows[head]
    data = [r for r in rows[head + 1 :] if len(r) == len(names)]
    col = {n: i for i, n in enumerate(names)}
    if len(code) != len(data) or any(
        a != opcode(r[col["Source"]]) for (a, _), r in zip(code, data)
    ):
        sys.exit("the local SASS does not match the profiled kernel's")

    def num(r: list[str], name: str) -> float:
        return float(r[col[name]] or 0)

    samples = sum(num(r, "Warp Stall Sampling (All Samples)") for r in data)
    executed = sum(num(r, "Instructions Executed") for r in data)
    agg: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for (_, src), r in zip(code, data):
        a = agg[region(src)]
        a["samples"] += num(r, "Warp Stall Sampling (All Samples)")
        a["executed"] += num(r, "Instructions Executed")
        for s in STALLS:
            a[s] += num(r, s)
    print(f"{len(data)} instructions, {executed:.4g} executed, {samples:.4g} stall samples")
    print("| region | samples % | executed % | " + " | ".join(s[6:] for s in STALLS) + " |")
    print("|---|" + "---:|" * (2 + len(STALLS)))
    for name, a in sorted(agg.items(), key=lambda kv: -kv[1]["samples"]):
        if a["samples"] < 1e-3 * samples:
            continue
        cells = [100 * a["samples"] / samples, 100 * a["executed"] / executed]
        cells += [100 * a[s] / samples for s in STALLS]
        print(f"| {name} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
