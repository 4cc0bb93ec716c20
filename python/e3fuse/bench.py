"""`e3fuse bench scaling`: how time per MD step and memory grow with the system size.

Rattled fcc copper supercells (a = 3.61 A) grow from 864 atoms (6^3 cubic cells) by
about x2 in atoms (4000, 32000, then n -> n * 2^(1/3)) until the device runs out of
memory or a limit (--max-atoms, --time-limit-s) is reached. For each size the calculator
runs K MD-like steps: every atom moves by a small random displacement per step, so that
the steps exercise the neighbor-list reuse path (the list is rebuilt only when an atom
has moved more than skin / 2) as molecular dynamics does. One row per size is printed
as soon as it is measured: atoms, directed edges in the neighbor list, ms per step
(median of the K steps), atom-steps per second, and peak memory (device memory held by
e3fuse on a GPU; growth of the host's resident set on the CPU).

The helpers here (memory probes, out-of-memory detection) are also used by
benchmarks/bench_gpu.py.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

LATTICE_CU = 3.61  # Angstrom
RATTLE = 0.05  # Angstrom, initial displacement of every coordinate
PROPERTIES = ["energy", "forces", "stress"]

# Substrings of error messages that mean "the device (or host) ran out of memory".
_OOM_MARKERS = (
    "out of memory",
    "outofmemory",
    "cudaerrormemoryallocation",
    "cuda_error_out_of_memory",
    "cublas_status_alloc_failed",
    "std::bad_alloc",
    "bad_alloc",
    "failed to allocate",
    "memoryerror",
    "hiperroroutofmemory",
)


def is_out_of_memory(err: BaseException | str) -> bool:
    """True for the errors that CUDA, torch, e3fuse or the host raise when memory runs out."""
    if isinstance(err, MemoryError):
        return True
    text = err if isinstance(err, str) else f"{type(err).__name__}: {err}"
    text = text.lower().replace(" ", "")
    return any(m.replace(" ", "") in text for m in _OOM_MARKERS)


# --------------------------------------------------------------------------- sizes


def repeats_for(max_atoms: int, start: int = 6) -> list[int]:
    """n (cubic 4-atom cells per side) of the default sizes: 864 (6), 4000 (10), 32000 (20),
    then about x2 in atoms per step (n * 2^(1/3), rounded) up to max_atoms = 4 n^3."""
    ns = [n for n in (6, 10, 20) if n >= start]
    if not ns:
        ns = [start]
    k = 1
    while True:
        n = round(20 * 2 ** (k / 3))
        if 4 * n**3 > max_atoms:
            break
        if n > ns[-1]:
            ns.append(n)
        k += 1
    return [n for n in ns if 4 * n**3 <= max_atoms]


def cu_supercell(repeat: int, lattice: float = LATTICE_CU, rattle: float = RATTLE, seed: int = 0):
    """Cubic fcc Cu repeated `repeat`^3 times (4 repeat^3 atoms), rattled with a fixed seed."""
    from ase.build import bulk

    atoms = bulk("Cu", "fcc", a=lattice, cubic=True).repeat((repeat,) * 3)
    rng = np.random.default_rng(seed + len(atoms))
    atoms.positions += rng.normal(0.0, rattle, size=atoms.positions.shape)
    atoms.wrap()
    return atoms


# --------------------------------------------------------------------------- memory


def host_status() -> dict[str, int]:
    """VmRSS and VmHWM of this process in bytes (Linux; empty elsewhere)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmRSS", "VmHWM")):
                    key, value = line.split(":")
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def reset_host_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def e3fuse_device_bytes() -> tuple[int | None, int | None]:
    """(in use, peak) device bytes held by e3fuse's arrays; (None, None) where the core
    has no such counters (an older build)."""
    from . import _core

    eng = _core.Engine
    try:
        return int(eng.device_bytes_in_use()), int(eng.device_bytes_peak())
    except AttributeError:
        return None, None


def e3fuse_reset_device_peak() -> None:
    from . import _core

    reset = getattr(_core.Engine, "reset_device_bytes_peak", None)
    if reset is not None:
        reset()


class DeviceMemorySampler:
    """Device memory in use on GPU 0 as the driver reports it (NVML, all processes): a
    background thread samples it every `interval_s` between start() and stop(), so that
    peaks inside a call are seen (to within the sampling interval). Inactive (all None)
    where pynvml or a GPU is missing."""

    def __init__(self, index: int = 0, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self._handle: Any = None
        self._nvml: Any = None
        self.baseline: int | None = None
        self.peak: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._nvml = pynvml
        except Exception:  # noqa: BLE001 - no NVML, no GPU: the sampler stays inactive
            self._handle = None

    @property
    def active(self) -> bool:
        return self._handle is not None

    def used(self) -> int | None:
        if not self.active:
            return None
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def start(self) -> None:
        if not self.active:
            return
        self.baseline = self.used()
        self.peak = self.baseline
        self._stop.clear()

        def loop() -> None:
            while not self._stop.is_set():
                u = self.used()
                if u is not None and (self.peak is None or u > self.peak):
                    self.peak = u
                time.sleep(self.interval_s)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, int | None]:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        growth = None
        if self.peak is not None and self.baseline is not None:
            growth = self.peak - self.baseline
        return {
            "nvml_baseline_bytes": self.baseline,
            "nvml_peak_bytes": self.peak,
            "nvml_peak_growth_bytes": growth,
        }


def gpu_info() -> dict[str, Any] | None:
    """Name, memory and driver of GPU 0 from nvidia-smi; None without one."""
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,memory.total,driver_version,uuid",
                "--format=csv,noheader,nounits",
                "-i",
                "0",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if not out:
        return None
    name, mem, driver, uuid = (x.strip() for x in out.split(",")[:4])
    return {
        "name": name,
        "memory_total_bytes": int(float(mem)) * 2**20,
        "driver": driver,
        "uuid": uuid,
    }


def gpu_slug(name: str | None) -> str:
    """A file-name part from a GPU name: 'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3'."""
    if not name:
        return "cpu"
    s = "".join(c if c.isalnum() else "-" for c in name.lower())
    s = "-".join(p for p in s.split("-") if p and p != "nvidia")
    return s or "gpu"


# --------------------------------------------------------------------------- scaling run


def _edges_in_list(calc: Any) -> int | None:
    nl = getattr(calc, "neighbors", None)
    edges = getattr(nl, "num_edges", None)
    return int(edges) if edges is not None else None


def _builds(calc: Any) -> int | None:
    nl = getattr(calc, "neighbors", None)
    builds = getattr(nl, "num_builds", None)
    return int(builds) if builds is not None else None


def measure_size(
    model: str,
    repeat: int,
    device: str,
    dtype: str,
    steps: int,
    skin: float,
    displacement: float,
    seed: int = 0,
    radial: str = "auto",
    region_atoms: int = 0,
) -> dict[str, Any]:
    """One size: build the supercell and a fresh calculator, one warm-up step, then `steps`
    timed MD-like steps (every coordinate moved by N(0, displacement) before each)."""
    from .calculator import Calculator

    atoms = cu_supercell(repeat, seed=seed)
    n = len(atoms)
    rng = np.random.default_rng(seed + 1)
    gc.collect()
    on_gpu = device == "cuda"
    rss0 = host_status().get("VmRSS", 0)
    host_reset = reset_host_peak()
    if on_gpu:
        e3fuse_reset_device_peak()
    calc = Calculator(
        model, device=device, dtype=dtype, skin=skin, radial=radial, region_atoms=region_atoms
    )
    try:
        t0 = time.perf_counter()
        calc.calculate(atoms, PROPERTIES)
        warmup_s = time.perf_counter() - t0
        builds0 = _builds(calc)
        times = []
        for _ in range(steps):
            atoms.positions += rng.normal(0.0, displacement, size=atoms.positions.shape)
            t0 = time.perf_counter()
            calc.calculate(atoms, PROPERTIES)
            times.append(time.perf_counter() - t0)
        energy = float(calc.results["energy"])
        edges = _edges_in_list(calc)
        builds = _builds(calc)
        regions = int(calc.engine.num_regions)
    finally:
        del calc
        gc.collect()
    med = float(np.median(times))
    row: dict[str, Any] = {
        "atoms": n,
        "repeat": repeat,
        "edges_in_list": edges,
        "ms_per_step": med * 1e3,
        "ms_min": float(min(times)) * 1e3,
        "ms_max": float(max(times)) * 1e3,
        "atom_steps_per_s": n / med,
        "us_per_atom_step": med / n * 1e6,
        "warmup_s": warmup_s,
        "steps": steps,
        "neighbor_builds_during_steps": (
            builds - builds0 if builds is not None and builds0 is not None else None
        ),
        "energy_per_atom": energy / n,
        "regions": regions,
    }
    if on_gpu:
        in_use, peak = e3fuse_device_bytes()
        row["peak_bytes"] = peak
        row["peak_kind"] = "device (e3fuse arrays)"
        row["device_bytes_in_use_after"] = in_use
    else:
        st = host_status()
        row["peak_bytes"] = st["VmHWM"] - rss0 if host_reset and "VmHWM" in st else None
        row["peak_kind"] = "host RSS growth"
    return row


HEADER = (
    f"{'atoms':>10} {'edges':>12} {'ms/step':>10} {'atom-steps/s':>13} {'us/atom':>8} "
    f"{'peak MiB':>9} {'builds':>6} {'regions':>7}"
)


def format_row(r: dict[str, Any]) -> str:
    edges = "-" if r.get("edges_in_list") is None else f"{r['edges_in_list']:,}"
    peak = "-" if r.get("peak_bytes") is None else f"{r['peak_bytes'] / 2**20:.1f}"
    builds = r.get("neighbor_builds_during_steps")
    return (
        f"{r['atoms']:>10,} {edges:>12} {r['ms_per_step']:>10.2f} "
        f"{r['atom_steps_per_s']:>13,.0f} {r['us_per_atom_step']:>8.2f} {peak:>9} "
        f"{'-' if builds is None else builds:>6} {r.get('regions', 1):>7}"
    )


def plot_scaling(rows: list[dict[str, Any]], path: str | Path, title: str, mem_label: str) -> bool:
    """Two log-log panels (ms per step, peak memory against atoms); False if matplotlib
    is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    atoms = [r["atoms"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.loglog(atoms, [r["ms_per_step"] for r in rows], "o-")
    ax1.set_xlabel("atoms")
    ax1.set_ylabel("ms per step")
    ax1.set_title("time per MD step")
    ax1.grid(True, which="both", alpha=0.3)
    mem = [(r["atoms"], r["peak_bytes"] / 2**20) for r in rows if r.get("peak_bytes")]
    if mem:
        ax2.loglog([a for a, _ in mem], [m for _, m in mem], "s-", color="C1")
    ax2.set_xlabel("atoms")
    ax2.set_ylabel(f"peak {mem_label} (MiB)")
    ax2.set_title("peak memory")
    ax2.grid(True, which="both", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def metadata(model: str, device: str, dtype: str, radial: str = "auto") -> dict[str, Any]:
    from . import __version__, _core

    gpu = gpu_info() if device == "cuda" else None
    return {
        "model": str(model),
        "model_family": _core.Model.load(str(model)).family,
        "device": device,
        "dtype": dtype,
        "radial": radial,
        "gpu": gpu,
        "cpu": platform.processor() or platform.machine(),
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "e3fuse": __version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def run_scaling(
    model: str,
    device: str = "cuda",
    dtype: str = "float32",
    sizes: list[int] | None = None,
    max_atoms: int | None = None,
    steps: int = 10,
    skin: float = 0.5,
    displacement: float = 0.01,
    time_limit_s: float | None = None,
    plot: str | None = None,
    json_out: str | None = None,
    echo: Callable[[str], None] = print,
    radial: str = "auto",
    region_atoms: int = 0,
) -> list[dict[str, Any]]:
    """Grow the supercell until out of memory, `max_atoms` or `time_limit_s`; one row per size."""
    until_regions = False
    if sizes:
        repeats = []
        for s in sizes:
            n = round((s / 4) ** (1 / 3))
            if 4 * n**3 != s:
                raise ValueError(f"size {s} is not 4 n^3 (cubic fcc supercell); try {4 * n**3}")
            repeats.append(n)
    else:
        # default growth: up to the first size that one pass no longer holds (regions)
        until_regions = max_atoms is None
        if max_atoms is None:
            max_atoms = 64_000_000 if device == "cuda" else 4000
        repeats = repeats_for(max_atoms)
    meta = metadata(model, device, dtype, radial)
    gpu = meta["gpu"]["name"] if meta["gpu"] else None
    mem_label = "device memory" if device == "cuda" else "host RSS growth"
    echo(
        f"# e3fuse bench scaling: {model} ({meta['model_family']}), {device}"
        f"{' ' + gpu if gpu else ''}, {dtype}, radial {radial}, {steps} steps per size, "
        f"displacement {displacement} A/step, skin {skin} A"
    )
    echo(HEADER)
    rows: list[dict[str, Any]] = []
    stopped = None
    t_start = time.perf_counter()
    for n in repeats:
        if time_limit_s is not None and rows:
            # the next size costs about (atoms ratio) x the last one's wall time
            last = rows[-1]
            predicted = last["wall_s"] * (4 * n**3) / last["atoms"]
            if time.perf_counter() - t_start + predicted > time_limit_s:
                stopped = f"time limit ({time_limit_s:.0f} s) before {4 * n**3:,} atoms"
                break
        t0 = time.perf_counter()
        try:
            row = measure_size(
                model,
                n,
                device,
                dtype,
                steps,
                skin,
                displacement,
                radial=radial,
                region_atoms=region_atoms,
            )
        except Exception as err:  # noqa: BLE001 - report and stop growing
            if is_out_of_memory(err):
                stopped = f"out of memory at {4 * n**3:,} atoms ({type(err).__name__}: {err})"
            else:
                stopped = f"error at {4 * n**3:,} atoms: {type(err).__name__}: {err}"
            break
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        echo(format_row(row))
        if until_regions and row.get("regions", 1) > 1:
            stopped = (
                f"{row['atoms']:,} atoms already needed {row['regions']} regions "
                "(pass --max-atoms to grow further)"
            )
            break
    if stopped:
        echo(f"# stopped: {stopped}")
    doc = {
        "meta": meta,
        "steps": steps,
        "skin": skin,
        "displacement": displacement,
        "stopped": stopped,
        "rows": rows,
    }
    if json_out:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(json.dumps(doc, indent=1) + "\n")
        echo(f"# wrote {json_out}")
    if plot:
        if not rows:
            echo("# nothing measured: no plot")
        else:
            title = f"{Path(model).name}: {device}{' ' + gpu if gpu else ''}, {dtype}"
            if plot_scaling(rows, plot, title, mem_label):
                echo(f"# wrote {plot}")
            else:
                echo("# matplotlib is not installed: no plot (pip install matplotlib)")
    return rows
