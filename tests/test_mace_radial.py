"""MACE radial-embedding options and density blocks (what MACE-MPA-0 / OMAT-0 / MATPES /
MP-0b3 use): the Agnesi and Soft distance transforms, apply_cutoff=False, and the
RealAgnosticDensity[Residual]InteractionBlock, against mace-torch built in float64, float32
against float64 (radial tables per species pair and the per-edge MLP), finite differences
near the cutoff and at short range, and invariances. Models have random weights and
several elements of different covalent radii (H, O, Cu), so that the species pairs differ.
ZBL (pair_repulsion) is another op, not tested here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mace.modules")

from ase import Atoms  # noqa: E402
from conftest import DEVICES  # noqa: E402
from test_mace import build_mace, finite_difference_stress, structure  # noqa: E402

from e3fuse import reference  # noqa: E402
from e3fuse.calculator import Calculator  # noqa: E402
from e3fuse.convert import mace as mace_convert  # noqa: E402

ELEMENTS = (1, 8, 29)
SMALL = dict(hidden="32x0e+32x1o", max_ell=2, correlation=2, elements=ELEMENTS, r_max=4.5)
DENSITY = dict(
    interaction_first="RealAgnosticDensityInteractionBlock",
    interaction="RealAgnosticDensityResidualInteractionBlock",
)
VARIANTS: dict[str, dict[str, Any]] = {
    "agnesi": dict(SMALL, distance_transform="Agnesi"),
    "soft": dict(SMALL, distance_transform="Soft"),
    "no-cutoff": dict(SMALL, apply_cutoff=False),
    "density": dict(SMALL, **DENSITY),
    # the MACE-OMAT-0 combination (mace-omat-medium.sh) without ZBL
    "omat": dict(SMALL, distance_transform="Agnesi", **DENSITY),
    # every option at once, three interactions, the density block in the middle
    "soft-density-no-cutoff": dict(
        SMALL,
        distance_transform="Soft",
        apply_cutoff=False,
        num_interactions=3,
        correlation=[2, 2, 1],
        **DENSITY,
    ),
}

_CACHE: dict[str, tuple[Any, Path]] = {}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: Any) -> Path:
    return tmp_path_factory.mktemp("mace_radial")


def converted(name: str, workdir: Path) -> tuple[Any, Path]:
    if name not in _CACHE:
        model = build_mace(**VARIANTS[name], seed=1)
        path = workdir / f"{name}.e3f"
        mace_convert.convert(model, path)
        _CACHE[name] = (model, path)
    return _CACHE[name]


def evaluate(
    path: Path, atoms: Atoms, dtype: str = "float64", radial: str = "auto", device: str = "cpu"
) -> dict[str, Any]:
    a = atoms.copy()
    a.calc = Calculator(str(path), device=device, dtype=dtype, radial=radial)
    out = {
        "energy": a.get_potential_energy(),
        "energies": a.get_potential_energies(),
        "forces": a.get_forces(),
    }
    if a.pbc.all():
        out["stress"] = a.get_stress()
    return out


def mixed_structure(seed: int = 0) -> Atoms:
    """32 atoms of H, O and Cu on a strained fcc lattice: every species pair occurs."""
    atoms = structure(ELEMENTS, seed=seed, cubic=True)
    numbers = np.resize(np.array(ELEMENTS), len(atoms))
    atoms.set_atomic_numbers(np.random.default_rng(seed).permutation(numbers))
    return atoms


def test_converted_architecture(workdir: Path) -> None:
    """The transform's constants are the float64 literals and ase's radii."""
    from ase.data import covalent_radii

    model, path = converted("omat", workdir)
    arch, store = mace_convert.extract(mace_convert.load_mace_model(model), {})
    transform = arch["radial"]["transform"]
    assert transform["kind"] == "agnesi"
    assert (transform["q"], transform["p"], transform["a"]) == (0.9183, 4.5791, 1.0805)
    radii = store.arrays[transform["covalent_radii"]]
    assert np.array_equal(radii, covalent_radii[list(ELEMENTS)])
    assert [("density" in layer) for layer in arch["layers"]] == [True, True]
    assert [layer["residual"] for layer in arch["layers"]] == [False, True]
    assert arch["layers"][0]["conv"]["denominator"] == 1.0


@pytest.mark.parametrize("name", list(VARIANTS))
def test_matches_mace_torch_float64(name: str, workdir: Path) -> None:
    model, path = converted(name, workdir)
    atoms = mixed_structure(seed=2)
    ref = reference.evaluate_mace(reference.mace_calculator(model, "float64"), atoms)
    ours = evaluate(path, atoms)
    n = len(atoms)
    assert abs(ours["energy"] - float(ref["energy"])) / n < 1e-12
    assert np.abs(ours["energies"] - ref["energies"]).max() < 1e-12
    assert np.abs(ours["forces"] - ref["forces"]).max() < 1e-10
    assert np.abs(ours["stress"] - ref["stress"]).max() < 1e-12
    assert np.abs(ref["forces"]).max() > 1e-2  # the comparison is not trivial


@pytest.mark.parametrize("radial", ["table", "mlp"])
@pytest.mark.parametrize("name", ["omat", "soft-density-no-cutoff"])
def test_float32_close_to_float64(name: str, radial: str, workdir: Path) -> None:
    """float32 (radial tables per species pair, or the per-edge MLP) within 3e-5 eV/A of
    float64."""
    _, path = converted(name, workdir)
    atoms = mixed_structure(seed=3)
    f64 = evaluate(path, atoms, "float64")
    f32 = evaluate(path, atoms, "float32", radial=radial)
    assert np.abs(f32["forces"] - f64["forces"]).max() < 3e-5
    assert abs(f32["energy"] - f64["energy"]) / len(atoms) < 1e-5
    assert np.abs(f32["stress"] - f64["stress"]).max() < 1e-6


@pytest.mark.parametrize("name", ["agnesi", "soft", "no-cutoff"])
def test_pair_tables_match_the_mlp(name: str, workdir: Path) -> None:
    """float64 with the radial MLP read from tables (one per species pair with a transform)
    against the per-edge MLP: only the tables' error is left."""
    _, path = converted(name, workdir)
    atoms = mixed_structure(seed=5)
    exact = evaluate(path, atoms, "float64", radial="mlp")
    table = evaluate(path, atoms, "float64", radial="table")
    scale = np.abs(exact["forces"]).max()
    assert np.abs(table["forces"] - exact["forces"]).max() < 2e-6 * max(1.0, scale)
    assert abs(table["energy"] - exact["energy"]) / len(atoms) < 1e-7


def _finite_difference_forces(path: Path, atoms: Atoms, moves: list[tuple[int, int]]) -> None:
    atoms = atoms.copy()
    atoms.calc = Calculator(str(path), device="cpu", dtype="float64")
    forces = atoms.get_forces()
    h = 1e-5
    for i, a in moves:
        energies = []
        for sign in (1, -1):
            moved = atoms.copy()
            moved.positions[i, a] += sign * h
            moved.calc = Calculator(str(path), device="cpu", dtype="float64")
            energies.append(moved.get_potential_energy())
        fd = -(energies[0] - energies[1]) / (2 * h)
        assert abs(fd - forces[i, a]) < 1e-7 * max(1.0, abs(forces[i, a])), (i, a, fd)


@pytest.mark.parametrize("name", ["agnesi", "soft", "soft-density-no-cutoff"])
def test_finite_differences_short_range_and_cutoff(name: str, workdir: Path) -> None:
    """Open clusters: H-H, O-H and Cu-O at short range (0.6-1.3 A, where the transforms
    bend most) and pairs just inside the 4.5 A cutoff."""
    _, path = converted(name, workdir)
    short = Atoms(
        "HHOCu",
        positions=[[0, 0, 0], [0.62, 0.1, 0], [0.3, 1.05, 0.2], [1.2, 1.9, 0.9]],
        pbc=False,
    )
    _finite_difference_forces(path, short, [(0, 0), (1, 1), (2, 2), (3, 0)])
    near_cutoff = Atoms(
        "CuOHCu",
        positions=[[0, 0, 0], [4.49, 0.0, 0.0], [0.0, 4.47, 0.05], [2.2, 2.0, 3.3]],
        pbc=False,
    )
    _finite_difference_forces(path, near_cutoff, [(0, 0), (1, 0), (2, 1), (3, 2)])


def test_finite_difference_stress(workdir: Path) -> None:
    _, path = converted("omat", workdir)
    atoms = mixed_structure(seed=6)
    atoms.calc = Calculator(str(path), device="cpu", dtype="float64")
    stress = atoms.get_stress(voigt=False)
    components = [(0, 0), (1, 2)]
    for (a, b), fd in zip(components, finite_difference_stress(path, atoms, components)):
        assert abs(fd - stress[a, b]) < 1e-8


def test_invariances(workdir: Path) -> None:
    from scipy.spatial.transform import Rotation

    _, path = converted("omat", workdir)
    atoms = mixed_structure(seed=8)
    base = evaluate(path, atoms)
    rot = Rotation.random(random_state=4).as_matrix()
    moved = atoms.copy()
    moved.set_cell(atoms.cell.array @ rot.T, scale_atoms=False)
    moved.positions = atoms.positions @ rot.T + np.array([0.3, -1.2, 2.0])
    perm = np.random.default_rng(1).permutation(len(atoms))
    moved = moved[perm]
    out = evaluate(path, moved)
    assert abs(out["energy"] - base["energy"]) < 1e-10
    assert np.abs(out["forces"] - (base["forces"] @ rot.T)[perm]).max() < 1e-10


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["omat", "soft-density-no-cutoff", "no-cutoff"])
def test_device_agrees_with_cpu(name: str, device: str, workdir: Path) -> None:
    """Each backend against the CPU float64 engine on a mixed H/O/Cu system: float64 (the
    per-edge MLP) to 1e-10 eV/A, float32 with pair tables and with the MLP to 3e-5 eV/A.
    On CUDA, apply_cutoff=False runs with radial tables only (float64 or radial='mlp' are
    refused by name)."""
    _, path = converted(name, workdir)
    atoms = mixed_structure(seed=9)
    cpu = evaluate(path, atoms)
    no_cutoff = VARIANTS[name].get("apply_cutoff", True) is False
    if device == "cuda" and no_cutoff:
        with pytest.raises(ValueError, match="apply_cutoff=False"):
            evaluate(path, atoms, device=device)
    else:
        ours = evaluate(path, atoms, device=device)
        assert abs(ours["energy"] - cpu["energy"]) / len(atoms) < 1e-12
        assert np.abs(ours["forces"] - cpu["forces"]).max() < 1e-10
        assert np.abs(ours["stress"] - cpu["stress"]).max() < 1e-12
        assert np.abs(ours["energies"] - cpu["energies"]).max() < 1e-12
    table = evaluate(path, atoms, "float64", radial="table", device=device)
    assert np.abs(table["forces"] - cpu["forces"]).max() < 2e-6 * max(
        1.0, np.abs(cpu["forces"]).max()
    )
    for radial in ("table", "mlp"):
        if device == "cuda" and no_cutoff and radial == "mlp":
            continue
        f32 = evaluate(path, atoms, "float32", radial=radial, device=device)
        assert np.abs(f32["forces"] - cpu["forces"]).max() < 3e-5
        assert np.abs(f32["stress"] - cpu["stress"]).max() < 1e-6


@pytest.mark.parametrize("device", DEVICES)
def test_pair_tables_built_on_first_use(device: str, workdir: Path) -> None:
    """One calculator meets Cu alone, then H/O/Cu (new pairs' tables built on the way, on a
    common grid): both agree with fresh calculators."""
    _, path = converted("omat", workdir)
    calc = Calculator(str(path), device=device, dtype="float32")
    for atoms in (structure((29,), seed=1, cubic=True), mixed_structure(seed=10)):
        a = atoms.copy()
        a.calc = calc
        forces = a.get_forces()
        fresh = evaluate(path, atoms, "float32", device=device)
        assert np.abs(forces - fresh["forces"]).max() < 1e-6
        exact = evaluate(path, atoms)
        assert np.abs(forces - exact["forces"]).max() < 3e-5
