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

FP32 = ("ffma", "fadd", "fmul")
FP64 = ("dfma", "dadd", "dmul")
PERCENTS = {
    "SM %": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "FMA pipe %": "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "L1 %": "l1tex__throughput.avg.pct_of_peak_sustained_elapsed",
    "L2 %": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "DRAM %": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "occupancy %": "sm__warps_active.avg.pct_of_peak_sustained_active",
}


def op_count(row: dict[str, str], op: str) -> float:
    return number(row.get(f"sm__sass_thread_inst_executed_op_{op}_pred_on.sum", "0"))


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
    parser.add_argument("csv", type=Path)
    parser.add_argument("--calls", type=int, default=1, help="engine calls profiled (divides sums)")
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    rows = read_rows(args.csv)
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in rows:
        s = sums[short_name(r["Kernel Name"])]
        t = number(r["gpu__time_duration.sum"])
        s["launches"] += 1
        s["time"] += t
        s["fp32"] += 2 * op_count(r, "ffma") + op_count(r, "fadd") + op_count(r, "fmul")
        s["fp64"] += 2 * op_count(r, "dfma") + op_count(r, "dadd") + op_count(r, "dmul")
        s["dram"] += number(r.get("dram__bytes_read.sum", "0")) + number(
            r.get("dram__bytes_write.sum", "0")
        )
        s["l2"] += number(r.get("lts__t_bytes.sum", "0"))
        s["l1"] += number(r.get("l1tex__t_bytes.sum", "0"))
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
