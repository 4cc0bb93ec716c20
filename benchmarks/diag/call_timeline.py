"""Where the wall time of e3fuse's model call goes on the GPU (issue 21, small systems).

The issue's 864-atom targets (SevenNet-0 and MACE <= 2.0 ms, SevenNet-l3i5 <= 5.0 ms) sit
below what the convolution kernels alone leave for the rest of the call, and it names a CUDA
graph of the step as a way to cut what launches cost. Before building one, this script
measures what a graph could save: bench_gpu.py's model call of e3fuse (its _setup_e3fuse and
_model_call: Calculator.calculate on unchanged positions) under torch.profiler's CUDA
activity trace (CUPTI sees every kernel of the process, the engine's included), and per call:
- wall ms (calculate, host <-> device copies included) and its median over the timed calls;
- kernels and copies: count, device ms summed, and the busy union of all GPU activity;
- GPU idle inside the call: before the first activity, between activities (the gaps a graph
  replay could shrink), after the last;
- the host's runtime API time (cudaLaunchKernel and friends) inside the call.

    python benchmarks/diag/call_timeline.py --model 7net-0=benchmarks/models/7net-0.e3f \
        --sizes 864 4000 --json out.json

Needs a GPU, torch and ase (the reference carry); --device cpu checks the script itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_gpu  # noqa: E402
import cases  # noqa: E402

CALL = "e3fuse_call"
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def gpu_intervals(trace: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(calls, events) of a chrome trace: the record_function ranges named CALL, and the
    kernels, copies, memsets and CUDA runtime calls, each {ts, end, cat, name} in
    microseconds."""
    calls, events = [], []
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") != "X":
            continue
        item = {
            "ts": float(ev["ts"]),
            "end": float(ev["ts"]) + float(ev.get("dur", 0.0)),
            "cat": ev.get("cat", ""),
            "name": ev.get("name", ""),
        }
        if item["name"] == CALL and item["cat"] == "user_annotation":
            calls.append(item)
        elif item["cat"] in GPU_CATEGORIES or item["cat"] == "cuda_runtime":
            events.append(item)
    calls.sort(key=lambda e: e["ts"])
    events.sort(key=lambda e: e["ts"])
    return calls, events


def call_breakdown(call: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
    """The GPU activity and runtime API time inside one call's host range."""
    inside = [e for e in events if e["ts"] >= call["ts"] and e["ts"] < call["end"]]
    device = [e for e in inside if e["cat"] in GPU_CATEGORIES]
    runtime = [e for e in inside if e["cat"] == "cuda_runtime"]
    busy, last_end, last_name = 0.0, None, ""
    gaps: list[tuple[float, str, str]] = []  # (idle us, the activity before, the one after)
    start = device[0]["ts"] if device else None  # events come sorted by start
    for e in device:
        if last_end is None or e["ts"] >= last_end:
            if last_end is not None:
                gaps.append((e["ts"] - last_end, last_name, e["name"]))
            busy += e["end"] - e["ts"]
            last_end, last_name = e["end"], e["name"]
        elif e["end"] > last_end:
            busy += e["end"] - last_end
            last_end, last_name = e["end"], e["name"]
    wall = call["end"] - call["ts"]
    kernels = [e for e in device if e["cat"] == "kernel"]
    return {
        "wall_us": wall,
        "kernels": len(kernels),
        "copies": len(device) - len(kernels),
        "kernel_us": sum(e["end"] - e["ts"] for e in kernels),
        "copy_us": sum(e["end"] - e["ts"] for e in device if e["cat"] != "kernel"),
        "busy_us": busy,
        "lead_us": (start - call["ts"]) if start is not None else wall,
        "gaps_us": sum(g for g, _, _ in gaps),
        "gaps_over_5us": sum(1 for g, _, _ in gaps if g > 5.0),
        "largest_gap_us": max((g for g, _, _ in gaps), default=0.0),
        "tail_us": (call["end"] - last_end) if last_end is not None else 0.0,
        "runtime_api_us": sum(e["end"] - e["ts"] for e in runtime),
        "runtime_calls": len(runtime),
        # host time from the call's start to its first CUDA runtime call, and from the end
        # of its last one to the call's end
        "host_before_runtime_us": (runtime[0]["ts"] - call["ts"]) if runtime else wall,
        "host_after_runtime_us": (call["end"] - max(e["end"] for e in runtime)) if runtime else 0,
        "largest_gaps": [
            {"us": g, "after": a[:60], "before": b[:60]}
            for g, a, b in sorted(gaps, key=lambda t: -t[0])[:3]
        ],
        "runtime_names": sorted({e["name"] for e in runtime}),
    }


def run_model(
    name: str, path: Path, sizes: list[int], repeats: int, profiled: int, device: str
) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile, record_function

    spec = {"engine": "e3fuse", "model_file": str(path), "device": device, "dtype": "float32"}
    calc = bench_gpu._setup_e3fuse(spec)["calc"]
    rows = []
    for n in sizes:
        atoms = cases.build_atoms(cases.case_for_size(n))
        atoms.calc = calc
        prepare, model_call = bench_gpu._model_call(spec, calc, atoms)

        def call(prepare: Any = prepare, model_call: Any = model_call) -> None:
            model_call(prepare())

        for _ in range(5):
            call()
        walls = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            call()
            walls.append(1e3 * (time.perf_counter() - t0))
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(profiled):
                with record_function(CALL):
                    call()
        with tempfile.TemporaryDirectory() as tmp:
            trace_file = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(trace_file))
            trace = json.loads(trace_file.read_text())
        calls, events = gpu_intervals(trace)
        per_call = [call_breakdown(c, events) for c in calls]
        med: dict[str, Any] = {}
        if per_call:
            med = {
                k: statistics.median(c[k] for c in per_call)
                for k, v in per_call[0].items()
                if isinstance(v, (int, float))
            }
            # where the idle sits, in the last profiled call
            med["largest_gaps"] = per_call[-1]["largest_gaps"]
            med["runtime_names"] = per_call[-1]["runtime_names"]
        kernel_names: dict[str, list[float]] = {}
        if calls:
            last = calls[-1]
            for e in events:
                if e["cat"] == "kernel" and last["ts"] <= e["ts"] < last["end"]:
                    kernel_names.setdefault(e["name"][:90], []).append(e["end"] - e["ts"])
        row = {
            "model": name,
            "atoms": len(atoms),
            "wall_ms_median": statistics.median(walls),
            "wall_ms_all": walls,
            "profiled_calls": len(per_call),
            "median_per_call": med,
            "last_call_kernels": {
                k: {"count": len(v), "us": sum(v)}
                for k, v in sorted(kernel_names.items(), key=lambda kv: -sum(kv[1]))
            },
        }
        rows.append(row)
        print(format_row(row), flush=True)
        atoms.calc = None
    return rows


def format_row(row: dict[str, Any]) -> str:
    m = row["median_per_call"]
    if not m:
        return f"{row['model']} {row['atoms']}: no profiled call found in the trace"
    lines = [
        f"{row['model']:>12} {row['atoms']:>6} atoms: wall {row['wall_ms_median']:.3f} ms "
        f"(profiled {m['wall_us'] / 1e3:.3f}); {m['kernels']:.0f} kernels "
        f"{m['kernel_us'] / 1e3:.3f} ms, {m['copies']:.0f} copies {m['copy_us'] / 1e3:.3f} ms, "
        f"GPU busy {m['busy_us'] / 1e3:.3f} ms; idle: lead {m['lead_us'] / 1e3:.3f}, gaps "
        f"{m['gaps_us'] / 1e3:.3f} ({m['gaps_over_5us']:.0f} over 5 us, largest "
        f"{m['largest_gap_us']:.0f} us), tail {m['tail_us'] / 1e3:.3f} ms; runtime API "
        f"{m['runtime_api_us'] / 1e3:.3f} ms in {m['runtime_calls']:.0f} calls"
    ]
    lines.append(
        f"      host before the first / after the last runtime call: "
        f"{m['host_before_runtime_us']:.0f} / {m['host_after_runtime_us']:.0f} us; runtime calls: "
        + ", ".join(m["runtime_names"])
    )
    for gap in m["largest_gaps"]:
        lines.append(f"      gap {gap['us']:6.1f} us after {gap['after']} before {gap['before']}")
    for k, v in list(row["last_call_kernels"].items())[:12]:
        lines.append(f"      {v['us']:9.1f} us {v['count']:4d}x  {k}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", action="append", required=True, help="NAME=PATH.e3f (repeatable)")
    p.add_argument("--sizes", type=int, nargs="+", default=[864, 4000])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--profiled", type=int, default=10)
    p.add_argument("--json", type=Path)
    p.add_argument("--device", default="cuda", help="cpu: a check of this script (no GPU trace)")
    args = p.parse_args(argv)
    rows = []
    for spec in args.model:
        name, _, path = spec.partition("=")
        if not Path(path).is_file():
            print(f"{name}: no model file {path}", flush=True)
            continue
        rows += run_model(name, Path(path), args.sizes, args.repeats, args.profiled, args.device)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
