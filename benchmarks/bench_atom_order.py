"""Model call of e3fuse on the same system in two atom orders: the lattice's and shuffled.

Atoms in no spatial order (an amorphous structure from a packing tool, a liquid built molecule
by molecule, a shuffled supercell) make the convolution's concurrent thread blocks gather
neighbor rows from all over the system unless the engine runs the rows in a spatial order
(DeviceState::spatial_rows in kernels/src/cuda/engine_cuda.cu). Per model file and size: the
rattled fcc Cu case of benchmarks/cases.py, then the same atoms under a fixed permutation; the
median wall-clock ms of Calculator.calculate on unchanged positions (the "model call" of
bench_gpu.py --kinds), and the largest difference of the forces (permuted back) and of the
energy per atom between the two orders.

  python benchmarks/bench_atom_order.py benchmarks/models/7net-0.e3f --sizes 864 32000
  python benchmarks/bench_atom_order.py M.e3f --device cpu --dtype float64 --sizes 32 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# which e3fuse to measure: a staged build (scripts/gpu_common.sh gpu_build), else an installed
# one, else the source tree's
if "E3FUSE_BENCH_PYTHON" in os.environ:
    sys.path.insert(0, os.environ["E3FUSE_BENCH_PYTHON"])
sys.path.append(str(HERE.parent / "python"))

import cases  # noqa: E402
import numpy as np  # noqa: E402

PROPERTIES = ["energy", "forces", "stress"]


def model_call_ms(calc: Any, atoms: Any, warmup: int, repeats: int) -> list[float]:
    """Wall ms of calculate() on unchanged positions (the neighbor list is kept)."""
    from ase.calculators.calculator import all_changes

    for _ in range(warmup):
        calc.calculate(atoms, PROPERTIES, all_changes)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        calc.calculate(atoms, PROPERTIES, all_changes)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def compare_orders(
    model: Path, atoms_count: int, device: str, dtype: str, warmup: int, repeats: int
) -> dict[str, Any]:
    import e3fuse

    ordered = cases.build_atoms(cases.case_for_size(atoms_count))
    permutation = np.random.default_rng(2026).permutation(len(ordered))
    shuffled = ordered[permutation]
    row: dict[str, Any] = {"model": str(model), "atoms": len(ordered), "device": device}
    results = {}
    for name, atoms in (("lattice", ordered), ("shuffled", shuffled)):
        calc = e3fuse.Calculator(str(model), device=device, dtype=dtype)
        times = model_call_ms(calc, atoms, warmup, repeats)
        row[f"{name}_ms"] = statistics.median(times)
        row[f"{name}_ms_all"] = times
        results[name] = (calc.results["energy"], np.array(calc.results["forces"]))
        del calc
    energy_l, forces_l = results["lattice"]
    energy_s, forces_s = results["shuffled"]
    row["ratio"] = row["shuffled_ms"] / row["lattice_ms"]
    row["max_force_difference"] = float(np.abs(forces_s - forces_l[permutation]).max())
    row["energy_per_atom_difference"] = abs(energy_s - energy_l) / len(ordered)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("models", type=Path, nargs="+", help="e3fuse model files")
    p.add_argument("--sizes", type=int, nargs="+", default=[864, 32000])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    rows = []
    print("model atoms lattice_ms shuffled_ms ratio max|dF| |dE|/atom", flush=True)
    for model in args.models:
        for size in args.sizes:
            r = compare_orders(model, size, args.device, args.dtype, args.warmup, args.repeats)
            rows.append(r)
            print(
                f"{model.stem} {r['atoms']} {r['lattice_ms']:.2f} {r['shuffled_ms']:.2f} "
                f"{r['ratio']:.3f} {r['max_force_difference']:.2e} "
                f"{r['energy_per_atom_difference']:.2e}",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "atom-order", "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
