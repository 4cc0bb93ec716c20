"""mace-torch MACE / ScaleShiftMACE options beyond MACE-MP-0's (issue 20): the
element-agnostic product basis (use_agnostic_product), a readout on the last layer
only (use_last_readout_only), convolutions on their own irreps (edge_irreps,
use_edge_irreps_first), embedding_specs / use_embedding_readout, and what e3fuse refuses
by name (per-atom embedding specs). The non-linear interaction block has its own file,
tests/test_mace_nonlinear.py.

Small models with random weights, built in float64 through tests/helpers_mace.py's
build_mace, against mace-torch in float64; float32 against e3fuse's float64; per-atom
virials against their sum and against mace-torch's; finite differences."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mace.modules")

from conftest import DEVICES  # noqa: E402
from helpers_mace import (  # noqa: E402
    FORCES_F32,
    build_mace,
    e3fuse_eval,
    finite_difference_forces,
    finite_difference_stress,
    omol_specs,
    structure,
)

from e3fuse import reference  # noqa: E402
from e3fuse.calculator import Calculator  # noqa: E402
from e3fuse.convert import mace as mace_convert  # noqa: E402

SMALL = dict(hidden="16x0e+16x1o", max_ell=2, correlation=3)
OPTIONS: dict[str, dict[str, Any]] = {
    "agnostic-product": dict(SMALL, use_agnostic_product=True),
    "last-readout-only": dict(SMALL, num_interactions=3, use_last_readout_only=True),
    "edge-irreps": dict(SMALL, edge_irreps="12x0e+8x1o+8x2e"),
    "edge-irreps-first": dict(SMALL, edge_irreps="12x0e+8x1o+8x2e", use_edge_irreps_first=True),
    # edge irreps above the hidden ones' l (as in mace's own training examples)
    "edge-irreps-higher-l": dict(SMALL, edge_irreps="8x0e+8x1o+8x2e+8x3o"),
    "combined": dict(
        hidden="16x0e+16x1o+16x2e",
        max_ell=2,
        correlation=[3, 2, 2],
        num_interactions=3,
        use_agnostic_product=True,
        use_last_readout_only=True,
        edge_irreps="8x0e+12x1o+4x2e",
        use_edge_irreps_first=True,
        first_residual=True,
        elements=(1, 8, 28, 29),
    ),
    "combined-plain-mace": dict(
        SMALL,
        scale_shift=False,
        use_agnostic_product=True,
        use_last_readout_only=True,
        edge_irreps="8x0e+8x1o",
    ),
}

# float64 against mace-torch built in float64 (COMMON targets)
FORCES_F64, ENERGY_PER_ATOM_F64, STRESS_F64 = 1e-10, 1e-12, 1e-12

_CACHE: dict[str, tuple[Any, Path]] = {}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: Any) -> Path:
    return tmp_path_factory.mktemp("mace_options")


def _build(name: str) -> Any:
    options = dict(OPTIONS[name])
    if "edge_irreps" in options:
        from e3nn import o3

        options["edge_irreps"] = o3.Irreps(options["edge_irreps"])
    return build_mace(**options)


def converted(name: str, workdir: Path) -> tuple[Any, Path]:
    if name not in _CACHE:
        model = _build(name)
        path = workdir / f"{name}.e3f"
        mace_convert.convert(model, path)
        _CACHE[name] = (model, path)
    return _CACHE[name]


def evaluate(path: Path, atoms: Any, device: str, dtype: str = "float64") -> dict[str, Any]:
    """e3fuse_eval with stress and stresses."""
    return e3fuse_eval(path, atoms, dtype, device, stress=True, stresses=True)


def _elements(name: str) -> tuple[int, ...]:
    return OPTIONS[name].get("elements", (8, 28, 29))


def test_options_are_what_they_say() -> None:
    """The models really carry the options (mace-torch 0.3.16 attribute names)."""
    agnostic = _build("agnostic-product")
    assert agnostic.products[0].symmetric_contractions.contractions[0].weights_max.shape[0] == 1
    last = _build("last-readout-only")
    assert len(last.readouts) == 1 and len(last.interactions) == 3
    edge = _build("edge-irreps-first")
    assert str(edge.interactions[0].linear_up.irreps_out) == "12x0e"
    assert str(edge.interactions[1].linear_up.irreps_out) == "12x0e+8x1o+8x2e"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(OPTIONS))
def test_option_matches_mace_torch_float64(name: str, device: str, workdir: Path) -> None:
    model, path = converted(name, workdir)
    atoms = structure(_elements(name), seed=1)
    ref = reference.evaluate_mace(reference.mace_calculator(model, "float64"), atoms)
    ours = evaluate(path, atoms, device)
    n = len(atoms)
    assert abs(ours["energy"] - float(ref["energy"])) / n < ENERGY_PER_ATOM_F64
    assert np.abs(ours["energies"] - ref["energies"]).max() < ENERGY_PER_ATOM_F64
    assert np.abs(ours["forces"] - ref["forces"]).max() < FORCES_F64
    assert np.abs(ours["stress"] - ref["stress"]).max() < STRESS_F64
    assert np.abs(ref["forces"]).max() > 1e-2  # the comparison is not trivial
    # per-atom virials (as stresses over the whole volume) sum to the virial
    assert np.abs(ours["stresses"].sum(axis=0) - ours["stress"]).max() < STRESS_F64


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["combined", "edge-irreps-first"])
def test_option_float32_close_to_float64(name: str, device: str, workdir: Path) -> None:
    _, path = converted(name, workdir)
    atoms = structure(_elements(name), seed=2)
    f64 = evaluate(path, atoms, "cpu", "float64")
    f32 = evaluate(path, atoms, device, "float32")
    assert np.abs(f32["forces"] - f64["forces"]).max() < FORCES_F32
    assert abs(f32["energy"] - f64["energy"]) / len(atoms) < 1e-5
    assert np.abs(f32["stress"] - f64["stress"]).max() < 1e-6


def test_atom_virials_match_mace_torch(workdir: Path) -> None:
    """Per-atom virials against mace-torch's compute_atomic_stresses, which splits each
    edge's r (x) f half to either atom, as e3fuse does, and then symmetrizes each atom's
    tensor (e3fuse keeps it as it is: compared symmetrized)."""
    import warnings

    from mace.calculators import MACECalculator

    model, path = converted("combined", workdir)
    atoms = structure(_elements("combined"), seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        calc = MACECalculator(
            models=model, device="cpu", default_dtype="float64", compute_atomic_stresses=True
        )
    ref = atoms.copy()
    ref.calc = calc
    expected = ref.get_stresses(voigt=False)
    ours_calc = Calculator(str(path), device="cpu", dtype="float64")
    out = ours_calc.engine.compute_system(
        np.ascontiguousarray(atoms.positions),
        ours_calc._species_of(atoms.numbers),
        np.ascontiguousarray(atoms.cell.array),
        [bool(p) for p in atoms.pbc],
        forces=True,
        virial=True,
        atom_virials=True,
    )
    virials = np.asarray(out["atom_virials"]).reshape(-1, 3, 3)
    ours = -(virials + virials.transpose(0, 2, 1)) / 2 / atoms.get_volume()
    assert np.abs(expected).max() > 1e-3
    assert np.abs(ours - expected).max() < 1e-12


def test_finite_differences(workdir: Path) -> None:
    """Forces = -dE/dr and stress = dE/d(strain)/V, central differences in float64,
    on the model with every option at once."""
    _, path = converted("combined", workdir)
    atoms = structure(_elements("combined"), seed=4)
    base = evaluate(path, atoms, "cpu")

    entries = [(0, 0), (5, 1), (7, 2)]
    for (i, axis), fd in zip(entries, finite_difference_forces(path, atoms, entries)):
        assert abs(fd - base["forces"][i, axis]) < 1e-7
    stress = atoms.copy()
    stress.calc = Calculator(str(path), device="cpu", dtype="float64")
    full = stress.get_stress(voigt=False)
    components = [(0, 0), (1, 2)]
    for (a, b), fd in zip(components, finite_difference_stress(path, atoms, components)):
        assert abs(fd - full[a, b]) < 1e-8


# --------------------------------------------------------------------------------------
# Refused by name
# --------------------------------------------------------------------------------------


EMBEDDING_SPECS = {
    "total_charge": {
        "type": "categorical",
        "per": "graph",
        "num_classes": 11,
        "emb_dim": 4,
        "offset": 5,
    },
    "total_spin": {"type": "continuous", "per": "graph", "in_dim": 1, "emb_dim": 6},
}


# mace-foundations mace_omol/mace-omol.sh's specs, embedding sizes reduced
OMOL_SPECS = omol_specs(8)


def embedding_model(
    readout: bool, seed: int = 3, specs: dict[str, Any] = EMBEDDING_SPECS, **extra: Any
) -> Any:
    options = dict(SMALL, seed=seed, embedding_specs=specs)
    options.update(extra)
    return build_mace(use_embedding_readout=readout, **options)


def embedding_energies(model: Any, atoms: Any, charge: float, spin: float) -> np.ndarray:
    """Per-atom energies of mace's embedding readout (which mace adds to the total energy
    but leaves out of its node energies; e3fuse counts them in both)."""
    if not hasattr(model, "embedding_readout"):
        return np.zeros(len(atoms))
    z = list(model.atomic_numbers.tolist())
    attrs = torch.zeros(len(atoms), len(z), dtype=torch.float64)
    attrs[torch.arange(len(atoms)), torch.tensor([z.index(int(n)) for n in atoms.numbers])] = 1
    batch = torch.zeros(len(atoms), dtype=torch.int64)
    features = {
        "total_charge": torch.tensor([float(charge)], dtype=torch.float64),
        "total_spin": torch.tensor([float(spin)], dtype=torch.float64),
    }
    with torch.no_grad():
        feats = model.node_embedding(attrs) + model.joint_embedding(batch, features)
        return model.embedding_readout(feats, None)[:, 0].numpy()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "readout,specs",
    [(False, EMBEDDING_SPECS), (True, EMBEDDING_SPECS), (False, OMOL_SPECS)],
    ids=["embedding", "embedding-readout", "omol-specs"],
)
def test_embedding_specs_match_mace_torch(
    readout: bool, specs: dict[str, Any], device: str, tmp_path: Path
) -> None:
    """Total charge and spin from atoms.info (mace's keys 'charge' and 'spin'; absent:
    mace's defaults 0 and 1), one calculator over several values (its engine switches
    them in place: Engine.set_system_inputs, tests/test_system_inputs.py)."""
    model = embedding_model(readout, specs=specs, scale_shift=readout or specs is OMOL_SPECS)
    path = tmp_path / "embedding.e3f"
    mace_convert.convert(model, path)
    reference_calc = reference.mace_calculator(model, "float64")
    calc = Calculator(str(path), device=device, dtype="float64")
    base = structure((8, 28, 29), seed=5)
    energies = []
    for info in ({}, {"charge": 1, "spin": 2.0}, {"charge": -3, "spin": 3}, {"charge": 1}):
        atoms = base.copy()
        atoms.info.update(info)
        ref = reference.evaluate_mace(reference_calc, atoms)
        atoms.calc = calc
        n = len(atoms)
        energy = atoms.get_potential_energy()
        charge, spin = info.get("charge", 0), info.get("spin", 1.0)
        assert abs(energy - float(ref["energy"])) / n < ENERGY_PER_ATOM_F64
        expected = ref["energies"] + embedding_energies(model, atoms, charge, spin)
        assert np.abs(atoms.get_potential_energies() - expected).max() < ENERGY_PER_ATOM_F64
        assert np.abs(atoms.get_forces() - ref["forces"]).max() < FORCES_F64
        assert np.abs(atoms.get_stress() - ref["stress"]).max() < STRESS_F64
        energies.append(energy)
    assert len({round(e, 8) for e in energies}) == 4  # the inputs matter


def test_embedding_specs_float32_and_bad_values(tmp_path: Path) -> None:
    model = embedding_model(True, seed=4)
    path = tmp_path / "embedding.e3f"
    mace_convert.convert(model, path)
    atoms = structure((8, 28, 29), seed=6)
    atoms.info.update(charge=2, spin=3.0)
    f64 = evaluate(path, atoms, "cpu", "float64")
    f32 = evaluate(path, atoms, "cpu", "float32")
    assert np.abs(f32["forces"] - f64["forces"]).max() < FORCES_F32
    assert abs(f32["energy"] - f64["energy"]) / len(atoms) < 1e-5
    atoms.info["charge"] = 6  # classes -5 .. 5
    with pytest.raises(Exception, match="total_charge = 6.* outside the model's classes"):
        evaluate(path, atoms, "cpu")
    atoms.info["charge"] = "neutral"
    with pytest.raises(Exception, match="charge.*must be a number"):
        evaluate(path, atoms, "cpu")
    from e3fuse import _core

    file_model = _core.Model.load(str(path))
    assert file_model.needs_system_inputs
    assert file_model.system_inputs == [
        ("total_charge", "charge", 0.0),
        ("total_spin", "spin", 1.0),
    ]
    with pytest.raises(Exception, match="per-system inputs total_charge \\(charge\\)"):
        _core.Engine(file_model, "cpu", "float64")


def test_embedding_specs_in_lammps(tmp_path: Path) -> None:
    """pair_style e3fuse ... charge Q spin S equals the ASE calculator with atoms.info."""
    lammps_tests = pytest.importorskip("test_lammps")
    model = embedding_model(True, seed=5)
    path = tmp_path / "embedding.e3f"
    mace_convert.convert(model, path)
    atoms = lammps_tests.lammps_frame(structure((8, 28, 29), seed=7))
    for style, info in (("", {}), ("charge -2 spin 3", {"charge": -2, "spin": 3.0})):
        got = lammps_tests.run_python(atoms, path, style)
        atoms.info.update(info)
        ours = evaluate(path, atoms, "cpu")
        n = len(atoms)
        assert abs(float(got["energy"]) - ours["energy"]) / n < 1e-12
        assert np.abs(got["energies"] - ours["energies"]).max() < 1e-12
        assert np.abs(got["forces"] - ours["forces"]).max() < 1e-10
    # a keyword the model has no input for is an error
    _, plain = converted("agnostic-product", tmp_path)
    commands = lammps_tests.structure_commands(atoms, lammps_tests.element_order(atoms))
    message = lammps_tests.lammps_error(
        commands + lammps_tests.pair_commands(plain, lammps_tests.element_order(atoms), "spin 2")
    )
    assert "'spin' given, but the model has no such per-system input" in message


def test_unsupported_embedding_specs_are_refused_by_name(tmp_path: Path) -> None:
    specs = {"total_charge": dict(EMBEDDING_SPECS["total_charge"], per="atom")}
    model = build_mace("8x0e", max_ell=1, correlation=1, seed=3, embedding_specs=specs)
    with pytest.raises(mace_convert.UnsupportedModel, match="embedding_specs \\(total_charge\\)"):
        mace_convert.convert(model, tmp_path / "per-atom.e3f")
    # empty specs: a joint embedding without inputs, which mace-torch cannot evaluate either;
    # refused before any file is written
    empty = build_mace("8x0e", max_ell=1, correlation=1, seed=3, embedding_specs={})
    with pytest.raises(mace_convert.UnsupportedModel, match="embedding_specs is empty"):
        mace_convert.convert(empty, tmp_path / "empty.e3f")
    assert not (tmp_path / "empty.e3f").exists()
