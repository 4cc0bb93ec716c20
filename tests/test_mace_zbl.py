"""MACE with ZBL pair repulsion (mace-torch pair_repulsion=True, ZBLBasis; the
foundation models MP-0b/b2/b3, MPA-0, OMAT-0, MATPES use it): conversion, e3fuse
against mace-torch in float64 and float32 (energies, per-atom energies, forces, stress,
per-atom virials), the pair_repulsion op alone on each device, finite differences at
short range where ZBL dominates, regions, and the edge cases (the engine's minimum
distance, pairs whose covalent radii reach past the model cutoff, trained constants).

mace-torch is evaluated with torch's default dtype float64 (reference.evaluate_mace):
ZBLBasis forms 14.3996 * Z_u * Z_v in the global default dtype, float32 otherwise even
in a float64 model, about 1e-8 relative off the constant's definition, which e3fuse uses."""

from __future__ import annotations

import copy
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mace.modules")

from conftest import DEVICES, assert_regions_match_one_pass, compute_system  # noqa: E402
from helpers_mace import build_mace, structure  # noqa: E402

from e3fuse import _core, reference  # noqa: E402
from e3fuse.calculator import Calculator  # noqa: E402
from e3fuse.convert import mace as mace_convert  # noqa: E402

ELEMENTS = (1, 8, 29, 79)  # H-H pairs end at 0.62 A, Au-Au at 2.72 A (covalent radii)
ARCH: dict[str, Any] = dict(
    hidden="32x0e+32x1o",
    max_ell=2,
    correlation=2,
    num_interactions=2,
    elements=ELEMENTS,
    r_max=4.5,
    pair_repulsion=True,
)

_MODELS: dict[str, tuple[Any, Path]] = {}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: Any) -> Path:
    return tmp_path_factory.mktemp("mace_zbl")


def converted(workdir: Path, name: str = "scaleshift", **changes: Any) -> tuple[Any, Path]:
    """A float64 ZBL model (ScaleShiftMACE unless scale_shift=False) and its .e3f."""
    if name not in _MODELS:
        model = build_mace(**dict(ARCH, **changes))
        path = workdir / f"{name}.e3f"
        mace_convert.convert(model, path)
        _MODELS[name] = (model, path)
    return _MODELS[name]


def zbl_structure(seed: int = 0) -> Any:
    """helpers_mace's strained, rattled alloy of ELEMENTS (8 atoms, periodic) with pairs
    pushed to short range: Au-Au at 0.6 A, H-O at 0.5 A, Cu-Au at 1.1 A."""
    atoms = structure(ELEMENTS, seed=seed)
    for (i, j), (zi, zj), r in (
        ((0, 1), (79, 79), 0.6),
        ((2, 3), (1, 8), 0.5),
        ((4, 5), (29, 79), 1.1),
    ):
        atoms.numbers[[i, j]] = (zi, zj)
        direction = np.array([0.48, -0.6, 0.64])
        atoms.positions[j] = atoms.positions[i] + r * direction / np.linalg.norm(direction)
    return atoms


def mace_reference(model: Any, atoms: Any) -> dict[str, np.ndarray]:
    """mace-torch's MACECalculator in float64, with its per-atom virials."""
    from mace.calculators import MACECalculator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        calc = MACECalculator(
            models=copy.deepcopy(model).double(),
            device="cpu",
            default_dtype="float64",
            compute_atomic_stresses=bool(atoms.pbc.all()),
        )
    out = reference.evaluate_mace(calc, atoms)
    if atoms.pbc.all():
        out["virials"] = np.asarray(calc.results["virials"])
    return out


def e3fuse_eval(path: Path, atoms: Any, dtype: str = "float64", device: str = "cpu") -> dict:
    """energy, energies, forces (and stress, per-atom virials for periodic cells)."""
    out, _ = compute_system(path, atoms, device, dtype)
    result = {
        "energy": float(out["energy"]),
        "energies": np.asarray(out["energies"]),
        "forces": np.asarray(out["forces"]),
        "atom_virials": np.asarray(out["atom_virials"]).reshape(-1, 3, 3),
    }
    if atoms.pbc.all():  # the ASE calculator's stress (and forces: the same engine)
        a = atoms.copy()
        a.calc = Calculator(str(path), device=device, dtype=dtype)
        result["stress"] = a.get_stress()
        assert np.abs(a.get_forces() - result["forces"]).max() == 0.0
    return result


def derivative(energy: Any, h: float = 1e-4) -> float:
    """dE/dt at t = 0 from energy(t) by the fourth-order central stencil: its error,
    h^4 E^(5) / 30, stays below 1e-8 relative where ZBL decays on 0.1 A scales."""
    return (8 * (energy(h) - energy(-h)) - (energy(2 * h) - energy(-2 * h))) / (12 * h)


def assert_matches_mace(ours: dict, ref: dict, n: int, forces_tol: float = 1e-10) -> None:
    assert abs(ours["energy"] - float(ref["energy"])) / n < 1e-12
    assert np.abs(ours["energies"] - ref["energies"]).max() < 1e-12 * max(
        1.0, np.abs(ref["energies"]).max()
    )
    assert np.abs(ours["forces"] - ref["forces"]).max() < forces_tol
    if "stress" in ref:
        assert np.abs(ours["stress"] - ref["stress"]).max() < 1e-12
    if "virials" in ref:  # mace-torch's per-atom virials are symmetrized
        av = ours["atom_virials"]
        assert np.abs((av + av.transpose(0, 2, 1)) / 2 - ref["virials"]).max() < 1e-10


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale_shift", [True, False], ids=["ScaleShiftMACE", "MACE"])
def test_matches_mace_torch_float64(workdir: Path, scale_shift: bool, device: str) -> None:
    name = "scaleshift" if scale_shift else "plain"
    model, path = converted(workdir, name, scale_shift=scale_shift)
    atoms = zbl_structure(seed=1)
    ref = mace_reference(model, atoms)
    ours = e3fuse_eval(path, atoms, device=device)
    assert_matches_mace(ours, ref, len(atoms))
    # ZBL dominates the comparison: without it the forces are two orders smaller
    no_zbl = build_mace(**dict(ARCH, pair_repulsion=False, scale_shift=scale_shift))
    plain = reference.evaluate_mace(reference.mace_calculator(no_zbl, "float64"), atoms)
    assert np.abs(ref["forces"]).max() > 100.0 * np.abs(plain["forces"]).max()


@pytest.mark.parametrize("device", DEVICES)
def test_float32_close_to_float64(workdir: Path, device: str) -> None:
    _, path = converted(workdir)
    atoms = zbl_structure(seed=2)
    f64 = e3fuse_eval(path, atoms, "float64", device)
    f32 = e3fuse_eval(path, atoms, "float32", device)
    assert np.abs(f32["forces"] - f64["forces"]).max() < 3e-5
    assert abs(f32["energy"] - f64["energy"]) / len(atoms) < 1e-5
    assert np.abs(f32["energies"] - f64["energies"]).max() < 1e-5
    assert np.abs(f32["stress"] - f64["stress"]).max() < 1e-6


def displaced_energy(path: Path, atoms: Any, i: int, a: int, t: float) -> float:
    moved = atoms.copy()
    moved.positions[i, a] += t
    return e3fuse_eval(path, moved)["energy"]


def dimers() -> list[tuple[str, Any]]:
    """Open dimers and a trimer at short range, and pairs near their ZBL cutoff
    R_u + R_v (H-H 0.62 A, O-O 1.32 A): the envelope's slope matters there."""
    from ase import Atoms

    cases = []
    for z, r in (
        ((79, 79), 0.5),
        ((79, 79), 1.2),
        ((1, 79), 0.7),
        ((8, 29), 0.9),
        ((1, 1), 0.6),
        ((8, 8), 1.3),
    ):
        cases.append(
            (
                f"{z[0]}-{z[1]}@{r}",
                Atoms(numbers=z, positions=[[0, 0, 0], [0.2 * r, 0.6 * r, 0.77459667 * r]]),
            )
        )
    trimer = Atoms(numbers=(79, 8, 1), positions=[[0, 0, 0], [0.9, 0.3, -0.2], [0.2, -0.55, 0.4]])
    cases.append(("Au-O-H", trimer))
    return cases


@pytest.mark.parametrize("case", dimers(), ids=[name for name, _ in dimers()])
def test_short_range_finite_differences(workdir: Path, case: tuple[str, Any]) -> None:
    """Forces = -dE/dr by central differences on open dimers at 0.5-1.3 A (ZBL gives
    hundreds of eV there), and the same against mace-torch."""
    model, path = converted(workdir)
    _, atoms = case
    ours = e3fuse_eval(path, atoms)
    assert_matches_mace(ours, mace_reference(model, atoms), len(atoms), 1e-10)
    scale = max(1.0, np.abs(ours["forces"]).max())
    for i in range(len(atoms)):
        for a in range(3):
            fd = -derivative(partial(displaced_energy, path, atoms, i, a))
            assert abs(fd - ours["forces"][i, a]) < 1e-8 * scale


def test_compressed_cell_finite_differences(workdir: Path) -> None:
    """A periodic cell compressed to 75 % of its edge (nearest neighbours ~1.9 A, plus
    the short pairs of zbl_structure): forces and stress (finite strain) by central
    differences."""
    _, path = converted(workdir)
    atoms = zbl_structure(seed=3)
    atoms.set_cell(atoms.cell.array * 0.75, scale_atoms=True)
    ours = e3fuse_eval(path, atoms)
    scale = max(1.0, np.abs(ours["forces"]).max())
    for i, a in [(0, 0), (1, 2), (3, 1), (4, 0), (7, 2)]:
        fd = -derivative(partial(displaced_energy, path, atoms, i, a))
        assert abs(fd - ours["forces"][i, a]) < 1e-8 * scale
    calc_atoms = atoms.copy()
    calc_atoms.calc = Calculator(str(path), device="cpu", dtype="float64")
    sigma = calc_atoms.get_stress(voigt=False)
    volume = atoms.get_volume()

    def strained_energy(a: int, b: int, t: float) -> float:
        strain = np.eye(3)
        strain[a, b] += t / 2
        strain[b, a] += t / 2
        s = atoms.copy()
        s.set_cell(atoms.cell.array @ strain, scale_atoms=True)
        return e3fuse_eval(path, s)["energy"]

    for a, b in [(0, 0), (1, 2), (0, 1)]:
        fd = derivative(partial(strained_energy, a, b)) / volume
        assert abs(fd - sigma[a, b]) < 1e-8 * max(1.0, np.abs(sigma).max())


def test_minimum_distance_is_finite(workdir: Path) -> None:
    """Au-Au at 0.1 A (the engine's default minimum distance): ZBL is ~1e5 eV, finite,
    and equal to mace-torch's; closer is refused."""
    from ase import Atoms

    model, path = converted(workdir)
    atoms = Atoms(numbers=(79, 79, 8), positions=[[0, 0, 0], [0.0, 0.0, 0.1001], [1.5, 0.4, 0.2]])
    ours = e3fuse_eval(path, atoms)
    ref = mace_reference(model, atoms)
    assert np.isfinite(ours["energy"]) and ours["energy"] > 1e4
    assert abs(ours["energy"] - ref["energy"]) < 1e-12 * abs(ref["energy"])
    scale = np.abs(ref["forces"]).max()
    assert np.abs(ours["forces"] - ref["forces"]).max() < 1e-12 * scale
    atoms.positions[1, 2] = 0.09
    with pytest.raises(Exception, match="0.1"):
        e3fuse_eval(path, atoms)


def test_pair_reaching_past_the_model_cutoff(workdir: Path) -> None:
    """Cs-Cs pairs end at 4.88 A (covalent radii), past a 3.0 A model cutoff: like
    mace-torch (edges from the r_max neighbor list), ZBL acts on edges inside the cutoff
    only, so a pair at 2.95 A has it and one at 3.05 A has none."""
    from ase import Atoms

    model = build_mace(**dict(ARCH, elements=(1, 55), r_max=3.0, hidden="8x0e+8x1o"))
    path = workdir / "cs.e3f"
    mace_convert.convert(model, path)
    atoms = Atoms(
        numbers=(55, 55, 55, 1),
        positions=[[0, 0, 0], [2.95, 0, 0], [6.0, 0.0, 0.0], [1.0, 2.4, 0.3]],
    )
    ours = e3fuse_eval(path, atoms)
    assert_matches_mace(ours, mace_reference(model, atoms), len(atoms))
    # the isolated third Cs (3.05 A from the second) has no pair energy: only its E0
    e0 = float(model.atomic_energies_fn.atomic_energies.reshape(-1)[1])
    assert abs(ours["energies"][2] - (e0 + float(model.scale_shift.shift))) < 1e-12


def test_converter_constants(workdir: Path) -> None:
    """The .e3f holds the constants from their definition: a model saved in float32
    (buffers rounded) converts to the literal values; a model whose a_exp was trained
    keeps the module's value, and e3fuse still equals mace-torch."""
    import ase.data

    model, _ = converted(workdir)
    single = copy.deepcopy(model).float()
    arch, _ = mace_convert.extract(mace_convert.load_mace_model(single), {})
    zbl = arch["pair_repulsion"]
    assert zbl["c"] == [0.1818, 0.5099, 0.2802, 0.02817]
    assert zbl["exponents"] == [3.2, 0.9423, 0.4028, 0.2016]
    assert (zbl["a_exp"], zbl["a_prefactor"], zbl["bohr"], zbl["coulomb"]) == (
        0.3,
        0.4543,
        0.529,
        14.3996,
    )
    assert zbl["covalent_radii"] == [float(ase.data.covalent_radii[z]) for z in ELEMENTS]
    assert zbl["p"] == 5
    assert zbl["from_module"] == []

    trained = copy.deepcopy(model)
    with torch.no_grad():
        trained.pair_repulsion_fn.a_exp.fill_(0.31)
    path = workdir / "trained.e3f"
    arch = mace_convert.convert(trained, path)
    assert arch["pair_repulsion"]["a_exp"] == 0.31
    assert arch["pair_repulsion"]["from_module"] == ["a_exp"]
    atoms = zbl_structure(seed=4)
    assert_matches_mace(e3fuse_eval(path, atoms), mace_reference(trained, atoms), len(atoms))
    assert "pair repulsion: ZBL" in _core.Model.load(str(path)).summary()


def open_graph(
    positions: np.ndarray, radius: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """All pairs within `radius` as a receiver-sorted CSR graph, and (sender, receiver)."""
    n = len(positions)
    d = np.linalg.norm(positions[None, :, :] - positions[:, None, :], axis=-1)
    receiver, sender = np.nonzero((d < radius) & ~np.eye(n, dtype=bool))
    row_offsets = np.concatenate([[0], np.cumsum(np.bincount(receiver, minlength=n))])
    return row_offsets.astype(np.int64), sender.astype(np.int32), sender, receiver


@pytest.mark.parametrize("device", DEVICES)
def test_pair_repulsion_op(workdir: Path, device: str) -> None:
    """The op alone on an open cluster whose graph also holds edges past the model cutoff
    (ignored), with only the first nodes counting energy: per-node energies against
    mace-torch's ZBLBasis, forces against torch autograd of weight * their sum, per-atom
    virials against the half-half split of each edge's -v (x) dE/dv; CUDA equals CPU."""
    model, path = converted(workdir)
    probe = _core.OpsProbe(_core.Model.load(str(path)))
    rng = np.random.default_rng(5)
    n, n_energy, weight = 40, 29, 1.7
    positions = rng.uniform(0.0, 5.0, size=(n, 3))
    species = rng.integers(0, len(ELEMENTS), size=n).astype(np.int32)
    r_max = float(model.r_max)
    row_offsets, neighbors, sender, receiver = open_graph(positions, r_max + 1.0)
    energies, forces, virials = probe.pair_repulsion(
        positions, species, row_offsets, neighbors, n_energy, weight, device=device
    )
    # the reference: mace's module on the edges inside the cutoff, in float64
    fn = copy.deepcopy(model.pair_repulsion_fn).double()
    pos = torch.from_numpy(positions).requires_grad_(True)
    vec = pos[torch.from_numpy(sender)] - pos[torch.from_numpy(receiver)]
    vec.retain_grad()
    lengths = vec.norm(dim=-1, keepdim=True)
    inside = (lengths[:, 0] < r_max).detach()
    attrs = torch.nn.functional.one_hot(torch.from_numpy(species).long(), len(ELEMENTS))
    edge_index = torch.from_numpy(np.stack([sender, receiver]))[:, inside]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        node = fn(lengths[inside], attrs.double(), edge_index, model.atomic_numbers)
    finally:
        torch.set_default_dtype(previous)
    counted = node[:n_energy]
    (weight * counted.sum()).backward()
    expected_e = np.zeros(n)
    expected_e[:n_energy] = counted.detach().numpy()
    scale_e = np.abs(expected_e).max()
    assert scale_e > 10.0  # some pairs are short
    assert np.abs(energies - expected_e).max() < 1e-13 * scale_e
    expected_f = -pos.grad.numpy()
    scale_f = np.abs(expected_f).max()
    assert np.abs(forces - expected_f).max() < 1e-12 * scale_f
    term = -np.einsum("ea,eb->eab", vec.detach().numpy(), vec.grad.numpy())
    expected_w = np.zeros((n, 3, 3))
    np.add.at(expected_w, sender, 0.5 * term)
    np.add.at(expected_w, receiver, 0.5 * term)
    assert np.abs(virials.reshape(n, 3, 3) - expected_w).max() < 1e-12 * np.abs(expected_w).max()
    if device != "cpu":
        cpu = probe.pair_repulsion(positions, species, row_offsets, neighbors, n_energy, weight)
        for ours, theirs in zip((energies, forces, virials), cpu):
            assert np.abs(ours - theirs).max() <= 1e-13 * max(1.0, np.abs(theirs).max())


@pytest.mark.parametrize("device", DEVICES)
def test_regions_match_one_pass(workdir: Path, device: str) -> None:
    """compute_system split into regions (each with its ghosts, only owned atoms counting
    energy) equals one pass, with short ZBL pairs across region borders."""
    model = build_mace(**dict(ARCH, hidden="8x0e+8x1o", r_max=3.2, seed=1))
    path = workdir / "regions.e3f"
    mace_convert.convert(model, path)
    atoms = structure(ELEMENTS, seed=6, repeat=5, cubic=True)  # 500 atoms, cell ~18 A
    rng = np.random.default_rng(6)
    for i in rng.choice(len(atoms), size=40, replace=False):
        atoms.positions[i] += rng.normal(size=3) * 0.5
    assert_regions_match_one_pass(path, atoms, device, "float64", 300, 1e-12, min_distance=0.05)
