"""A/B of the CUDA graphs of compute_system (E3FUSE_CUDA_GRAPH=1, the default, against 0):
the model-call time of the ASE calculator on small systems, where launches dominate.

Per model and setting, a subprocess (the switch is read from its environment) builds
e3fuse.Calculator(device="cuda", dtype=float32) on the rattled fcc Cu case of --atoms
(cases.py; 864 atoms by default), warms up, then times --calls calls of
calc.calculate(atoms, ["energy", "forces", "stress"]) for each kind:
  model-call  positions unchanged (issue 21's "model call": the neighbor list is kept, the
              host <-> device copies are included)
  md-step     every coordinate moved by N(0, 1e-3 A) before each call (outside the clock):
              the list is kept within its skin, so the graph is still replayed
Settings alternate (off, on, off, on, ...) over --rounds rounds; the table gives the median
of the per-round medians and the calls that replayed a graph.

  python benchmarks/cuda_graph_ab.py                      # 7net-0, 7net-l3i5, mp0-medium
  python benchmarks/cuda_graph_ab.py --models 7net-0 --atoms 864 4000 --json out.json

Models: SevenNet pretrained names (converted once with sevenn into --models-dir) or MACE
architecture names of mace_models.py (random weights), or .e3f files.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent / "python"))  # only where no built e3fuse is importable

PROPERTIES = ["energy", "forces", "stress"]
KINDS = ("model-call", "md-step")


def model_path(name: str, models_dir: Path) -> Path:
    """The .e3f file of `name`: a file, a MACE architecture of mace_models.py or a SevenNet
    pretrained name."""
    if name.endswith(".e3f"):
        return Path(name)
    import mace_models

    if name in mace_models.HIDDEN:
        return mace_models.model_files(name, models_dir)[1]
    # a SevenNet pretrained name, converted once (not through bench_cpu, whose import puts the
    # source tree's python/ first on sys.path, before the built package)
    path = models_dir / f"{name}.e3f"
    if not path.exists():
        from e3fuse import cli

        models_dir.mkdir(parents=True, exist_ok=True)
        if cli.main(["convert", "sevennet", name, "-o", str(path)]) != 0:
            raise RuntimeError(f"converting {name} failed")
    return path


def worker(path: str, atoms_count: int, calls: int, warmup: int, device: str) -> dict[str, Any]:
    """Times the calls in this process (E3FUSE_CUDA_GRAPH as set by the parent)."""
    import cases
    import numpy as np
    from ase.calculators.calculator import all_changes

    import e3fuse

    atoms = cases.build_atoms(cases.case_for_size(atoms_count))
    calc = e3fuse.Calculator(path, device=device, dtype="float32")
    result: dict[str, Any] = {"atoms": len(atoms), "device": calc.engine.describe()}
    rng = np.random.default_rng(7)
    for kind in KINDS:
        before = int(calc.engine.num_graph_replays)
        times = []
        for q in range(warmup + calls):
            if kind == "md-step":
                atoms.positions += rng.normal(0.0, 1e-3, size=atoms.positions.shape)
            t0 = time.perf_counter()
            calc.calculate(atoms, PROPERTIES, all_changes)
            elapsed = time.perf_counter() - t0
            if q >= warmup:
                times.append(elapsed)
        result[kind] = {
            "median_ms": 1e3 * statistics.median(times),
            "p10_ms": 1e3 * float(np.percentile(times, 10)),
            "p90_ms": 1e3 * float(np.percentile(times, 90)),
            "replays": int(calc.engine.num_graph_replays) - before,
            "calls": warmup + calls,
        }
    result["neighbor_builds"] = int(calc.neighbors.num_builds)
    return result


def run_worker(path: Path, graphs: bool, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ, E3FUSE_CUDA_GRAPH="1" if graphs else "0")
    command = [sys.executable, __file__, "--worker", str(path)]
    command += ["--atoms", str(args.atoms[0]), "--calls", str(args.calls)]
    command += ["--warmup", str(args.warmup), "--device", args.device]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        raise RuntimeError(f"worker failed ({path}, graphs={graphs}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="+", default=["7net-0", "7net-l3i5", "mp0-medium"])
    p.add_argument("--atoms", type=int, nargs="+", default=[864])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--device", default="cuda", help="cpu: only to try the script")
    p.add_argument("--models-dir", type=Path, default=HERE / "models")
    p.add_argument("--json", type=Path, help="write the rows here as well")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.atoms[0], args.calls, args.warmup, args.device)))
        return 0

    rows = []
    header = f"{'model':<16}{'atoms':>7}  {'kind':<11}{'graphs off':>12}{'on':>12}{'speed-up':>10}"
    print(header + f"{'replays':>11}  engine", flush=True)
    for name in args.models:
        path = model_path(name, args.models_dir)
        for atoms in args.atoms:
            sub = argparse.Namespace(**{**vars(args), "atoms": [atoms]})
            runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
            for _ in range(args.rounds):
                for graphs in (False, True):
                    runs[graphs].append(run_worker(path, graphs, sub))
            for kind in KINDS:
                off = statistics.median(r[kind]["median_ms"] for r in runs[False])
                on = statistics.median(r[kind]["median_ms"] for r in runs[True])
                replays = runs[True][-1][kind]["replays"]
                calls = runs[True][-1][kind]["calls"]
                device = runs[True][-1]["device"]
                label = Path(name).stem
                print(
                    f"{label:<16}{atoms:>7}  {kind:<11}{off:>9.3f} ms{on:>9.3f} ms{off / on:>9.2f}x"
                    f"{replays:>6}/{calls:<4}  {device}",
                    flush=True,
                )
                rows.append(
                    {
                        "model": name,
                        "atoms": atoms,
                        "kind": kind,
                        "graphs_off_ms": off,
                        "graphs_on_ms": on,
                        "replays": replays,
                        "calls": calls,
                        "device": device,
                        "runs": {"off": runs[False], "on": runs[True]},
                    }
                )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
