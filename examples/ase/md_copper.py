"""NVE molecular dynamics of a rattled copper supercell with e3fuse through ASE.

Prints the energy drift and the time per step. Usage:
    python examples/ase/md_copper.py --model models/7net-0.e3f [--size 4] [--steps 50]
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--model", required=True, help=".e3f model file")
    parser.add_argument(
        "--size", type=int, default=4, help="cubic fcc cells per side (4 -> 256 atoms)"
    )
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--timestep", type=float, default=2.0, help="fs")
    parser.add_argument("--temperature", type=float, default=300.0, help="K")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()

    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((args.size,) * 3)
    atoms.rattle(0.02, seed=0)
    MaxwellBoltzmannDistribution(
        atoms, temperature_K=args.temperature, rng=np.random.default_rng(0)
    )
    Stationary(atoms)
    atoms.calc = Calculator(args.model, device=args.device, dtype=args.dtype)
    print(atoms.calc)
    print(f"{len(atoms)} Cu atoms, NVE, dt = {args.timestep} fs, T0 = {args.temperature} K")

    dyn = VelocityVerlet(atoms, timestep=args.timestep * units.fs)
    e0 = atoms.get_total_energy()
    print(f"{'step':>6} {'E_tot (eV)':>14} {'E_pot (eV)':>14} {'T (K)':>8} {'ms/step':>9}")
    t_last = time.perf_counter()
    times = []
    report_every = max(1, args.steps // 10)
    for step in range(1, args.steps + 1):
        dyn.run(1)
        now = time.perf_counter()
        times.append(now - t_last)
        t_last = now
        if step % report_every == 0 or step == args.steps:
            print(
                f"{step:6d} {atoms.get_total_energy():14.6f} {atoms.get_potential_energy():14.6f} "
                f"{atoms.get_temperature():8.1f} {1e3 * times[-1]:9.1f}"
            )
    drift = (atoms.get_total_energy() - e0) / len(atoms)
    per_step = float(np.median(times))
    print(
        f"energy drift: {1e3 * drift:+.4f} meV/atom over {args.steps} steps "
        f"({args.steps * args.timestep / 1000:.3f} ps)"
    )
    print(
        f"time per step: {1e3 * per_step:.1f} ms (median), "
        f"{len(atoms) / per_step:.0f} atom-steps/s, neighbor list built "
        f"{atoms.calc.neighbors.num_builds} times"
    )


if __name__ == "__main__":
    main()
