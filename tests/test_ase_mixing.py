"""e3fuse's ASE Calculator inside ase.calculators.mixing.SumCalculator, the way
mace_mp(dispersion=True) and SevenNetD3Calculator add D3 to a model: every property the
two calculators share (energy, free energy, per-atom energies, forces, stress,
per-atom stresses) is the sum of the two calculators' own results, and a short MD run
with the sum conserves energy.

The second calculator is ASE's LennardJones (no D3 package is a dependency here; the
LAMMPS side, with LAMMPS's dispersion/d3, is tests/test_lammps_hybrid.py). The model is
the shipped Cu MACE model, so nothing is converted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import DEVICES, TOLERANCES, assert_abs, make_structure

import e3fuse

MODEL = Path(__file__).resolve().parents[1] / "examples" / "models" / "mace-cu-emt.e3f"
TOL = TOLERANCES["float64"]
PROPERTIES = ("energy", "free_energy", "energies", "forces", "stress", "stresses")


def lennard_jones() -> object:
    from ase.calculators.lj import LennardJones

    return LennardJones(epsilon=0.05, sigma=2.2, rc=6.0, smooth=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["cu_bulk", "fcc_primitive"])
def test_sum_calculator_adds_up(name: str, device: str) -> None:
    from ase.calculators.mixing import SumCalculator

    atoms = make_structure(name)
    atoms.numbers[:] = 29
    model = e3fuse.Calculator(MODEL, device=device, dtype="float64")
    lj = lennard_jones()
    total = SumCalculator([model, lj])
    assert set(PROPERTIES) <= set(total.implemented_properties)
    parts = []
    for calc in (model, lj):
        copy = atoms.copy()
        copy.calc = calc
        parts.append({p: np.asarray(calc.get_property(p, copy)) for p in PROPERTIES})
    atoms.calc = total
    n = len(atoms)
    limits = {
        "energy": TOL.energy_per_atom * n,
        "free_energy": TOL.energy_per_atom * n,
        "energies": TOL.energy_per_atom,
        "forces": TOL.forces,
        "stress": TOL.stress,
        "stresses": TOL.stress * n,
    }
    for prop in PROPERTIES:
        expected = parts[0][prop] + parts[1][prop]
        assert_abs(np.asarray(total.get_property(prop, atoms)), expected, limits[prop], prop)
    # both parts matter
    assert np.abs(parts[1]["forces"]).max() > 0.01 * np.abs(parts[0]["forces"]).max()
    # per-atom energies sum to the energy, per-atom stresses to the stress
    assert_abs(atoms.get_potential_energies().sum(), atoms.get_potential_energy(), 1e-10, "sum")
    stresses = total.get_property("stresses", atoms)
    assert_abs(stresses.sum(axis=0), atoms.get_stress(), 1e-11, "sum of per-atom stresses")


def test_sum_calculator_md_conserves_energy() -> None:
    """40 steps of velocity Verlet (2 fs) with e3fuse + LJ on 32 rattled Cu atoms: the
    total energy stays within 5e-4 eV/atom."""
    from ase import units
    from ase.calculators.mixing import SumCalculator
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
    from ase.md.verlet import VelocityVerlet

    atoms = make_structure("cu_bulk")
    atoms.calc = SumCalculator(
        [e3fuse.Calculator(MODEL, device="cpu", dtype="float64"), lennard_jones()]
    )
    MaxwellBoltzmannDistribution(atoms, temperature_K=600, rng=np.random.default_rng(5))
    energies = []
    dynamics = VelocityVerlet(atoms, 2.0 * units.fs)
    dynamics.attach(lambda: energies.append(atoms.get_total_energy()), interval=5)
    dynamics.run(40)
    drift = (max(energies) - min(energies)) / len(atoms)
    print(f"\nSumCalculator NVE, 40 steps: max - min total energy {drift:.2e} eV/atom")
    assert drift < 5e-4
