"""Copper MD with e3fuse through ASE at growing sizes: time per step and memory.

For each size, a rattled fcc Cu supercell (4 n^3 atoms, a = 3.61 A) runs a few steps of
velocity-Verlet NVE (the neighbor list is reused between steps, as in any MD); one row per
size: atoms, ms per step (median), atom-steps per second, peak memory (device memory held
by e3fuse on a GPU, growth of the resident set on the CPU), neighbor-list builds.

    python md_scaling.py --model 7net-0.e3f --device cpu --sizes 2 3 4 --steps 5
    python md_scaling.py --model 7net-0.e3f --device cuda --sizes 6 10 20 32 50 --steps 20
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from ase import units
from ase.build import bulk
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution, Stationary
from ase.md.verlet import VelocityVerlet

from e3fuse import Calculator
from e3fuse.bench import (
    e3fuse_device_bytes,
    e3fuse_reset_device_peak,
    host_status,
    is_out_of_memory,
    reset_host_peak,
)


def run_size(n: int, args: argparse.Namespace) -> dict[str, float]:
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((n,) * 3)
    atoms.rattle(0.02, seed=n)
    MaxwellBoltzmannDistribution(
        atoms, temperature_K=args.temperature, rng=np.random.default_rng(n)
    )
    Stationary(atoms)
    rss0 = host_status().get("VmRSS", 0)
    reset_host_peak()
    if args.device == "cuda":
        e3fuse_reset_device_peak()
    atoms.calc = Calculator(args.model, device=args.device, dtype=args.dtype)
    dyn = VelocityVerlet(atoms, timestep=args.timestep * units.fs)
    dyn.run(1)  # warm-up: first neighbor list, allocations, kernel selection
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        dyn.run(1)
        times.append(time.perf_counter() - t0)
    if args.device == "cuda":
        peak = e3fuse_device_bytes()[1] or 0
    else:
        peak = host_status().get("VmHWM", rss0) - rss0
    per_step = float(np.median(times))
    return {
        "atoms": len(atoms),
        "ms": per_step * 1e3,
        "rate": len(atoms) / per_step,
        "peak_mib": peak / 2**20,
        "builds": atoms.calc.neighbors.num_builds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--model", required=True, help=".e3f model file")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[2, 3, 4], help="cubic cells per side (4 n^3 atoms)"
    )
    parser.add_argument("--steps", type=int, default=5, help="timed MD steps per size")
    parser.add_argument("--timestep", type=float, default=2.0, help="fs")
    parser.add_argument("--temperature", type=float, default=300.0, help="K")
    args = parser.parse_args()

    print(f"{'atoms':>10} {'ms/step':>10} {'atom-steps/s':>13} {'peak MiB':>9} {'builds':>6}")
    for n in args.sizes:
        try:
            r = run_size(n, args)
        except Exception as err:  # noqa: BLE001 - stop growing at the first failure
            what = "out of memory" if is_out_of_memory(err) else f"{type(err).__name__}: {err}"
            print(f"{4 * n**3:>10,} stopped: {what}")
            break
        print(
            f"{r['atoms']:>10,} {r['ms']:>10.2f} {r['rate']:>13,.0f} {r['peak_mib']:>9.1f} "
            f"{r['builds']:>6}",
            flush=True,
        )


if __name__ == "__main__":
    main()
