"""CPU benchmark: e3fuse vs sevenn's (or mace-torch's) own ASE calculator on the copper cases.

For each case and dtype, in a fresh subprocess per engine (so that peak memory is the
engine's own, and e3fuse's and torch's OpenMP runtimes never share a process):
  time per energy+forces+stress call (time.perf_counter; one warm-up call, then the
  median and min of --repeats), peak RSS growth during the calls (VmHWM after
  resetting it through /proc/self/clear_refs, minus VmRSS before the first call),
  model GFLOP/s (cases.case_work), and max |dF| between e3fuse and sevenn in the
  same dtype. Writes one JSON file with machine, commit and version metadata.

  python benchmarks/bench_cpu.py --model 7net-0 --sizes 108 500 2048 \
      --dtypes float32 float64 --repeats 5 --out benchmarks/results/cpu_<machine>_<date>.json
  python benchmarks/bench_cpu.py --family mace --model mp0-medium --sizes 108 500 2048 \
      --reference-max-atoms 500 --out benchmarks/results/cpu_<machine>_<date>_mace-mp0-medium.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# numpy's BLAS is not what we measure; keep it from competing with the engines' threads.
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
# Which e3fuse to measure: the python/ folder of a built tree (--e3fuse-python).
E3FUSE_PYTHON = Path(os.environ.get("E3FUSE_BENCH_PYTHON", REPO / "python"))
sys.path.insert(0, str(E3FUSE_PYTHON))

import cases  # noqa: E402

PROPERTIES = ["energy", "forces", "stress"]
# sevenn's calculator is 30-100x slower; its calls are capped per case by time.
REFERENCE_DEFAULT_MAX_ATOMS = {"7net-l3i5": 500}


# --------------------------------------------------------------------------- memory


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) * 1024  # kB -> bytes
    return out


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _busy_seconds() -> float:
    """CPU seconds all processes have spent busy since boot (/proc/stat, all cores)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7]
    return busy / os.sysconf("SC_CLK_TCK")


def other_load(window_s: float = 1.0) -> float:
    """Cores kept busy by other processes over the next `window_s` (this one is idle)."""
    b0, c0, t0 = _busy_seconds(), time.process_time(), time.perf_counter()
    time.sleep(window_s)
    return ((_busy_seconds() - b0) - (time.process_time() - c0)) / (time.perf_counter() - t0)


def wait_for_quiet(threshold: float, max_wait_s: float) -> dict[str, float]:
    """Wait (at most max_wait_s) until other processes use fewer than `threshold` cores."""
    t0 = time.perf_counter()
    load = other_load()
    while load > threshold and time.perf_counter() - t0 < max_wait_s:
        load = other_load(2.0)
    return {"waited_s": time.perf_counter() - t0, "other_cores_before": load}


# --------------------------------------------------------------------------- workers


def _time_calls(
    call: Any, repeats: int, before: Any = None
) -> tuple[list[float], list[float], float]:
    """Wall and process CPU seconds (all threads) of each call, and the cores other
    processes kept busy meanwhile (contention: > 0 means the timings are inflated)."""
    times, cpu = [], []
    b0, c0, w0 = _busy_seconds(), time.process_time(), time.perf_counter()
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        c0 = time.process_time()
    wall = time.perf_counter() - w0
    others = ((_busy_seconds() - b0) - sum(cpu)) / wall
    return times, cpu, max(0.0, others)


def _summary(timed: tuple[list[float], list[float], float]) -> dict[str, Any]:
    times, cpu, others = timed
    return {
        "median_s": float(np.median(times)),
        "min_s": float(min(times)),
        "max_s": float(max(times)),
        "repeats": len(times),
        "times_s": times,
        "cpu_median_s": float(np.median(cpu)),
        "cpu_s": cpu,
        "other_cores": others,
    }


def worker_e3fuse(spec: dict[str, Any]) -> dict[str, Any]:
    import e3fuse

    atoms = cases.build_atoms(spec["case"])
    threads = spec["threads"]
    calc = e3fuse.Calculator(
        spec["model_path"], device="cpu", dtype=spec["dtype"], num_threads=threads[0]
    )
    result: dict[str, Any] = {"engine": "e3fuse", "describe": calc.engine.describe()}
    rss0 = _status()["VmRSS"]
    reset = _reset_peak()

    def call(c: Any = calc) -> None:
        c.calculate(atoms, PROPERTIES)

    t0 = time.perf_counter()
    call()
    result["warmup_s"] = time.perf_counter() - t0
    out = {k: np.asarray(calc.results[k]) for k in ("energy", "forces", "stress")}
    # Every timed call rebuilds the neighbor list, as sevenn's calculator does each call.
    result["rebuild"] = _summary(_time_calls(call, spec["repeats"], calc.neighbors.invalidate))
    # MD steady state: atoms within skin/2 of the last build, the list is reused.
    result["reuse"] = _summary(_time_calls(call, spec["reuse_repeats"]))
    st = _status()
    result["rss_before_bytes"] = rss0
    result["peak_rss_growth_bytes"] = st["VmHWM"] - rss0 if reset else None
    result["peak_method"] = "VmHWM after clear_refs=5" if reset else "unavailable"
    result["num_edges_in_list"] = int(calc.neighbors.num_edges)
    scaling = {}
    for n in threads[1:] if len(atoms) <= spec["scaling_max_atoms"] else []:
        c = e3fuse.Calculator(spec["model_path"], device="cpu", dtype=spec["dtype"], num_threads=n)
        call(c)
        scaling[str(n)] = _summary(
            _time_calls(lambda c=c: call(c), spec["scaling_repeats"], c.neighbors.invalidate)
        )
    scaling[str(threads[0])] = result["rebuild"]
    result["thread_scaling"] = scaling
    np.savez(spec["forces_out"], **out)
    return result


def _worker_reference(spec: dict[str, Any], engine: str, make_calc: Any, evaluate: Any) -> dict:
    """Times an upstream ASE calculator: a warm-up call, then timed calls within the
    per-case budget; records peak memory growth and the warm-up call's results."""
    import torch

    torch.set_num_threads(spec["threads"][0])
    atoms = cases.build_atoms(spec["case"])
    calc = make_calc()
    result: dict[str, Any] = {
        "engine": engine,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
    }
    rss0 = _status()["VmRSS"]
    reset = _reset_peak()
    t0 = time.perf_counter()
    out = evaluate(calc, atoms)
    warmup = time.perf_counter() - t0
    result["warmup_s"] = warmup
    # Fewer repeats where one call is slow: stay within the per-case time budget.
    repeats = max(1, min(spec["repeats"], int(spec["budget_s"] / max(warmup, 1e-9))))
    result["timed"] = _summary(_time_calls(lambda: evaluate(calc, atoms), repeats))
    st = _status()
    result["rss_before_bytes"] = rss0
    result["peak_rss_growth_bytes"] = st["VmHWM"] - rss0 if reset else None
    result["peak_method"] = "VmHWM after clear_refs=5" if reset else "unavailable"
    np.savez(spec["forces_out"], **{k: np.asarray(out[k]) for k in ("energy", "forces", "stress")})
    return result


def worker_sevenn(spec: dict[str, Any]) -> dict[str, Any]:
    """sevenn's SevenNetCalculator (reference.sevenn_calculator, in spec's dtype)."""
    from e3fuse import reference

    return _worker_reference(
        spec,
        "sevenn",
        lambda: reference.sevenn_calculator(spec["model"], spec["dtype"]),
        reference.evaluate,
    )


def worker_mace(spec: dict[str, Any]) -> dict[str, Any]:
    """mace-torch's MACECalculator (reference.mace_calculator: default_dtype = dtype)."""
    from e3fuse import reference

    return _worker_reference(
        spec,
        "mace-torch",
        lambda: reference.mace_calculator(spec["source"], spec["dtype"]),
        reference.evaluate_mace,
    )


def run_worker(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter; returns its JSON (or an error)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(E3FUSE_PYTHON), str(HERE)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"error": f"exit code {proc.returncode}: " + " | ".join(tail)}
    return json.loads(lines[-1])


# --------------------------------------------------------------------------- metadata


def _git(*args: str, where: Path | None = None) -> str:
    return subprocess.run(
        ["git", "-C", str(where or E3FUSE_PYTHON), *args],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _meminfo(key: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    return sorted(f for f in flags if f.startswith(("avx", "fma", "sse4")))
    except OSError:
        pass
    return []


def _build_info() -> dict[str, Any]:
    import e3fuse._core as core

    info: dict[str, Any] = {"core_path": core.__file__}
    so = Path(core.__file__).resolve()
    info["core_resolved"] = str(so)
    info["core_mtime"] = dt.datetime.fromtimestamp(so.stat().st_mtime).isoformat(timespec="seconds")
    cache = so.parent / "CMakeCache.txt"
    if cache.is_file():
        for line in cache.read_text().splitlines():
            for key in ("CMAKE_BUILD_TYPE", "E3FUSE_NATIVE", "CMAKE_CXX_COMPILER"):
                if line.startswith(key + ":"):
                    info[key] = line.split("=", 1)[1]
    return info


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("torch", "sevenn", "mace-torch", "e3nn", "ase", "numpy"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "absent"
    import e3fuse

    out["e3fuse"] = e3fuse.__version__
    return out


def metadata() -> dict[str, Any]:
    # The commit is that of the tree the measured e3fuse was built from (--e3fuse-python).
    status = _git("status", "--porcelain").splitlines()
    outside = [s for s in status if not s[3:].startswith("benchmarks/")]
    nproc = len(os.sched_getaffinity(0))
    return {
        "machine": {
            "node": platform.node(),
            "cpu": _cpu_model(),
            "nproc": nproc,
            "cpu_count": os.cpu_count(),
            "cpu_flags": _cpu_flags(),
            "mem_total_bytes": _meminfo("MemTotal"),
            "mem_available_bytes": _meminfo("MemAvailable"),
            "kernel": platform.release(),
            "loadavg_start": list(os.getloadavg()),
        },
        "gpu": None,  # CPU benchmark
        "git": {
            "commit": _git("rev-parse", "HEAD"),
            "tree": _git("rev-parse", "--show-toplevel"),
            "dirty": bool(status),
            "dirty_outside_benchmarks": bool(outside),
            "status": status[:40],
            "harness_commit": _git("rev-parse", "HEAD", where=HERE),
            "harness": str(Path(__file__).resolve()),
        },
        "versions": _versions(),
        "build": _build_info(),
        "env": {
            k: os.environ.get(k)
            for k in (
                "OMP_NUM_THREADS",
                "OMP_WAIT_POLICY",
                "OMP_PROC_BIND",
                "OPENBLAS_NUM_THREADS",
                "MKL_NUM_THREADS",
            )
        },
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }


# --------------------------------------------------------------------------- driver


def model_file(name: str, models_dir: Path) -> Path:
    """The .e3f file for `name` (a path, or a sevenn pretrained name converted once)."""
    path = Path(name)
    if path.suffix == ".e3f" and path.is_file():
        return path
    out = models_dir / f"{name}.e3f"
    if not out.is_file():
        from e3fuse.convert import sevennet

        models_dir.mkdir(parents=True, exist_ok=True)
        print(f"converting {name} -> {out}", flush=True)
        sevennet.convert(name, str(out))
    return out


def _mb(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**20:.0f}"


def _fmt_row(r: dict[str, Any], ref_key: str = "sevenn") -> str:
    e = r.get("e3fuse", {})
    s = r.get(ref_key, {})
    e_ms = e.get("rebuild", {}).get("median_s")
    s_ms = s.get("timed", {}).get("median_s")
    cols = [
        r["case"],
        r["dtype"],
        f"{e_ms * 1e3:10.1f}" if e_ms else f"{'-':>10}",
        f"{s_ms * 1e3:10.1f}" if s_ms else f"{'-':>10}",
        f"{r['speedup']:7.1f}" if r.get("speedup") else f"{'-':>7}",
        f"{r['e3fuse_gflops']:7.1f}" if r.get("e3fuse_gflops") else f"{'-':>7}",
        f"{r[ref_key + '_gflops']:7.1f}" if r.get(ref_key + "_gflops") else f"{'-':>7}",
        f"{_mb(e.get('peak_rss_growth_bytes')):>7}",
        f"{_mb(s.get('peak_rss_growth_bytes')):>7}",
        f"{r['max_abs_dF']:.1e}" if r.get("max_abs_dF") is not None else f"{'-':>7}",
        "/".join(
            f"{x['other_cores']:.1f}" if x else "-" for x in (e.get("rebuild"), s.get("timed"))
        ),
    ]
    return "  ".join(f"{c:>12}" if i < 2 else c for i, c in enumerate(cols))


HEADER = "  ".join(
    [
        f"{'case':>12}",
        f"{'dtype':>12}",
        f"{'e3fuse ms':>10}",
        f"{'sevenn ms':>10}",
        f"{'speedup':>7}",
        f"{'e3f GF/s':>7}",
        f"{'7n GF/s':>7}",
        f"{'e3f MB':>7}",
        f"{'7n MB':>7}",
        "max|dF|",
        "busy (other cores, e3f/7n)",
    ]
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument(
        "--family",
        default="sevennet",
        choices=["sevennet", "mace"],
        help="sevennet: reference is sevenn's calculator; mace: mace-torch's MACECalculator",
    )
    p.add_argument(
        "--model",
        default=None,
        help="sevennet: pretrained name (or .e3f path), "
        "default 7net-0; mace: mace-torch model file (torch.save(model)) or "
        "mp0-small/mp0-medium/mp0-large (MACE-MP-0 architecture, random weights; "
        "mace_models.py), default mp0-medium",
    )
    p.add_argument("--sizes", type=int, nargs="+", default=[108, 500, 2048])
    p.add_argument(
        "--dtypes", nargs="+", default=["float32", "float64"], choices=["float32", "float64"]
    )
    p.add_argument("--repeats", type=int, default=5, help="timed e3fuse calls per mode")
    p.add_argument(
        "--reference",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time sevenn's calculator",
    )
    p.add_argument(
        "--reference-max-atoms",
        type=int,
        default=None,
        help="largest case given to sevenn (default 2048; 500 for 7net-l3i5)",
    )
    p.add_argument("--reference-repeats", type=int, default=3)
    p.add_argument(
        "--reference-budget-s",
        type=float,
        default=60.0,
        help="timed sevenn seconds per case after the warm-up (fewer repeats if slow)",
    )
    p.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=None,
        help="e3fuse thread counts; the first is the headline (default: nproc), "
        "the others are a scaling check",
    )
    p.add_argument("--scaling-repeats", type=int, default=3)
    p.add_argument(
        "--scaling-max-atoms",
        type=int,
        default=500,
        help="largest case timed at the other --threads counts",
    )
    p.add_argument(
        "--reuse-repeats",
        type=int,
        default=3,
        help="timed e3fuse calls reusing the neighbor list (MD steady state)",
    )
    p.add_argument(
        "--quiet-cores",
        type=float,
        default=0.3,
        help="before each measurement, wait until other processes use fewer cores",
    )
    p.add_argument("--max-wait-s", type=float, default=30.0, help="longest such wait")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds per worker")
    p.add_argument("--models-dir", type=Path, default=HERE / "models")
    p.add_argument(
        "--e3fuse-python",
        type=Path,
        default=None,
        help="python/ folder of the e3fuse tree to measure (default: this repo's); "
        "the JSON records that tree's commit",
    )
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    if args.worker:
        spec = json.loads(args.worker)
        fn = {"e3fuse": worker_e3fuse, "sevenn": worker_sevenn, "mace": worker_mace}[spec["engine"]]
        print(json.dumps(fn(spec)), flush=True)
        return 0

    if args.e3fuse_python is not None:
        global E3FUSE_PYTHON
        E3FUSE_PYTHON = args.e3fuse_python.resolve()
        os.environ["E3FUSE_BENCH_PYTHON"] = str(E3FUSE_PYTHON)
        sys.path.insert(0, str(E3FUSE_PYTHON))
    if args.model is None:
        args.model = "7net-0" if args.family == "sevennet" else "mp0-medium"
    # The reference engine's key in each result row ("sevenn" kept for sevennet's files).
    ref_key = "sevenn" if args.family == "sevennet" else "mace"
    nproc = len(os.sched_getaffinity(0))
    threads = args.threads or [nproc]
    ref_max = args.reference_max_atoms
    if ref_max is None:
        ref_max = REFERENCE_DEFAULT_MAX_ATOMS.get(args.model, 2048)
    machine = platform.node() or "cpu"
    out_path = args.out or HERE / "results" / f"cpu_{machine}_{dt.date.today():%Y%m%d}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)

    from e3fuse.modelfile import read_architecture

    source = None
    if args.family == "mace":
        import mace_models

        source, path = mace_models.model_files(args.model, args.models_dir)
    else:
        path = model_file(args.model, args.models_dir)
    arch = read_architecture(path)
    is_mace = arch.get("family") == "mace"
    doc: dict[str, Any] = {
        "benchmark": "cpu",
        "family": args.family,
        "reference_engine": ref_key,
        "model": args.model,
        "reference_source": str(source) if source else None,
        "model_file": str(path),
        "model_source": arch.get("source"),
        "meta": metadata(),
        "settings": {
            "repeats": args.repeats,
            "reference": args.reference,
            "reference_max_atoms": ref_max,
            "reference_repeats": args.reference_repeats,
            "reference_budget_s": args.reference_budget_s,
            "threads": threads,
            "properties": PROPERTIES,
        },
        # cases.py counts SevenNet's work only; MACE rows carry atom and edge counts.
        "work": None if is_mace else cases.model_work(arch),
        "results": [],
    }
    meta = doc["meta"]
    print(
        f"# {args.model} on {meta['machine']['cpu']} ({nproc} cores, load "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}), commit "
        f"{meta['git']['commit'][:10]}{' (dirty)' if meta['git']['dirty'] else ''}",
        flush=True,
    )
    print(
        HEADER if ref_key == "sevenn" else HEADER.replace("sevenn", "mace  ").replace("7n", "mt"),
        flush=True,
    )

    # The reference's peak memory per atom seen so far, per dtype, to skip cases that cannot fit.
    sevenn_bytes_per_atom: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in sorted(args.sizes):
            c = cases.case_for_size(size)
            atoms = cases.build_atoms(c)
            edges = cases.count_edges(atoms, arch["cutoff"])
            work = (
                {"num_atoms": len(atoms), "num_edges": edges}
                if is_mace
                else cases.case_work(arch, len(atoms), edges)
            )
            for dtype in args.dtypes:
                row: dict[str, Any] = {
                    "case": c.id,
                    "dtype": dtype,
                    "num_atoms": len(atoms),
                    "work": work,
                    "loadavg_before": list(os.getloadavg()),
                }
                base = {
                    "case": c.id,
                    "dtype": dtype,
                    "model": args.model,
                    "model_path": str(path),
                    "threads": threads,
                }
                spec = {
                    **base,
                    "engine": "e3fuse",
                    "repeats": args.repeats,
                    "scaling_repeats": args.scaling_repeats,
                    "scaling_max_atoms": args.scaling_max_atoms,
                    "reuse_repeats": args.reuse_repeats,
                    "forces_out": f"{tmp}/e3fuse_{c.id}_{dtype}.npz",
                }
                quiet = wait_for_quiet(args.quiet_cores, args.max_wait_s)
                row["e3fuse"] = {**run_worker(spec, args.timeout), **quiet}
                want_ref = args.reference and size <= ref_max
                if want_ref and dtype in sevenn_bytes_per_atom:
                    need = sevenn_bytes_per_atom[dtype] * size
                    avail = _meminfo("MemAvailable") or 0
                    # Leave room for the machine's other users: never risk the OOM killer.
                    if need > min(0.8 * avail, avail - 3 * 2**30):
                        want_ref = False
                        row[ref_key] = {
                            "skipped": f"needs ~{need / 2**30:.1f} GiB (scaled from "
                            f"smaller cases), {avail / 2**30:.1f} GiB "
                            "available"
                        }
                elif args.reference and size > ref_max:
                    row[ref_key] = {"skipped": f"above --reference-max-atoms {ref_max}"}
                if want_ref:
                    spec = {
                        **base,
                        "engine": ref_key,
                        "source": str(source) if source else None,
                        "repeats": args.reference_repeats,
                        "budget_s": args.reference_budget_s,
                        "threads": [nproc],
                        "forces_out": f"{tmp}/{ref_key}_{c.id}_{dtype}.npz",
                    }
                    quiet = wait_for_quiet(args.quiet_cores, args.max_wait_s)
                    row[ref_key] = {**run_worker(spec, args.timeout), **quiet}
                    peak = row[ref_key].get("peak_rss_growth_bytes")
                    if peak:
                        sevenn_bytes_per_atom[dtype] = max(
                            sevenn_bytes_per_atom.get(dtype, 0), peak / size
                        )
                row["loadavg_after"] = list(os.getloadavg())
                flops = work.get("model_flops")
                e_t = row["e3fuse"].get("rebuild", {}).get("median_s")
                s_t = row.get(ref_key, {}).get("timed", {}).get("median_s")
                if e_t:
                    row["e3fuse_us_per_atom"] = e_t / size * 1e6
                if e_t and flops:
                    row["e3fuse_gflops"] = flops / e_t / 1e9
                    row["e3fuse_executed_gflops"] = work["e3fuse_executed_flops"] / e_t / 1e9
                if s_t and flops:
                    row[f"{ref_key}_gflops"] = flops / s_t / 1e9
                if e_t and s_t:
                    row["speedup"] = s_t / e_t
                fe = Path(tmp) / f"e3fuse_{c.id}_{dtype}.npz"
                fs = Path(tmp) / f"{ref_key}_{c.id}_{dtype}.npz"
                if fe.is_file() and fs.is_file():
                    a, b = np.load(fe), np.load(fs)
                    row["max_abs_dF"] = float(np.abs(a["forces"] - b["forces"]).max())
                    row["rel_dF"] = float(
                        np.linalg.norm(a["forces"] - b["forces"]) / np.linalg.norm(b["forces"])
                    )
                    row["abs_dE_per_atom"] = float(abs(a["energy"] - b["energy"]) / size)
                    row["max_abs_dstress"] = float(np.abs(a["stress"] - b["stress"]).max())
                doc["results"].append(row)
                print(_fmt_row(row, ref_key), flush=True)
                for engine in ("e3fuse", ref_key):
                    msg = row.get(engine, {}).get("error") or row.get(engine, {}).get("skipped")
                    if msg:
                        print(f"    {engine}: {msg}", flush=True)
                # Written after every case so that a cut-off run keeps what it measured.
                doc["meta"]["machine"]["loadavg_end"] = list(os.getloadavg())
                out_path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
