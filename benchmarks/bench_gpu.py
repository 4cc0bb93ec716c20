"""GPU benchmark: e3fuse against sevenn / mace-torch (e3nn and cuEquivariance) and Symmetrix-XL.

Rattled fcc Cu supercells (cases.py: a = 3.61 A, N(0, 0.05 A) rattle) of 864, 4000 and 32000
atoms, then growing by about x2 in atoms (n -> n * 2^(1/3) cubic cells per side) until an
engine runs out of memory (its growth stops there) or --max-atoms / --deadline-s is reached.
Every engine x size runs in its own subprocess (an out-of-memory error or a crash stays there,
peak memory is that engine's own; --timeout per case). Per case: warm-up calls, then the median
wall-clock ms of energy+forces+stress calls (e3fuse returns host arrays, so the clock around
the call is correct; torch anchors are followed by torch.cuda.synchronize()). Before each timed
call every coordinate moves by N(0, 1e-3 A), an MD step: engines that keep a neighbor list with
a skin (e3fuse, Symmetrix-XL) reuse it, the torch calculators rebuild their graph as they do in
MD. e3fuse also gets a "rebuild" series (list invalidated before each call).

Peak memory: torch.cuda.max_memory_allocated for the torch anchors; Engine.device_bytes_peak()
for e3fuse; for every engine the device memory in use (NVML, sampled every 2 ms from a thread,
minus the level before the calculator was made: includes the CUDA context, caches and
workspaces).

  python benchmarks/bench_gpu.py --family sevennet --model 7net-0
  python benchmarks/bench_gpu.py --family sevennet --model 7net-l3i5
  python benchmarks/bench_gpu.py --family mace --model mp0-medium \
      --symmetrix-model .carry/symmetrix/mace-mp0-medium-random-Cu.json.xz
  python benchmarks/bench_gpu.py --memory-scaling --family sevennet --model 7net-0
  python benchmarks/bench_gpu.py --family sevennet --model 7net-0 --kinds model-call md-step

--kinds: the labelled "model call" and "ASE MD step" of issue 21 instead of the growth series
(see the section "labelled kinds" below; results in calls_<model>_<gpu>.{json,md}).

Results: benchmarks/results/gpu_<model>_<gpu>.{json,md} (rows of an earlier run on the same
GPU kind are kept unless re-measured: engines measured in separate calls end up in one table)
and, for --memory-scaling, memory_<model>_<gpu>.{json,md} with the least-squares fit
peak = a + b * atoms + c * edges (the lattice constant is varied as well, so that atoms and
edges are not collinear).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import lzma
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
# The source tree's package only where no built e3fuse is importable (an installed or
# staged build, as on the GPU machine, comes first).
sys.path.append(str(REPO / "python"))

import cases  # noqa: E402
import numpy as np  # noqa: E402

PROPERTIES = ["energy", "forces", "stress"]
ENGINES = {
    "sevennet": ["e3fuse", "e3fuse-f64", "sevenn", "sevenn-cueq"],
    "mace": ["e3fuse", "e3fuse-f64", "mace", "mace-cueq", "symmetrix"],
}
DEFAULT_SIZES = [864, 4000, 32000]
MD_DISPLACEMENT = 1e-3  # A per coordinate before each timed call


# --------------------------------------------------------------------------- cases


def make_case(repeat: int, lattice: float = cases.LATTICE_CU) -> cases.Case:
    atoms = 4 * repeat**3
    cid = f"cu-fcc-{atoms}" if lattice == cases.LATTICE_CU else f"cu-fcc-{atoms}-a{lattice:g}"
    return cases.Case(cid, repeat, lattice=lattice)


def grow_repeats(sizes: list[int], grow: bool, max_atoms: int) -> list[int]:
    """n per side for the listed sizes, then (grow) about x2 in atoms up to max_atoms."""
    from e3fuse.bench import repeats_for

    ns = sorted({cases.case_for_size(s).repeat for s in sizes})
    if grow:
        ns += [n for n in repeats_for(max_atoms) if n > (ns[-1] if ns else 0)]
    return [n for n in ns if 4 * n**3 <= max_atoms]


def count_edges_fast(c: cases.Case, cutoff: float) -> int:
    """Directed edges with r < cutoff: a periodic k-d tree for cubic cells wider than two
    cutoffs, ASE's neighbor list otherwise."""
    atoms = cases.build_atoms(c)
    box = c.lattice * c.repeat
    if cutoff < box / 2:
        from scipy.spatial import cKDTree

        pos = np.mod(atoms.positions, box)
        tree = cKDTree(pos, boxsize=box)
        return int(tree.count_neighbors(tree, cutoff)) - len(atoms)
    return cases.count_edges(atoms, cutoff)


class EdgeCounter:
    """Exact counts up to exact_max atoms; beyond, edges/atom of the largest exact count
    of the same lattice constant times atoms (marked 'estimated')."""

    def __init__(self, cutoff: float, exact_max: int) -> None:
        self.cutoff = cutoff
        self.exact_max = exact_max
        self.per_atom: dict[float, float] = {}

    def __call__(self, c: cases.Case) -> tuple[int, str]:
        if c.num_atoms <= self.exact_max or c.lattice not in self.per_atom:
            e = count_edges_fast(c, self.cutoff)
            self.per_atom[c.lattice] = e / c.num_atoms
            return e, "exact"
        return round(self.per_atom[c.lattice] * c.num_atoms), "estimated"


# --------------------------------------------------------------------------- workers


def _torch_sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _setup_e3fuse(spec: dict[str, Any]) -> dict[str, Any]:
    import e3fuse
    from e3fuse.bench import e3fuse_reset_device_peak

    if spec["device"] == "cuda":
        e3fuse_reset_device_peak()
    calc = e3fuse.Calculator(spec["model_file"], device=spec["device"], dtype=spec["dtype"])
    # The rebuild series moves one atom by more than skin / 2 (back and forth) before each
    # call, which makes the engine rebuild its neighbor list inside the call.
    skin = float(getattr(getattr(calc, "neighbors", None), "skin", 0.5))
    return {"calc": calc, "kick": skin / 2 + 0.05, "info": {"describe": calc.engine.describe()}}


def _setup_sevenn(spec: dict[str, Any], cueq: bool) -> dict[str, Any]:
    import torch
    from sevenn.calculator import SevenNetCalculator

    from e3fuse.convert.sevennet import resolve_checkpoint

    if spec["device"] == "cuda":
        torch.cuda.reset_peak_memory_stats()
    calc = SevenNetCalculator(
        model=str(resolve_checkpoint(spec["model"])),
        file_type="checkpoint",
        device=spec["device"],
        enable_cueq=cueq,
    )
    return {"calc": calc, "sync": _torch_sync, "torch": True}


def _setup_mace(spec: dict[str, Any], cueq: bool) -> dict[str, Any]:
    import warnings

    import torch
    from mace.calculators import MACECalculator

    if not spec.get("source"):
        raise RuntimeError("no mace-torch model file for this model (give --model mp0-medium)")
    if spec["device"] == "cuda":
        torch.cuda.reset_peak_memory_stats()
    model = torch.load(spec["source"], map_location="cpu", weights_only=False)
    model = model.to(torch.float32 if spec["dtype"] == "float32" else torch.float64).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        calc = MACECalculator(
            models=model, device=spec["device"], default_dtype=spec["dtype"], enable_cueq=cueq
        )
    return {"calc": calc, "sync": _torch_sync, "torch": True}


def _setup_symmetrix(spec: dict[str, Any]) -> dict[str, Any]:
    path = spec.get("symmetrix_model")
    if not path:
        raise RuntimeError("no Symmetrix-XL model (--symmetrix-model MODEL.json[.xz])")
    if path.endswith(".xz"):
        out = Path(tempfile.gettempdir()) / Path(path).name[:-3]
        if not out.is_file():
            with lzma.open(path) as src:
                out.write_bytes(src.read())
        path = str(out)
    cache = Path(tempfile.gettempdir()) / f"symmetrix-jit-{os.getuid()}"
    cache.mkdir(mode=0o700, exist_ok=True)
    os.environ.setdefault("SYMMETRIX_JIT_CACHE", str(cache))
    from symmetrix import Symmetrix

    calc = Symmetrix(path, dtype=spec["dtype"])
    info: dict[str, Any] = {"symmetrix_model": path}
    try:
        from symmetrix import backend_loader

        info["backend"] = backend_loader.selected_backend()
    except Exception as err:  # noqa: BLE001 - informational only
        info["backend"] = f"unknown ({err})"
    return {"calc": calc, "info": info}


def _setup(spec: dict[str, Any]) -> dict[str, Any]:
    engine = spec["engine"]
    if engine.startswith("e3fuse"):
        return _setup_e3fuse(spec)
    if engine in ("sevenn", "sevenn-cueq"):
        return _setup_sevenn(spec, engine.endswith("cueq"))
    if engine in ("mace", "mace-cueq"):
        return _setup_mace(spec, engine.endswith("cueq"))
    if engine == "symmetrix":
        return _setup_symmetrix(spec)
    raise ValueError(f"unknown engine {engine!r}")


def _timed(call: Any, atoms: Any, repeats: int, budget_s: float, before: Any = None) -> list[float]:
    """Wall seconds of up to `repeats` calls (at least 3), stopping once `budget_s` is spent."""
    rng = np.random.default_rng(7)
    times: list[float] = []
    spent = 0.0
    while len(times) < repeats and (len(times) < 3 or spent < budget_s):
        atoms.positions += rng.normal(0.0, MD_DISPLACEMENT, size=atoms.positions.shape)
        if before is not None:
            before()
        t0 = time.perf_counter()
        call()
        dt_ = time.perf_counter() - t0
        times.append(dt_)
        spent += dt_
    return times


def _builds(calc: Any) -> int | None:
    builds = getattr(getattr(calc, "neighbors", None), "num_builds", None)
    return int(builds) if builds is not None else None


def _stats(times: list[float]) -> dict[str, Any]:
    return {
        "median_ms": float(np.median(times)) * 1e3,
        "min_ms": float(min(times)) * 1e3,
        "max_ms": float(max(times)) * 1e3,
        "repeats": len(times),
        "times_ms": [t * 1e3 for t in times],
    }


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    if spec.get("kinds"):
        return labelled_worker(spec)
    from ase.calculators.calculator import all_changes

    from e3fuse.bench import DeviceMemorySampler, e3fuse_device_bytes, is_out_of_memory

    c = make_case(spec["repeat"], spec["lattice"])
    atoms = cases.build_atoms(c)
    on_gpu = spec["device"] == "cuda"
    sampler = DeviceMemorySampler() if on_gpu else None
    result: dict[str, Any] = {"status": "ok"}
    try:
        if sampler is not None:
            sampler.start()
        t0 = time.perf_counter()
        env = _setup(spec)
        result["setup_s"] = time.perf_counter() - t0
        calc = env["calc"]
        sync = env.get("sync") or (lambda: None)
        result.update(env.get("info", {}))

        def call() -> None:
            calc.calculate(atoms, PROPERTIES, all_changes)
            sync()

        t0 = time.perf_counter()
        call()
        result["first_call_s"] = time.perf_counter() - t0
        if spec.get("forces_out"):
            np.savez(
                spec["forces_out"],
                energy=float(calc.results["energy"]),
                forces=np.asarray(calc.results["forces"]),
                stress=np.asarray(calc.results["stress"]),
            )
        for _ in range(max(0, spec["warmup"] - 1)):
            call()
        result["md"] = _stats(_timed(call, atoms, spec["repeats"], spec["budget_s"]))
        if env.get("kick") and spec.get("rebuild_series", True):
            sign = [1.0]

            def kick(step: float = env["kick"]) -> None:
                atoms.positions[0, 0] += sign[0] * step
                sign[0] = -sign[0]

            builds0 = _builds(calc)
            result["rebuild"] = _stats(
                _timed(call, atoms, max(3, spec["repeats"] // 2), spec["budget_s"] / 2, kick)
            )
            if builds0 is not None:
                result["rebuild"]["neighbor_builds"] = _builds(calc) - builds0
        nl = getattr(calc, "neighbors", None)
        if getattr(nl, "num_edges", None) is not None:
            result["edges_in_list"] = int(nl.num_edges)
            result["neighbor_builds"] = int(nl.num_builds)
    except Exception as err:  # noqa: BLE001 - classified and reported to the driver
        result["status"] = "oom" if is_out_of_memory(err) else "error"
        result["error"] = f"{type(err).__name__}: {err}"[:2000]
    finally:
        if sampler is not None:
            result.update(sampler.stop())
    if on_gpu:
        if spec["engine"].startswith("e3fuse"):
            in_use, peak = e3fuse_device_bytes()
            result["e3fuse_device_bytes_peak"] = peak
            result["e3fuse_device_bytes_in_use"] = in_use
        elif spec["engine"] in ("sevenn", "sevenn-cueq", "mace", "mace-cueq"):
            import torch

            result["torch_max_memory_allocated"] = int(torch.cuda.max_memory_allocated())
            result["torch_max_memory_reserved"] = int(torch.cuda.max_memory_reserved())
    return result


def run_worker(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One measurement in a fresh interpreter; its JSON, or a status for what went wrong."""
    from e3fuse.bench import is_out_of_memory

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE)]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        + [str(REPO / "python")]
    )
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        # a worker that reports as it goes (labelled_worker) keeps what it measured
        partial = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        lines = [line for line in partial.splitlines() if line.startswith("{")]
        out = json.loads(lines[-1]) if lines else {}
        out.update(status="timeout", error=f"timed out after {timeout:.0f} s")
        return out
    wall = time.perf_counter() - t0
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        status = "oom" if is_out_of_memory(tail) or proc.returncode == -9 else "crashed"
        return {
            "status": status,
            "error": f"exit code {proc.returncode}: {tail}"[:2000],
            "wall_s": wall,
        }
    out = json.loads(lines[-1])
    out["wall_s"] = wall
    return out


# --------------------------------------------------------------------------- metadata


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
    ).stdout.strip()


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in (
        "torch",
        "sevenn",
        "mace-torch",
        "e3nn",
        "cuequivariance",
        "cuequivariance-torch",
        "cuequivariance-ops-torch-cu13",
        "symmetrix-xl",
        "symmetrix-xl-cuda13-sm90",
        "ase",
        "numpy",
    ):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "absent"
    return out


def metadata(device: str) -> dict[str, Any]:
    from e3fuse.bench import gpu_info

    status = _git("status", "--porcelain").splitlines()
    return {
        "gpu": gpu_info() if device == "cuda" else None,
        "device": device,
        "commit": os.environ.get("E3FUSE_COMMIT") or _git("rev-parse", "HEAD"),
        "dirty": bool(status),
        "dirty_files": status[:40],
        "versions": _versions(),
        "host": platform.node(),
        "nproc": len(os.sched_getaffinity(0)),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }


def installed(engine: str) -> str | None:
    """None if the engine's packages import here, else why not."""
    import importlib.util

    need = {
        "sevenn": ["torch", "sevenn"],
        "sevenn-cueq": ["torch", "sevenn", "cuequivariance_torch"],
        "mace": ["torch", "mace"],
        "mace-cueq": ["torch", "mace", "cuequivariance_torch"],
        "symmetrix": ["symmetrix"],
    }.get(engine, [])
    missing = [m for m in need if importlib.util.find_spec(m) is None]
    return f"not installed ({', '.join(missing)})" if missing else None


# --------------------------------------------------------------------------- models


def resolve_models(args: argparse.Namespace) -> dict[str, Any]:
    """.e3f file, name for result files, upstream source and Symmetrix model of --model."""
    models_dir = args.models_dir
    if args.family == "sevennet":
        name = args.model or "7net-0"
        from bench_cpu import model_file

        e3f = model_file(name, models_dir)
        label = Path(name).stem if name.endswith(".e3f") else name
        return {"e3f": e3f, "label": label, "source": None, "sevenn_model": name}
    name = args.model or "mp0-medium"
    if name.endswith(".e3f"):
        e3f, source = Path(name), None
        label = Path(name).stem
    else:
        import mace_models

        source, e3f = mace_models.model_files(name, models_dir)
        label = f"mace-{name}" if name in mace_models.HIDDEN else Path(name).stem
    symx = args.symmetrix_model
    if symx is None:
        stem = Path(source).stem if source else Path(e3f).stem
        for folder in (REPO / ".carry" / "symmetrix", models_dir):
            found = sorted(folder.glob(f"{stem}*.json")) + sorted(folder.glob(f"{stem}*.json.xz"))
            if found:
                symx = found[0]
                break
    return {"e3f": e3f, "label": label, "source": source, "symmetrix_model": symx}


# --------------------------------------------------------------------------- tables


def _fmt(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _mib(b: Any) -> str:
    return "-" if b is None else f"{b / 2**20:,.0f}"


def peak_bytes(r: dict[str, Any]) -> int | None:
    """The engine's own peak: e3fuse's counter, torch's allocator peak, else NVML growth."""
    for key in ("e3fuse_device_bytes_peak", "torch_max_memory_allocated", "nvml_peak_growth_bytes"):
        if r.get(key) is not None:
            return r[key]
    return None


def cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    if r["status"] != "ok":
        return r["status"]
    return f"{r['md']['median_ms']:,.2f} ms ({_mib(peak_bytes(r))} MiB)"


def markdown(doc: dict[str, Any]) -> str:
    rows = doc["rows"]
    engines = [e for e in ENGINES[doc["family"]] if any(r["engine"] == e for r in rows)]
    sizes = sorted({r["atoms"] for r in rows})
    by = {(r["engine"], r["atoms"]): r for r in rows}
    gpu = (doc["meta"].get("gpu") or {}).get("name", doc["meta"]["device"])
    out = [
        f"# {doc['label']} on {gpu}",
        "",
        "Median ms per energy+forces+stress call (MD step: atoms displaced before each call), "
        "peak device memory in MiB (e3fuse: its own arrays; torch: max_memory_allocated; "
        "Symmetrix-XL: NVML growth). Rows from several runs are merged; each row's commit and "
        "date are in the JSON.",
        "",
        "| atoms | edges | " + " | ".join(engines) + " | e3fuse speedup | e3fuse GFLOP/s |",
        "|---:|---:|" + "---:|" * len(engines) + "---|---:|",
    ]
    for n in sizes:
        any_row = next(r for r in rows if r["atoms"] == n)
        e3 = by.get(("e3fuse", n))
        speed = []
        if e3 and e3["status"] == "ok":
            for e in engines:
                r = by.get((e, n))
                if e.startswith("e3fuse") or not r or r["status"] != "ok":
                    continue
                speed.append(f"{e} {r['md']['median_ms'] / e3['md']['median_ms']:.1f}x")
        gf = e3.get("gflops") if e3 else None
        out.append(
            f"| {n:,} | {any_row.get('edges', 0):,} | "
            + " | ".join(cell(by.get((e, n))) for e in engines)
            + f" | {', '.join(speed) or '-'} | {'-' if gf is None else f'{gf:,.0f}'} |"
        )
    notes = [r for r in rows if r["status"] not in ("ok",)]
    if notes:
        out += ["", "Not measured / failed:", ""]
        out += [
            f"- {r['engine']} at {r['atoms']:,}: {r['status']}: {(r.get('error') or '')[:200]}"
            for r in notes
        ]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- driver


def _row_key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["engine"], r["dtype"], r["atoms"], r.get("lattice", cases.LATTICE_CU))


def save(doc: dict[str, Any], path: Path, md: str | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    if md is not None:
        path.with_suffix(".md").write_text(md)


def merged_doc(path: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """doc, with the rows of an earlier file at `path` that this run does not re-measure."""
    if not path.is_file():
        return doc
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return doc
    old_rows = old.get("rows", [])
    measured_before = {_row_key(r) for r in old_rows if r.get("status") != "skipped"}
    # a case this run skipped (deadline) keeps its earlier measurement
    new_rows = [
        r for r in doc["rows"] if r.get("status") != "skipped" or _row_key(r) not in measured_before
    ]
    keys = {_row_key(r) for r in new_rows}
    doc = dict(doc)
    doc["rows"] = [r for r in old_rows if _row_key(r) not in keys] + new_rows
    doc["rows"].sort(key=lambda r: (r["atoms"], r["engine"]))
    doc["runs"] = old.get("runs", []) + [doc["meta"]]
    return doc


def line(r: dict[str, Any]) -> str:
    head = f"{r['engine']:>12} {r['dtype']:>8} {r['atoms']:>10,} {r.get('edges', 0):>12,}"
    if r["status"] != "ok":
        return f"{head}  {r['status'].upper()}: {(r.get('error') or '')[:160]}"
    md = r["md"]["median_ms"]
    reb = r.get("rebuild", {}).get("median_ms")
    gf = r.get("gflops")
    return (
        f"{head} {md:>10.2f} {'-' if reb is None else f'{reb:.2f}':>10} "
        f"{r['md']['repeats']:>4} {_mib(peak_bytes(r)):>9} "
        f"{_mib(r.get('nvml_peak_growth_bytes')):>9} "
        f"{'-' if gf is None else f'{gf:,.0f}':>8} "
        f"{_fmt(r.get('max_abs_dF'), '.1e'):>8}"
    )


HEADER = (
    f"{'engine':>12} {'dtype':>8} {'atoms':>10} {'edges':>12} {'ms (md)':>10} {'ms (rebuild)':>10} "
    f"{'reps':>4} {'peak MiB':>9} {'nvml MiB':>9} {'GFLOP/s':>8} {'max|dF|':>8}"
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--family", default="sevennet", choices=sorted(ENGINES))
    p.add_argument(
        "--model",
        default=None,
        help="sevennet: 7net-0 (default), 7net-l3i5 or an .e3f file; mace: mp0-medium "
        "(default; MACE-MP-0 medium architecture, random weights, mace_models.py), a mace-torch "
        "model file, or an .e3f file (e3fuse and Symmetrix-XL only)",
    )
    p.add_argument("--engines", nargs="+", default=None, help="subset of the family's engines")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES)
    p.add_argument(
        "--grow",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after --sizes, grow by about x2 in atoms until out of memory",
    )
    p.add_argument("--max-atoms", type=int, default=64_000_000)
    p.add_argument("--f64-max-atoms", type=int, default=4000, help="largest e3fuse-f64 case")
    p.add_argument(
        "--reference-max-atoms",
        type=int,
        default=None,
        help="largest case for the non-e3fuse engines (default: until OOM)",
    )
    p.add_argument("--repeats", type=int, default=20, help="timed calls per case (at most)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls first")
    p.add_argument(
        "--budget-s",
        type=float,
        default=15.0,
        help="timed seconds per case: fewer repeats (at least 3) for slow cases",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per case (subprocess)")
    p.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="start no case after this many seconds (write what was measured)",
    )
    p.add_argument(
        "--memory-scaling",
        action="store_true",
        help="e3fuse only: peak memory from 864 atoms up to the largest that fits, "
        "fit a + b*atoms + c*edges",
    )
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "float64"],
        help="--memory-scaling: dtype of e3fuse",
    )
    p.add_argument(
        "--lattices",
        type=float,
        nargs="+",
        default=[3.61, 3.40, 3.95],
        help="--memory-scaling: lattice constants (density varies edges per atom)",
    )
    p.add_argument(
        "--exact-edges-max-atoms",
        type=int,
        default=300_000,
        help="count edges exactly up to this size, estimate per atom beyond",
    )
    p.add_argument(
        "--symmetrix-model",
        type=Path,
        default=None,
        help="Symmetrix-XL JSON (or .json.xz) of the same MACE model",
    )
    p.add_argument(
        "--kinds",
        nargs="+",
        choices=KINDS,
        default=None,
        help="the labelled kinds instead of the growth series: 'model-call' (neighbor list "
        "excluded, positions unchanged) and 'ASE MD step' ('md-step'), both per engine and "
        "size in one process; results in calls_<model>_<gpu>.{json,md} (issue 21)",
    )
    p.add_argument(
        "--e3nn-max-atoms",
        type=int,
        default=4000,
        help="--kinds: largest case for sevenn / mace-torch without cuEquivariance",
    )
    p.add_argument("--models-dir", type=Path, default=HERE / "models")
    p.add_argument("--out-dir", type=Path, default=HERE / "results")
    p.add_argument("--tag", default=None, help="GPU part of result file names (default: GPU name)")
    args = p.parse_args(argv)

    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0

    from e3fuse.bench import gpu_slug
    from e3fuse.modelfile import read_architecture

    models = resolve_models(args)
    if Path(models["e3f"]).is_file():
        arch = read_architecture(models["e3f"])
        work: dict[str, int] | None = cases.model_work_of_file(models["e3f"])
    elif (args.engines or []) == ["symmetrix"]:
        # Symmetrix-XL alone (its carry leaves no room for the 70 MB MACE .e3f): the
        # MACE-MP-0 medium cutoff, no flop count.
        print(f"# {models['e3f']} missing: Symmetrix-XL only, cutoff 6 A, no flop count")
        arch, work = {"cutoff": 6.0, "source": None}, None
    else:
        p.error(f"model file {models['e3f']} does not exist")
    cutoff = float(arch["cutoff"])
    meta = metadata(args.device)
    tag = args.tag or gpu_slug((meta["gpu"] or {}).get("name") if args.device == "cuda" else None)
    edges_of = EdgeCounter(cutoff, args.exact_edges_max_atoms)
    if args.memory_scaling:
        return memory_scaling(args, models, arch, work, meta, tag, edges_of)
    if args.kinds:
        return labelled(args, models, arch, meta, tag, edges_of)

    engines = args.engines or ENGINES[args.family]
    bad = [e for e in engines if e not in ENGINES[args.family]]
    if bad:
        p.error(f"engines {bad} are not among {ENGINES[args.family]}")
    out_path = args.out_dir / f"gpu_{models['label']}_{tag}.json"
    doc: dict[str, Any] = {
        "benchmark": "gpu",
        "family": args.family,
        "label": models["label"],
        "model_file": str(models["e3f"]),
        "model_source": arch.get("source"),
        "cutoff": cutoff,
        "work_per_edge_node": work,
        "meta": meta,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "rows": [],
    }
    gpu_name = (meta["gpu"] or {}).get("name", args.device)
    print(
        f"# {models['label']} on {gpu_name}, commit {meta['commit'][:10]}"
        f"{' (dirty)' if meta['dirty'] else ''}; engines: {' '.join(engines)}",
        flush=True,
    )
    print(HEADER, flush=True)
    stopped: dict[str, str] = {}
    for e in engines:
        why = installed(e)
        if why:
            stopped[e] = why
    t_start = time.monotonic()
    last_wall: dict[str, tuple[int, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in grow_repeats(args.sizes, args.grow, args.max_atoms):
            c = make_case(n)
            if len(stopped) == len(engines):
                break
            edges, edges_method = edges_of(c)
            forces: dict[str, Path] = {}
            for e in engines:
                base = {
                    "engine": e,
                    "dtype": "float64" if e == "e3fuse-f64" else "float32",
                    "atoms": c.num_atoms,
                    "case": c.id,
                    "edges": edges,
                    "edges_method": edges_method,
                    "commit": meta["commit"],
                    "date": meta["date"],
                }
                if e in stopped:
                    if c.num_atoms == min(
                        4 * m**3 for m in grow_repeats(args.sizes, False, args.max_atoms)
                    ):
                        row = {**base, "status": "skipped", "error": stopped[e]}
                        doc["rows"].append(row)
                        print(line(row), flush=True)
                    continue
                limit = (
                    args.f64_max_atoms
                    if e == "e3fuse-f64"
                    else (args.reference_max_atoms if not e.startswith("e3fuse") else None)
                )
                if limit is not None and c.num_atoms > limit:
                    continue
                remaining = None
                if args.deadline_s is not None:
                    remaining = args.deadline_s - (time.monotonic() - t_start)
                    prev = last_wall.get(e)
                    predicted = prev[1] * c.num_atoms / prev[0] if prev else 0.0
                    if remaining <= 0 or predicted > remaining:
                        stopped[e] = "deadline"
                        row = {
                            **base,
                            "status": "skipped",
                            "error": f"--deadline-s {args.deadline_s:.0f} s reached",
                        }
                        doc["rows"].append(row)
                        print(line(row), flush=True)
                        continue
                spec = {
                    "engine": e,
                    "dtype": base["dtype"],
                    "device": args.device,
                    "repeat": n,
                    "lattice": cases.LATTICE_CU,
                    "model": models.get("sevenn_model"),
                    "model_file": str(models["e3f"]),
                    "source": str(models["source"]) if models.get("source") else None,
                    "symmetrix_model": (
                        str(models["symmetrix_model"]) if models.get("symmetrix_model") else None
                    ),
                    "repeats": args.repeats,
                    "warmup": args.warmup,
                    "budget_s": args.budget_s,
                    "forces_out": f"{tmp}/{e}_{n}.npz" if c.num_atoms <= 300_000 else None,
                }
                timeout = (
                    args.timeout
                    if remaining is None
                    else max(60.0, min(args.timeout, remaining + 60))
                )
                res = run_worker(spec, timeout)
                row = {**base, **res}
                if res.get("wall_s"):
                    last_wall[e] = (c.num_atoms, res["wall_s"])
                if row["status"] == "ok":
                    if work is not None:
                        flops = cases.case_work(None, c.num_atoms, edges, work)["model_flops"]
                        row["model_flops"] = flops
                        row["gflops"] = flops / (row["md"]["median_ms"] * 1e-3) / 1e9
                    row["us_per_atom"] = row["md"]["median_ms"] * 1e3 / c.num_atoms
                    if spec["forces_out"] and Path(spec["forces_out"]).is_file():
                        forces[e] = Path(spec["forces_out"])
                    ref = forces.get("e3fuse-f64") or forces.get("e3fuse")
                    if ref is not None and e in forces and forces[e] != ref:
                        a, b = np.load(forces[e]), np.load(ref)
                        row["max_abs_dF"] = float(np.abs(a["forces"] - b["forces"]).max())
                        row["abs_dE_per_atom"] = float(abs(a["energy"] - b["energy"]) / c.num_atoms)
                        row["agreement_against"] = ref.stem.rsplit("_", 1)[0]
                elif row["status"] in ("oom", "timeout", "crashed", "error"):
                    stopped[e] = row["status"]
                doc["rows"].append(row)
                print(line(row), flush=True)
                merged = merged_doc(out_path, doc)
                save(merged, out_path, markdown(merged))
    merged = merged_doc(out_path, doc)
    save(merged, out_path, markdown(merged))
    print(f"# stopped growing: {stopped or 'none'}", flush=True)
    print(f"# wrote {out_path} and {out_path.with_suffix('.md')}", flush=True)
    return 0


# --------------------------------------------------------------------------- labelled kinds
#
# --kinds model-call md-step (issue 21, "Benchmarks that say what they measure"): two
# labelled measurements of every engine in the same run and the same process.
# - "model call": the neighbor list excluded for every engine and the positions unchanged:
#   sevenn's calc.model(data) on an AtomGraphData built once on the CPU and moved to the GPU
#   as SevenNetCalculator.calculate builds it; mace-torch's model(batch, compute_stress=True,
#   training=False) on a Batch built once as MACECalculator builds it (compute_force is on by
#   default); each between torch.cuda.synchronize() calls. A fresh copy of the data goes in
#   before each call, outside the clock (both models write into it). e3fuse:
#   Calculator.calculate on unchanged positions: its neighbor list is kept, the host <-> device
#   copies are included.
# - "ASE MD step": what an ASE loop pays per step: every coordinate moves by N(0, 1e-3 A),
#   then atoms.get_forces(), get_stress() and get_potential_energy() through the attached
#   calculator (sevenn / mace: their graph on the CPU, the copies, the model, the results;
#   e3fuse: its list kept within the skin), between torch.cuda.synchronize() calls.

KINDS = ("model-call", "md-step")


def _model_call(spec: dict[str, Any], calc: Any, atoms: Any) -> tuple[Any, Any]:
    """(prepare, call) of one model call: prepare() (untimed) returns call's argument."""
    from ase.calculators.calculator import all_changes

    engine = spec["engine"]
    if engine.startswith("e3fuse"):
        return (lambda: None), (lambda _: calc.calculate(atoms, PROPERTIES, all_changes))
    if engine.startswith("sevenn"):
        from sevenn.atom_graph_data import AtomGraphData
        from sevenn.train.dataload import unlabeled_atoms_to_graph

        data = AtomGraphData.from_numpy_dict(
            unlabeled_atoms_to_graph(atoms, calc.cutoff, with_shift=False)
        )
        if getattr(calc, "modal", None):
            import sevenn._keys as KEY

            data[KEY.DATA_MODALITY] = calc.modal
        data.to(calc.device)
        return (lambda: data.clone()), (lambda d: calc.model(d))
    if engine.startswith("mace"):
        batch = calc._atoms_to_batch(atoms)  # as MACECalculator.calculate, once
        model = calc.models[0]

        def prepare() -> Any:
            b = calc._clone_batch(batch)
            dtype = next(model.parameters()).dtype
            for key in b.keys:
                if torch_is_float(b[key]):
                    b[key] = b[key].to(dtype=dtype)
            return b.to_dict()

        return prepare, (lambda d: model(d, compute_stress=True, training=False))
    raise ValueError(f"no model call for engine {engine!r}")


def torch_is_float(value: Any) -> bool:
    import torch

    return torch.is_tensor(value) and torch.is_floating_point(value)


def _timed_kind(
    call: Any, prepare: Any, sync: Any, repeats: int, budget_s: float, before: Any = None
) -> list[float]:
    """Wall seconds of up to `repeats` calls (at least 3) between sync() calls; prepare()
    and before() run outside the clock."""
    times: list[float] = []
    spent = 0.0
    while len(times) < repeats and (len(times) < 3 or spent < budget_s):
        if before is not None:
            before()
        arg = prepare()
        sync()
        t0 = time.perf_counter()
        call(arg)
        sync()
        dt_ = time.perf_counter() - t0
        times.append(dt_)
        spent += dt_
    return times


def labelled_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Both kinds for one engine at each size of spec["sizes"] (repeats n, ascending), in one
    process (one model load for all sizes); a size that fails ends the series."""
    from e3fuse.bench import is_out_of_memory

    out: dict[str, Any] = {"status": "ok", "sizes": []}
    try:
        t0 = time.perf_counter()
        env = _setup(spec)
        out["setup_s"] = time.perf_counter() - t0
    except Exception as err:  # noqa: BLE001 - classified and reported to the driver
        out["status"] = "oom" if is_out_of_memory(err) else "error"
        out["error"] = f"{type(err).__name__}: {err}"[:2000]
        return out
    calc = env["calc"]
    # e3fuse returns host arrays: its call is over when it returns
    sync = _torch_sync if env.get("torch") else (lambda: None)
    for n in spec["sizes"]:
        atoms = cases.build_atoms(make_case(n, spec["lattice"]))
        result: dict[str, Any] = {"repeat": n, "status": "ok", **env.get("info", {})}
        out["sizes"].append(result)
        try:
            if env.get("torch") and spec["device"] == "cuda":
                import torch

                torch.cuda.reset_peak_memory_stats()
            atoms.calc = calc
            rng = np.random.default_rng(7)

            def md_step(_: Any, atoms: Any = atoms) -> None:
                # forces first, as ASE's integrators ask: one evaluation gives all three
                atoms.get_forces()
                atoms.get_stress()
                atoms.get_potential_energy()

            def displace(atoms: Any = atoms, rng: Any = rng) -> None:
                atoms.positions += rng.normal(0.0, MD_DISPLACEMENT, size=atoms.positions.shape)

            for kind in spec["kinds"]:
                if kind == "model-call":
                    prepare, call = _model_call(spec, calc, atoms)
                    before = None
                else:
                    prepare, call, before = (lambda: None), md_step, displace
                t0 = time.perf_counter()
                for _ in range(max(1, spec["warmup"])):
                    if before is not None:
                        before()
                    call(prepare())
                sync()
                result.setdefault("warmup_s", {})[kind] = time.perf_counter() - t0
                result[kind] = _stats(
                    _timed_kind(call, prepare, sync, spec["repeats"], spec["budget_s"], before)
                )
            nl = getattr(calc, "neighbors", None)
            if getattr(nl, "num_builds", None) is not None:
                result["neighbor_builds"] = int(nl.num_builds)
                result["edges_in_list"] = int(nl.num_edges)
        except Exception as err:  # noqa: BLE001 - classified and reported to the driver
            result["status"] = "oom" if is_out_of_memory(err) else "error"
            result["error"] = f"{type(err).__name__}: {err}"[:2000]
        if env.get("torch") and spec["device"] == "cuda":
            import torch

            result["torch_max_memory_allocated"] = int(torch.cuda.max_memory_allocated())
        atoms.calc = None
        print(json.dumps(out), flush=True)  # what is measured so far (run_worker on timeout)
        if result["status"] != "ok":
            break
    return out


def labelled_markdown(doc: dict[str, Any]) -> str:
    meta = doc["meta"]
    gpu = (meta.get("gpu") or {}).get("name", meta["device"])
    rows = doc["rows"]
    engines = [e for e in ENGINES[doc["family"]] if any(r["engine"] == e for r in rows)]
    sizes = sorted({r["atoms"] for r in rows})
    by = {(r["engine"], r["atoms"]): r for r in rows}
    titles = {"model-call": "model call", "md-step": "ASE MD step"}
    kinds = doc.get("kinds", list(titles))  # --kinds (files from before the field: both)
    out = [
        f"# {doc['label']} on {gpu}: " + " and ".join(titles[k] for k in kinds),
        "",
        f"commit {meta['commit'][:10]}{' (dirty)' if meta['dirty'] else ''}, {meta['date']}, "
        f"`{meta['command']}`. Median ms per call, float32, energy + forces + stress, rattled "
        "fcc Cu. **model call**: neighbor list excluded for every engine, positions unchanged "
        "(sevenn: calc.model(data) on an AtomGraphData built once; mace-torch: model(batch, "
        "compute_stress=True, training=False) on a Batch built once; e3fuse: "
        "Calculator.calculate, its list kept, host<->device copies included). **ASE MD step**: "
        "positions displaced, then energy, forces and stress through the ASE calculator "
        "(neighbor list, data conversion and copies included). `-cueq`: cuEquivariance enabled.",
        "",
    ]
    for kind in kinds:
        out += [
            f"## {titles[kind]}",
            "",
            "| atoms | edges | " + " | ".join(engines) + " | e3fuse speedup |",
            "|---:|---:|" + "---:|" * len(engines) + "---|",
        ]
        for n in sizes:
            cells, speed = [], []
            e3 = by.get(("e3fuse", n))
            e3_ms = e3[kind]["median_ms"] if e3 and e3.get("status") == "ok" else None
            for e in engines:
                r = by.get((e, n))
                if r is None:
                    cells.append("-")
                elif r["status"] != "ok" or kind not in r:
                    cells.append(r["status"])
                else:
                    ms = r[kind]["median_ms"]
                    cells.append(f"{ms:,.2f}")
                    if e3_ms and not e.startswith("e3fuse"):
                        speed.append(f"{e} {ms / e3_ms:.1f}x")
            edges = next((r.get("edges", 0) for r in rows if r["atoms"] == n), 0)
            out.append(
                f"| {n:,} | {edges:,} | " + " | ".join(cells) + f" | {', '.join(speed) or '-'} |"
            )
        out.append("")
    bad = [r for r in rows if r["status"] != "ok"]
    if bad:
        out += ["Not measured / failed:", ""]
        out += [
            f"- {r['engine']} at {r['atoms']:,}: {r['status']}: {r.get('error', '')[:200]}"
            for r in bad
        ]
    return "\n".join(out) + "\n"


def labelled(
    args: argparse.Namespace,
    models: dict[str, Any],
    arch: dict[str, Any],
    meta: dict[str, Any],
    tag: str,
    edges_of: Any,
) -> int:
    """--kinds: the labelled kinds for each engine and size, one process per engine x size."""
    cueq = f"{'sevenn' if args.family == 'sevennet' else 'mace'}-cueq"
    e3nn = "sevenn" if args.family == "sevennet" else "mace"
    engines = args.engines or ["e3fuse", cueq, e3nn]
    bad = [e for e in engines if e not in ENGINES[args.family] or e == "symmetrix"]
    if bad:
        raise SystemExit(f"--kinds: engines {bad} are not among the family's torch engines")
    out_path = args.out_dir / f"calls_{models['label']}_{tag}.json"
    doc: dict[str, Any] = {
        "benchmark": "gpu-labelled",
        "kinds": list(args.kinds),
        "family": args.family,
        "label": models["label"],
        "model_file": str(models["e3f"]),
        "cutoff": float(arch["cutoff"]),
        "meta": meta,
        "rows": [],
    }
    print(f"# {models['label']}: {' '.join(args.kinds)}; engines {' '.join(engines)}", flush=True)
    t_start = time.monotonic()
    ns = grow_repeats(args.sizes, False, args.max_atoms)
    counted = {n: edges_of(make_case(n)) for n in ns}
    for e in engines:
        limit = args.e3nn_max_atoms if e in ("sevenn", "mace") else None
        if e == "e3fuse-f64":
            limit = args.f64_max_atoms
        why = installed(e)
        if why is None and args.deadline_s is not None:
            if time.monotonic() - t_start > args.deadline_s:
                why = f"--deadline-s {args.deadline_s:.0f} s reached"
        run_ns = [n for n in ns if limit is None or 4 * n**3 <= limit]
        res: dict[str, Any] = {"status": "skipped", "error": why, "sizes": []}
        if why is None and run_ns:
            spec = {
                "engine": e,
                "dtype": "float64" if e == "e3fuse-f64" else "float32",
                "device": args.device,
                "sizes": run_ns,
                "lattice": cases.LATTICE_CU,
                "model": models.get("sevenn_model"),
                "model_file": str(models["e3f"]),
                "source": str(models["source"]) if models.get("source") else None,
                "repeats": args.repeats,
                "warmup": args.warmup,
                "budget_s": args.budget_s,
                "kinds": list(args.kinds),
            }
            timeout = args.timeout
            if args.deadline_s is not None:  # the deadline also bounds a running worker
                timeout = max(30.0, min(timeout, args.deadline_s - (time.monotonic() - t_start)))
            res = run_worker(spec, timeout)
        done = {r["repeat"]: r for r in res.get("sizes", [])}
        for n in ns:
            c = make_case(n)
            row: dict[str, Any] = {
                "engine": e,
                "dtype": "float64" if e == "e3fuse-f64" else "float32",
                "atoms": c.num_atoms,
                "case": c.id,
                "edges": counted[n][0],
                "edges_method": counted[n][1],
                "commit": meta["commit"],
                "gpu": (meta.get("gpu") or {}).get("name"),
                "command": meta["command"],
                "date": meta["date"],
                "setup_s": res.get("setup_s"),
            }
            if n in done:
                row.update(done[n])
            elif n not in run_ns:
                row.update(status="skipped", error=f"above {limit:,} atoms for {e}")
            else:
                row.update(status=res["status"] if res["status"] != "ok" else "skipped")
                row["error"] = res.get("error") or "not reached (an earlier size failed)"
            doc["rows"].append(row)
            if row["status"] == "ok":
                print(
                    f"{e:>12} {c.num_atoms:>8,} "
                    + " ".join(f"{k} {row[k]['median_ms']:9.2f} ms" for k in args.kinds),
                    flush=True,
                )
            else:
                print(f"{e:>12} {c.num_atoms:>8,} {row['status']}: {row.get('error', '')[:160]}")
        save(doc, out_path, labelled_markdown(doc))
    save(doc, out_path, labelled_markdown(doc))
    print(f"# wrote {out_path} and {out_path.with_suffix('.md')}", flush=True)
    return 0


# --------------------------------------------------------------------------- memory scaling


def fit_memory(rows: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    """Least squares peak = a + b * atoms + c * edges over the rows that have `key`."""
    pts = [(r["atoms"], r["edges"], r[key]) for r in rows if r.get(key) is not None]
    if len(pts) < 3:
        return None
    m = np.array([[1.0, a, e] for a, e, _ in pts])
    y = np.array([float(v) for _, _, v in pts])
    coef, *_ = np.linalg.lstsq(m, y, rcond=None)
    pred = m @ coef
    rel = np.abs(pred - y) / np.maximum(y, 1.0)
    return {
        "quantity": key,
        "points": len(pts),
        "a_bytes": float(coef[0]),
        "bytes_per_atom": float(coef[1]),
        "bytes_per_edge": float(coef[2]),
        "max_rel_residual": float(rel.max()),
        "condition": float(np.linalg.cond(m / np.maximum(np.abs(m).max(axis=0), 1.0))),
    }


def memory_scaling(
    args: argparse.Namespace,
    models: dict[str, Any],
    arch: dict[str, Any],
    work: dict[str, int],
    meta: dict[str, Any],
    tag: str,
    edges_of: Any,
) -> int:
    from e3fuse.bench import repeats_for

    out_path = args.out_dir / f"memory_{models['label']}_{tag}.json"
    ns = repeats_for(args.max_atoms)
    doc: dict[str, Any] = {
        "benchmark": "memory-scaling",
        "family": args.family,
        "label": models["label"],
        "model_file": str(models["e3f"]),
        "dtype": args.dtype,
        "cutoff": arch["cutoff"],
        "meta": meta,
        "rows": [],
    }
    print(
        f"# memory scaling: e3fuse {args.dtype}, {models['label']} on "
        f"{(meta['gpu'] or {}).get('name', args.device)}, lattices {args.lattices}",
        flush=True,
    )
    print(
        f"{'atoms':>10} {'a (A)':>6} {'edges':>14} {'e3fuse MiB':>11} {'nvml MiB':>9} "
        f"{'B/atom':>8} {'ms':>9}",
        flush=True,
    )
    t_start = time.monotonic()
    stop = None
    for n in ns:
        for lat in args.lattices:
            if args.deadline_s is not None and time.monotonic() - t_start > args.deadline_s:
                stop = "deadline"
                break
            c = make_case(n, lat)
            edges, method = edges_of(c)
            spec = {
                "engine": "e3fuse",
                "dtype": args.dtype,
                "device": args.device,
                "repeat": n,
                "lattice": lat,
                "model_file": str(models["e3f"]),
                "repeats": 3,
                "warmup": 1,
                "budget_s": 5.0,
                "rebuild_series": False,
            }
            res = run_worker(spec, args.timeout)
            row = {
                "atoms": c.num_atoms,
                "lattice": lat,
                "edges": edges,
                "edges_method": method,
                **res,
            }
            doc["rows"].append(row)
            if res["status"] != "ok":
                print(
                    f"{c.num_atoms:>10,} {lat:>6.2f} {edges:>14,}  {res['status'].upper()}: "
                    f"{(res.get('error') or '')[:120]}",
                    flush=True,
                )
                stop = f"{res['status']} at {c.num_atoms} atoms (a = {lat})"
                break
            pk = res.get("e3fuse_device_bytes_peak")
            if args.device == "cpu":
                pk = None
            print(
                f"{c.num_atoms:>10,} {lat:>6.2f} {edges:>14,} {_mib(pk):>11} "
                f"{_mib(res.get('nvml_peak_growth_bytes')):>9} "
                f"{'-' if pk is None else f'{pk / c.num_atoms:,.0f}':>8} "
                f"{res['md']['median_ms']:>9.2f}",
                flush=True,
            )
            save(doc, out_path, None)
        if stop:
            break
    ok = [r for r in doc["rows"] if r["status"] == "ok"]
    doc["stopped"] = stop
    doc["fits"] = [
        f
        for f in (
            fit_memory(ok, "e3fuse_device_bytes_peak"),
            fit_memory(ok, "nvml_peak_growth_bytes"),
        )
        if f
    ]
    lines = [
        f"# Memory scaling: e3fuse {args.dtype}, {models['label']} on "
        f"{(meta['gpu'] or {}).get('name', args.device)}",
        "",
        f"commit {meta['commit'][:10]}{' (dirty)' if meta['dirty'] else ''}, {meta['date']}; "
        f"energy+forces+stress; growth stopped: {stop or 'max atoms reached'}",
        "",
        "| atoms | a (A) | edges | e3fuse peak MiB | NVML growth MiB | bytes/atom | ms |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in ok:
        pk = r.get("e3fuse_device_bytes_peak")
        lines.append(
            f"| {r['atoms']:,} | {r['lattice']:.2f} | {r['edges']:,} | {_mib(pk)} | "
            f"{_mib(r.get('nvml_peak_growth_bytes'))} | "
            f"{_fmt(pk / r['atoms'] if pk else None, ',.0f')} | "
            f"{r['md']['median_ms']:,.2f} |"
        )
    lines += ["", "Least-squares fit peak = a + b * atoms + c * edges:", ""]
    for f in doc["fits"]:
        epa = ok[-1]["edges"] / ok[-1]["atoms"]
        per_atom = f["bytes_per_atom"] + f["bytes_per_edge"] * epa
        fits_80 = (80e9 - f["a_bytes"]) / per_atom if per_atom > 0 else float("inf")
        f["bytes_per_atom_at_a361"] = per_atom
        f["atoms_in_80GB"] = fits_80
        lines.append(
            f"- {f['quantity']}: a = {f['a_bytes'] / 2**20:,.1f} MiB, "
            f"b = {f['bytes_per_atom']:,.0f} B/atom, c = {f['bytes_per_edge']:,.1f} B/edge "
            f"({f['points']} points, max relative residual {f['max_rel_residual']:.1%}); "
            f"{per_atom:,.0f} B per atom at {epa:.0f} edges/atom -> "
            f"{fits_80 / 1e6:,.1f} M atoms in 80 GB"
        )
    save(doc, out_path, "\n".join(lines) + "\n")
    print("\n".join(lines[-len(doc["fits"]) - 1 :]), flush=True)
    print(f"# wrote {out_path} and {out_path.with_suffix('.md')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
