"""Sums ncu's per-kernel metrics (scripts/gpu_roofline.sh) per kernel and per call.

Reads `ncu --csv --page raw --print-units base` output and prints a markdown table: for each
kernel (template arguments kept, function arguments dropped) its launches, device time,
executed floating-point work, memory traffic, and ncu's throughput percentages, averaged over
its launches weighted by their durations.
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import sys
from collections import defaultdict
from pathlib import Path

# Executed floating-point instructions: (fused multiply-add, add, multiply); an FMA is 2 flops.
FP32 = ("ffma", "fadd", "fmul")
FP64 = ("dfma", "dadd", "dmul")
BYTES = {
    "dram": ("dram__bytes_read.sum", "dram__bytes_write.sum"),
    "l2": ("lts__t_bytes.sum",),
    "l1": ("l1tex__t_bytes.sum",),
}
PERCENTS = {
    "SM %": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "FMA pipe %": "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "L1 %": "l1tex__throughput.avg.pct_of_peak_sustained_elapsed",
    "L2 %": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "DRAM %": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "occupancy %": "sm__warps_active.avg.pct_of_peak_sustained_active",
}


def op_metric(op: str) -> str:
    return f"sm__sass_thread_inst_executed_op_{op}_pred_on.sum"


# What scripts/gpu_roofline.sh asks ncu for (`roofline.py --metrics` prints it).
METRICS = [
    "gpu__time_duration.sum",
    *(op_metric(op) for op in FP32 + FP64),
    *(m for group in BYTES.values() for m in group),
    *PERCENTS.values(),
]


def flops(row: dict[str, str], ops: tuple[str, str, str]) -> float:
    fma, add, mul = (number(row.get(op_metric(op), "0")) for op in ops)
    return 2 * fma + add + mul


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def short_name(name: str) -> str:
    """`void ns::(anonymous namespace)::k<float, 16>(args)` (or `<unnamed>`) -> `k<float, 16>`."""
    name = re.sub(r"^void\s+", "", name.strip())
    name = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # drop the argument list (the first '(' outside <>)
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    name = name[:cut]
    return re.sub(r"[A-Za-z_0-9]+::", "", name)


def read_rows(path: Path) -> list[dict[str, str]]:
    text = path.read_text(errors="replace")
    start = text.find('"ID"')
    if start < 0:
        head = "\n".join(text.splitlines()[:40])
        raise SystemExit(f"{path}: no ncu CSV table; it begins:\n{head}")
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    return [r for r in rows if r.get("Kernel Name") and number(r.get("gpu__time_duration.sum", ""))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("csv", type=Path, nargs="?")
    parser.add_argument("--metrics", action="store_true", help="print the ncu metric list")
    parser.add_argument("--calls", type=int, default=1, help="engine calls profiled (divides sums)")
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    if args.metrics:
        print(",".join(METRICS))
        return 0
    if args.csv is None:
        parser.error("the ncu CSV file is required")
    rows = read_rows(args.csv)
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in rows:
        s = sums[short_name(r["Kernel Name"])]
        t = number(r["gpu__time_duration.sum"])
        s["launches"] += 1
        s["time"] += t
        s["fp32"] += flops(r, FP32)
        s["fp64"] += flops(r, FP64)
        for key, metrics in BYTES.items():
            s[key] += sum(number(r.get(m, "0")) for m in metrics)
        for label, metric in PERCENTS.items():
            s[label] += t * number(r.get(metric, "0"))
    total = sum(s["time"] for s in sums.values())
    calls = max(args.calls, 1)
    print(f"## {args.title}\n" if args.title else "", end="")
    print(
        f"ncu, {len(rows)} kernel launches over {calls} call(s); per call: "
        f"{total / calls / 1e6:.3f} ms of kernel time at ncu's clocks. Work and traffic per "
        "call; percentages of the peak at those clocks, weighted by duration.\n"
    )
    head = [
        "kernel",
        "launches",
        "ms",
        "share",
        "GFLOP fp32",
        "GFLOP fp64",
        "TFLOP/s",
        "DRAM GB",
        "L2 GB",
        "L1 GB",
        *PERCENTS,
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name, s in sorted(sums.items(), key=lambda kv: -kv[1]["time"]):
        t = s["time"]
        cells = [
            f"`{name}`",
            f"{s['launches'] / calls:g}",
            f"{t / calls / 1e6:.3f}",
            f"{100 * t / total:.1f} %",
            f"{s['fp32'] / calls / 1e9:.2f}",
            f"{s['fp64'] / calls / 1e9:.3f}",
            f"{(s['fp32'] + s['fp64']) / t / 1e3:.2f}",
            f"{s['dram'] / calls / 1e9:.3f}",
            f"{s['l2'] / calls / 1e9:.2f}",
            f"{s['l1'] / calls / 1e9:.2f}",
            *(f"{s[label] / t:.0f}" for label in PERCENTS),
        ]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
