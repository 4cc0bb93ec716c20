"""Systems evaluated region by region (Engine.region_atoms, see kernels/src/regions.h):
the same energies, per-atom energies, forces and virials as one pass, to rounding, on
periodic triclinic cells, slabs (a cut along an open direction) and with ghosts that are
periodic images; errors name the system's atoms, not a region's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk

pytest.importorskip("torch")
pytest.importorskip("mace.modules")

from conftest import DEVICES, TOLERANCES, calculator, compute_system, evaluate  # noqa: E402
from helpers_mace import build_mace, structure  # noqa: E402

from e3fuse import E3fuseError, _core  # noqa: E402
from e3fuse.convert import mace as mace_convert  # noqa: E402

ELEMENTS = (8, 28, 29)
KEYS = ("energy", "energies", "forces", "virial", "atom_virials")


@pytest.fixture(scope="module")
def small_mace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two interactions with a 3.2 A cutoff: ghosts reach 6.4 A, so that cells of a few
    thousand atoms are thick enough for cuts to pay."""
    path = tmp_path_factory.mktemp("regions") / "small.e3f"
    mace_convert.convert(build_mace("8x0e+8x1o", r_max=3.2, seed=1), path)
    return path


def alloy(repeat: int, seed: int = 0) -> Atoms:
    """helpers_mace's random strained and rattled alloy, from the cubic fcc cell."""
    return structure(ELEMENTS, seed=seed, repeat=repeat, cubic=True)


def compute(
    path: Path, atoms: Atoms, region_atoms: int, device: str = "cpu", dtype: str = "float64"
) -> tuple[dict[str, np.ndarray], int]:
    out, engine = compute_system(path, atoms, device, dtype, region_atoms)
    return {k: np.asarray(out[k]) for k in KEYS}, int(engine.num_regions)


def assert_same(regions: dict[str, Any], one_pass: dict[str, Any], limit: float) -> None:
    for key in KEYS:
        scale = max(float(np.abs(one_pass[key]).max()), 1e-300)
        err = float(np.abs(regions[key] - one_pass[key]).max()) / scale
        assert err <= limit, f"{key}: relative difference {err:.3g} > {limit:.1g}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fraction", [0.85, 0.5])
def test_periodic_triclinic_matches_one_pass(
    small_mace: Path, device: str, fraction: float
) -> None:
    atoms = alloy(8)  # 2,048 atoms, cell about 29 A: ghosts 0.22 of it
    one_pass, n1 = compute(small_mace, atoms, 0, device)
    regions, n = compute(small_mace, atoms, int(fraction * len(atoms)), device)
    assert n1 == 1 and n > 1
    assert_same(regions, one_pass, 1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_slab_cut_along_its_open_direction(small_mace: Path, device: str) -> None:
    atoms = alloy(8, seed=3)
    atoms.pbc = (True, True, False)
    atoms.positions[:, 2] *= 1.5  # open direction: a rarefied slab of 43 A
    one_pass, _ = compute(small_mace, atoms, 0, device)
    regions, n = compute(small_mace, atoms, 1100, device)
    assert n > 1
    assert_same(regions, one_pass, 1e-12)


def test_thin_periodic_direction_stays_whole(small_mace: Path) -> None:
    """7.2 A along z, less than twice the ghost depth: cuts go along x and y, and z keeps
    its periodicity (neighbors through images) inside every region."""
    rng = np.random.default_rng(7)
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((10, 10, 2))
    atoms.set_atomic_numbers(rng.choice(ELEMENTS, size=len(atoms)))
    atoms.positions += 0.1 * rng.standard_normal(atoms.positions.shape)
    one_pass, _ = compute(small_mace, atoms, 0)
    regions, n = compute(small_mace, atoms, 600)
    assert n > 1
    assert_same(regions, one_pass, 1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_float32_regions_within_float32_tolerance(small_mace: Path, device: str) -> None:
    atoms = alloy(8, seed=2)
    reference, _ = compute(small_mace, atoms, 0, device, "float64")
    regions, n = compute(small_mace, atoms, 1000, device, "float32")
    assert n > 1
    tol = TOLERANCES["float32"]
    assert abs(regions["energy"] - reference["energy"]) / len(atoms) < tol.energy_per_atom
    assert np.abs(regions["forces"] - reference["forces"]).max() < tol.forces


def test_calculator_regions_and_stress(small_mace: Path) -> None:
    atoms = alloy(8, seed=4)
    one_pass = evaluate(calculator(small_mace), atoms)
    calc = calculator(small_mace, region_atoms=1200)
    regions = evaluate(calc, atoms)
    assert calc.engine.num_regions > 1
    for key in ("energy", "energies", "forces", "stress"):
        scale = float(np.abs(one_pass[key]).max())
        assert float(np.abs(regions[key] - one_pass[key]).max()) <= 1e-12 * scale, key


def test_errors_name_the_systems_atoms(small_mace: Path) -> None:
    atoms = alloy(8, seed=6)
    first, second = 1500, 1900
    atoms.positions[second] = atoms.positions[first] + np.array([0.02, 0.0, 0.0])
    with pytest.raises(E3fuseError) as one_pass:
        compute(small_mace, atoms, 0)
    with pytest.raises(E3fuseError) as regions:
        compute(small_mace, atoms, 1000)
    for err in (one_pass, regions):
        assert f"atoms {first} and {second}" in str(err.value) or (
            f"atoms {second} and {first}" in str(err.value)
        ), str(err.value)


def test_region_atoms_must_not_be_negative(small_mace: Path) -> None:
    engine = _core.Engine(_core.Model.load(str(small_mace)), "cpu", "float64")
    assert engine.region_atoms == 0
    with pytest.raises(E3fuseError, match="atoms per region"):
        engine.region_atoms = -1


@pytest.mark.skipif(not _core.cuda_available(), reason="e3fuse built without CUDA or no GPU")
def test_sevennet0_regions_on_the_gpu(sevennet0_path: Path) -> None:
    """SevenNet-0 (5 layers: ghosts 25 A deep) on 87,808 Cu atoms, float32 on the GPU."""
    rng = np.random.default_rng(11)
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((28, 28, 28))
    atoms.positions += 0.05 * rng.standard_normal(atoms.positions.shape)
    one_pass, _ = compute(sevennet0_path, atoms, 0, "cuda", "float32")
    regions, n = compute(sevennet0_path, atoms, 75_000, "cuda", "float32")
    assert n > 1
    tol = TOLERANCES["float32"]
    assert abs(regions["energy"] - one_pass["energy"]) / len(atoms) < tol.energy_per_atom
    assert np.abs(regions["forces"] - one_pass["forces"]).max() < tol.forces
    assert np.abs(regions["virial"] - one_pass["virial"]).max() / atoms.get_volume() < tol.stress


def test_open_cluster_and_unwrapped_positions(small_mace: Path) -> None:
    """No periodic direction at all (cuts over the atoms' extent), and a periodic cell whose
    atoms sit several cell vectors away from it, as in an unwrapped MD trajectory."""
    cluster = alloy(8, seed=8)
    cluster.pbc = False
    one_pass, _ = compute(small_mace, cluster, 0)
    regions, n = compute(small_mace, cluster, 1100)
    assert n > 1
    assert_same(regions, one_pass, 1e-12)

    bulk_cell = alloy(8, seed=9)
    one_pass, _ = compute(small_mace, bulk_cell, 0)
    moved = bulk_cell.copy()
    shifts = np.random.default_rng(9).integers(-3, 4, size=(len(moved), 3))
    moved.positions += shifts @ moved.cell.array
    regions, n = compute(small_mace, moved, 1100)
    assert n > 1
    assert_same(regions, one_pass, 1e-11)


def test_bench_scaling_reports_regions(small_mace: Path, tmp_path: Path) -> None:
    import json

    from e3fuse import cli

    rows = {}
    for cap in (0, 1100):
        out = tmp_path / f"scaling_{cap}.json"
        args = ["bench", "scaling", "--model", str(small_mace), "--device", "cpu"]
        args += ["--dtype", "float64", "--sizes", "2048", "--steps", "1"]
        assert cli.main([*args, "--region-atoms", str(cap), "--json", str(out)]) == 0
        rows[cap] = json.loads(out.read_text())["rows"][0]
    assert rows[0]["regions"] == 1 and rows[1100]["regions"] > 1
    assert abs(rows[1100]["energy_per_atom"] - rows[0]["energy_per_atom"]) < 1e-12
