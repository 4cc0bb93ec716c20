"""Where the time of the MACE anchor's model call goes (issue 21).

bench_gpu.py's model call of mace-torch with cuEquivariance on the MACE-MP-0 medium
architecture (random weights) takes about 800 ms at 32,000 atoms on an H100 in every run
since 0320778, where the issue's table says 151.6 ms. This script makes the same call through
bench_gpu's own code (_setup_mace, _model_call), then reports:
- the median of a few timed calls;
- the allocator's statistics (peak allocated and reserved, cudaMalloc retries);
- one call under torch.profiler: its device time summed over kernels against its wall time,
  and the operators with the most device time;
- the same call without stress (compute_stress=False).

    python benchmarks/diag/mace_anchor.py --sizes 864 32000 --json out.json

Needs a GPU, mace-torch and cuequivariance-torch (the reference carry).
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
import mace_models  # noqa: E402


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(call: Any, prepare: Any, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        data = prepare()
        sync()
        t0 = time.perf_counter()
        call(data)
        sync()
        times.append(1e3 * (time.perf_counter() - t0))
    return times


def profile_one(call: Any, prepare: Any, top: int) -> dict[str, Any]:
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    data = prepare()
    sync()
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        call(data)
        sync()
    wall = 1e3 * (time.perf_counter() - t0)
    events = prof.key_averages()
    # the kernels' own rows, as the table's "Self CUDA time total" (each operator's row
    # repeats its kernels' time)
    device_us = sum(
        e.self_device_time_total
        for e in events
        if e.device_type == DeviceType.CUDA and not e.is_user_annotation
    )
    table = events.table(sort_by="self_device_time_total", row_limit=top)
    return {"wall_ms_profiled": wall, "device_ms": device_us / 1e3, "table": table}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[864, 32000])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--json", type=Path)
    p.add_argument("--device", default="cuda", help="cpu: a check of this script (no cueq)")
    args = p.parse_args(argv)
    cuda = args.device == "cuda"

    import torch

    # _setup_mace loads the model from a file, as the harness does; the file goes after it
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "mace-mp0-medium-random.model"
        torch.save(mace_models.build("mp0-medium"), source)
        spec = {
            "engine": "mace-cueq",
            "source": str(source),
            "device": args.device,
            "dtype": "float32",
        }
        env = bench_gpu._setup_mace(spec, cueq=cuda)
    calc = env["calc"]
    model = calc.models[0]
    print("model after MACECalculator(enable_cueq=True):", type(model).__name__, flush=True)
    print("interaction conv_tp:", type(model.interactions[0].conv_tp).__name__, flush=True)
    results = []
    for n in args.sizes:
        atoms = cases.build_atoms(cases.case_for_size(n))
        prepare, call = bench_gpu._model_call(spec, calc, atoms)
        no_stress = lambda d: model(d, compute_stress=False, training=False)  # noqa: E731
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        timed(call, prepare, 2)  # warm-up
        times = timed(call, prepare, args.repeats)
        row: dict[str, Any] = {
            "atoms": n,
            "model_call_ms": statistics.median(times),
            "model_call_ms_all": times,
        }
        if cuda:
            stats = torch.cuda.memory_stats()
            row.update(
                peak_allocated_gib=torch.cuda.max_memory_allocated() / 2**30,
                peak_reserved_gib=torch.cuda.max_memory_reserved() / 2**30,
                alloc_retries=stats.get("num_alloc_retries", 0),
                device_allocs=stats.get("num_device_alloc", 0),
                device_frees=stats.get("num_device_free", 0),
            )
        row.update(profile_one(call, prepare, args.top))
        timed(no_stress, prepare, 1)
        row["no_stress_ms"] = statistics.median(timed(no_stress, prepare, args.repeats))
        print(json.dumps({k: v for k, v in row.items() if k != "table"}), flush=True)
        print(row["table"], flush=True)
        results.append(row)
        del prepare, call
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
