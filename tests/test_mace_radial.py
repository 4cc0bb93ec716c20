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
from helpers_mace import (  # noqa: E402
    assert_float32_close,
    converted_once,
    e3fuse_eval,
    finite_difference_forces,
    finite_difference_stress,
    structure,
)

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
    # 24 channels: a warp of the GPU's symmetric contraction spans two nodes, so its
    # partial sums of dE/drho are kept per channel, not per warp (RowDensity, node_ops.cuh)
    "density-24": dict(SMALL, hidden="24x0e+24x1o", **DENSITY),
}

_CACHE: dict[str, tuple[Any, Path]] = {}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: Any) -> Path:
    return tmp_path_factory.mktemp("mace_radial")


def converted(name: str, workdir: Path) -> tuple[Any, Path]:
    return converted_once(_CACHE, name, workdir, **VARIANTS[name], seed=1)


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
    ours = e3fuse_eval(path, atoms)
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
    f64 = e3fuse_eval(path, atoms, "float64")
    f32 = e3fuse_eval(path, atoms, "float32", radial=radial)
    assert np.abs(f32["forces"] - f64["forces"]).max() < 3e-5
    assert abs(f32["energy"] - f64["energy"]) / len(atoms) < 1e-5
    assert np.abs(f32["stress"] - f64["stress"]).max() < 1e-6


@pytest.mark.parametrize("name", ["agnesi", "soft", "no-cutoff", "density", "omat"])
def test_pair_tables_match_the_mlp(name: str, workdir: Path) -> None:
    """float64 with the radial MLP (and the edge density) read from tables (one per species
    pair with a transform) against the per-edge MLP and exact density: only the tables' error
    is left."""
    _, path = converted(name, workdir)
    atoms = mixed_structure(seed=5)
    exact = e3fuse_eval(path, atoms, "float64", radial="mlp")
    table = e3fuse_eval(path, atoms, "float64", radial="table")
    scale = np.abs(exact["forces"]).max()
    assert np.abs(table["forces"] - exact["forces"]).max() < 2e-6 * max(1.0, scale)
    assert abs(table["energy"] - exact["energy"]) / len(atoms) < 1e-7


def _finite_difference_forces(path: Path, atoms: Atoms, moves: list[tuple[int, int]]) -> None:
    atoms = atoms.copy()
    atoms.calc = Calculator(str(path), device="cpu", dtype="float64")
    forces = atoms.get_forces()
    for (i, a), fd in zip(moves, finite_difference_forces(path, atoms, moves, h=1e-5)):
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
    base = e3fuse_eval(path, atoms)
    rot = Rotation.random(random_state=4).as_matrix()
    moved = atoms.copy()
    moved.set_cell(atoms.cell.array @ rot.T, scale_atoms=False)
    moved.positions = atoms.positions @ rot.T + np.array([0.3, -1.2, 2.0])
    perm = np.random.default_rng(1).permutation(len(atoms))
    moved = moved[perm]
    out = e3fuse_eval(path, moved)
    assert abs(out["energy"] - base["energy"]) < 1e-10
    assert np.abs(out["forces"] - (base["forces"] @ rot.T)[perm]).max() < 1e-10


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["omat", "soft-density-no-cutoff", "no-cutoff"])
def test_device_agrees_with_cpu(name: str, device: str, workdir: Path) -> None:
    """Each backend against the CPU float64 engine on a mixed H/O/Cu system: float64 (the
    per-edge MLP) to 1e-10 eV/A, float32 with pair tables and with the MLP within
    assert_float32_close's bounds (3e-5 eV/A, or twice mace-torch's own float32 error where
    the random weights make that larger: OMAT's forces here reach 33 eV/A). On CUDA,
    apply_cutoff=False runs with radial tables only (float64 or radial='mlp' are refused by
    name)."""
    model, path = converted(name, workdir)
    atoms = mixed_structure(seed=9)
    cpu = e3fuse_eval(path, atoms)
    no_cutoff = VARIANTS[name].get("apply_cutoff", True) is False
    if device == "cuda" and no_cutoff:
        with pytest.raises(ValueError, match="apply_cutoff=False"):
            e3fuse_eval(path, atoms, device=device)
    else:
        ours = e3fuse_eval(path, atoms, device=device)
        assert abs(ours["energy"] - cpu["energy"]) / len(atoms) < 1e-12
        assert np.abs(ours["forces"] - cpu["forces"]).max() < 1e-10
        assert np.abs(ours["stress"] - cpu["stress"]).max() < 1e-12
        assert np.abs(ours["energies"] - cpu["energies"]).max() < 1e-12
    table = e3fuse_eval(path, atoms, "float64", radial="table", device=device)
    assert np.abs(table["forces"] - cpu["forces"]).max() < 2e-6 * max(
        1.0, np.abs(cpu["forces"]).max()
    )
    for radial in ("table", "mlp"):
        if device == "cuda" and no_cutoff and radial == "mlp":
            continue
        f32 = e3fuse_eval(path, atoms, "float32", radial=radial, device=device)
        assert_float32_close(model, atoms, f32, cpu)


@pytest.mark.parametrize("device", DEVICES[1:])  # the CPU engine is the reference here
@pytest.mark.parametrize("name", ["density-24", "omat"])
def test_density_scale_in_the_contraction(name: str, device: str, workdir: Path) -> None:
    """The density blocks' 1 / (1 + rho), applied by the GPU's symmetric contraction as it
    loads its input and, in the backward, with dE/drho summed per warp (32 channels) or per
    channel (24): float64 equals the CPU engine to 1e-10 eV/A, per-atom virials included,
    float32 within assert_float32_close's bounds, and a second run is bitwise the first."""
    model, path = converted(name, workdir)
    atoms = mixed_structure(seed=15).repeat((2, 1, 1))  # 64 atoms
    cpu = e3fuse_eval(path, atoms, stresses=True)
    ours = e3fuse_eval(path, atoms, device=device, stresses=True)
    again = e3fuse_eval(path, atoms, device=device, stresses=True)
    for key in ours:
        np.testing.assert_array_equal(again[key], ours[key], err_msg=key)
    assert abs(ours["energy"] - cpu["energy"]) / len(atoms) < 1e-12
    assert np.abs(ours["energies"] - cpu["energies"]).max() < 1e-12
    assert np.abs(ours["forces"] - cpu["forces"]).max() < 1e-10
    assert np.abs(ours["stress"] - cpu["stress"]).max() < 1e-12
    assert np.abs(ours["stresses"] - cpu["stresses"]).max() < 1e-10
    f32 = e3fuse_eval(path, atoms, "float32", device=device)
    assert_float32_close(model, atoms, f32, cpu)


@pytest.mark.parametrize("device", DEVICES)
def test_pair_tables_built_on_first_use(device: str, workdir: Path) -> None:
    """One calculator meets Cu alone, then H/O/Cu (new pairs' tables built on the way, on a
    common grid): both agree with fresh calculators."""
    model, path = converted("omat", workdir)
    calc = Calculator(str(path), device=device, dtype="float32")
    for atoms in (structure((29,), seed=1, cubic=True), mixed_structure(seed=10)):
        a = atoms.copy()
        a.calc = calc
        forces = a.get_forces()
        fresh = e3fuse_eval(path, atoms, "float32", device=device)
        assert np.abs(forces - fresh["forces"]).max() < 1e-6
        exact = e3fuse_eval(path, atoms)
        ours = {"forces": forces, "energy": a.get_potential_energy()}
        assert_float32_close(model, atoms, ours, {k: exact[k] for k in ("forces", "energy")})


# The density table's stated tolerances (cpu/radial_table.cpp): each interval's error at its
# midpoint and at the slope's error peaks below 1e-7 of the largest |density| and 1e-6 of the
# largest |d density / dr|. Dense sampling meets a slightly larger error than the three
# points per interval the builder checks: 1.5x. float32 adds the coefficients' rounding
# (2^-24 relative, a few of them per value): 3e-7 and 2e-6 there.
DENSITY_TABLE_TOLERANCE = {"float64": (1.5e-7, 1.5e-6), "float32": (3e-7, 2e-6)}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", ["density", "omat", "soft-density-no-cutoff"])
def test_density_table_within_its_tolerance(name: str, dtype: str, workdir: Path) -> None:
    """The tabulated edge density tanh((w . emb)^2) (x f(r) without apply_cutoff) and its
    r-derivative against the exact double evaluation, densely near r = 0, mid-range and
    just below the cutoff, for every density layer and species pair (H-H, H-Cu, O-Cu, Cu-Cu:
    different r_0 under the transforms)."""
    from e3fuse import _core

    _, path = converted(name, workdir)
    probe = _core.OpsProbe(_core.Model.load(str(path)))
    r_max = VARIANTS[name]["r_max"]
    whole = np.linspace(1e-3, r_max - 1e-9, 20001)
    regions = {
        "near 0": np.linspace(1e-3, 0.6, 3001),
        "mid-range": np.linspace(0.45 * r_max, 0.55 * r_max, 3001),
        "near the cutoff": np.linspace(r_max - 0.4, r_max - 1e-9, 3001),
    }
    value_tol, grad_tol = DENSITY_TABLE_TOLERANCE[dtype]
    # DENSITY makes every interaction a density block
    for layer in range(VARIANTS[name].get("num_interactions", 2)):
        for a, b in [(0, 0), (0, 2), (1, 2), (2, 2)]:
            exact = probe.edge_density(layer, whole, a, b)
            vmax, gmax = np.abs(exact["value"]).max(), np.abs(exact["grad"]).max()
            assert vmax > 1e-3 and gmax > 1e-3  # the weights make a density that varies
            info = probe.edge_density(layer, whole[:1], a, b, table=True, dtype=dtype)
            assert info["value_error"] <= 1e-7 and info["grad_error"] <= 1e-6, info
            for region, r in regions.items():
                exact = probe.edge_density(layer, r, a, b)
                table = probe.edge_density(layer, r, a, b, table=True, dtype=dtype)
                label = f"{name} layer {layer} pair {a}-{b} {region} {dtype}"
                verr = np.abs(table["value"] - exact["value"]).max() / vmax
                gerr = np.abs(table["grad"] - exact["grad"]).max() / gmax
                assert verr <= value_tol, (label, verr)
                assert gerr <= grad_tol, (label, gerr)


@pytest.mark.parametrize("device", DEVICES)
def test_density_forces_finite_differences_float32(device: str, workdir: Path) -> None:
    """A density model (OMAT-0's combination) in float32 with its tables (the default):
    forces against differences of the float32 energy (4-point stencil, h = 0.02 A: its
    truncation error ~1e-7, float32 rounding of the energy ~2e-4 eV/A measured on the CPU), on
    an open H/O/Cu cluster whose pairs span short range to just inside the cutoff. And with
    float64 tables, where rounding does not hide a table adjoint that is not the derivative of
    the table's energy (the cubic is C1: differences converge to it at knots too)."""
    _, path = converted("omat", workdir)
    atoms = Atoms(
        "HOCuCuOH",
        positions=[
            [0.0, 0.0, 0.0],
            [0.95, 0.3, 0.1],
            [2.1, -0.4, 0.6],
            [3.9, 1.0, -0.5],
            [1.4, 2.3, 1.9],
            [-1.2, 1.6, 3.6],
        ],
        pbc=False,
    )
    limits = {"float32": (2e-2, 1e-3), "float64": (1e-3, 1e-8)}
    for dtype, (h, limit) in limits.items():
        calc = Calculator(str(path), device=device, dtype=dtype, radial="table")
        a = atoms.copy()
        a.calc = calc
        forces = a.get_forces()
        assert np.abs(forces).max() > 1e-2

        def energy(i: int, axis: int, dx: float, calc: Calculator = calc) -> float:
            moved = atoms.copy()
            moved.positions[i, axis] += dx
            moved.calc = calc
            return moved.get_potential_energy()

        for i, axis in [(0, 0), (1, 1), (2, 2), (3, 0), (4, 1), (5, 2)]:
            fd = -(
                8 * (energy(i, axis, h) - energy(i, axis, -h))
                - (energy(i, axis, 2 * h) - energy(i, axis, -2 * h))
            ) / (12 * h)
            scale = max(1.0, abs(forces[i, axis]))
            assert abs(fd - forces[i, axis]) < limit * scale, (dtype, i, axis, fd, forces[i, axis])
