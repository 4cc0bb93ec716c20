"""MACE-OMOL-0 and MACE-MH-1, each as one model with every option of its released
architecture, at reduced width with random weights, against mace-torch 0.3.16 built in
float64, on each device; float32 against e3fuse's float64; LAMMPS's charge / spin keywords
against ASE's atoms.info.

MACE-OMOL-0 (`MACE-omol-0-extra-large-1024.model`): mace-foundations
`mace_omol/mace-omol.sh` (its last version, 428adf2, which put l = 2 back into the hidden
and edge irreps; that architecture at full width and 83 elements, torch.save'd in float64,
is 444 MB = 423 MiB, as the 422 MB that third-party tools list for the released file,
where the l = 1 version of ad64660 gives 381 MB). Every option, the script's
or mace-torch 0.3.16's run_train default (tools/arg_parser.py) where the script gives none:
ScaleShiftMACE; RealAgnosticResidualNonLinearInteractionBlock first and after; 3
interactions; correlation 2; max_ell 3; r_max 6 A; 8 Bessel functions (radial_type
bessel), polynomial cutoff p = 5, apply_cutoff False; no distance transform; no pair
repulsion; use_agnostic_product, use_last_readout_only, use_embedding_readout and
use_edge_irreps_first False; hidden irreps 1024x0e+1024x1o+1024x2e, edge irreps
128x0e+128x1o+128x2e; MLP_irreps 16x0e; radial_MLP [64, 64, 64]; gate silu;
embedding_specs total_spin (categorical, 101 classes, offset 0) and total_charge
(categorical, 201 classes, offset 100), emb_dim = the channels; E0s, mean 0.1021 and std
1.5151 from `mace_omol/omol-statistics-linear.json` (elements 1-83, avg_num_neighbors 30,
which the non-linear block does not use). Here: 32 channels, edge irreps of 8, embeddings
of 32, H / C / N / O with their OMOL E0s.

MACE-MH-1 (`mace-mh-1.model`): mace-foundations `mace_mh_1/config-mace-mh-1.yaml` (the
pre-training run): ScaleShiftMACE; the non-linear block first and after; 2 interactions;
correlation 3; max_ell 3; r_max 6 A; 10 Bessel functions, p = 5, apply_cutoff False;
Agnesi transform; ZBL pair repulsion; use_agnostic_product and use_edge_irreps_first True;
hidden irreps 512x0e+512x1o, edge irreps 128x0e+128x1o; MLP_irreps, radial_MLP and gate
mace's defaults; no embedding_specs. The released model has six heads from its multi-head
replay post-training (omat_pbe, mp_pbe_refit_add, oc20_usemppbe, matpes_r2scan, omol,
spice_wB97M, as third-party code that loaded it lists them); this architecture with those
heads and 89 elements holds 7.3 M parameters and buffers, 59 MB in float64, the size that
third-party tools list for the released file. Here: 32 channels, edge irreps of 8,
H / O / Cu / Au, the six heads (each its own E0s, scale and shift, readout column and
readout MLP units). MACE-MH-0's settings are not published (mace-foundations has no script
for it): not tested.

The non-linear block's species-dependent RadialMLP runs exactly per edge in double on both
devices (radial="mlp", float64's default: the 1e-10 eV/A targets), or from radial tables
(radial="table", float32's default: a float32-rounding approximation, compared at the
tables' bounds of tests/test_mace_nonlinear.py); float32 is checked with both."""

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
    build_mace,
    e3fuse_eval,
    omol_specs,
    structure,
)

from e3fuse import reference  # noqa: E402
from e3fuse.calculator import Calculator  # noqa: E402
from e3fuse.convert import mace as mace_convert  # noqa: E402

BLOCK = "RealAgnosticResidualNonLinearInteractionBlock"
CHANNELS = 32
OMOL_ELEMENTS = (1, 6, 7, 8)
# mace_omol/omol-statistics-linear.json: E0s of H, C, N, O (eV), mean and std
OMOL_E0 = (-15.9900036, -1037.16785, -1490.37815, -2047.59259)
OMOL_SHIFT, OMOL_SCALE = 0.1021, 1.5151
OMOL_SPECS = omol_specs(CHANNELS)
MH1_ELEMENTS = (1, 8, 29, 79)
MH1_HEADS = [
    "omat_pbe",
    "mp_pbe_refit_add",
    "oc20_usemppbe",
    "matpes_r2scan",
    "omol",
    "spice_wB97M",
]
COMMON: dict[str, Any] = dict(
    interaction=BLOCK,
    interaction_first=BLOCK,
    max_ell=3,
    r_max=6.0,
    p=5,
    apply_cutoff=False,
    radial_mlp=(64, 64, 64),
    mlp_irreps="16x0e",
)
ARCHS: dict[str, dict[str, Any]] = {
    "omol0": dict(
        COMMON,
        hidden=f"{CHANNELS}x0e+{CHANNELS}x1o+{CHANNELS}x2e",
        edge_irreps="8x0e+8x1o+8x2e",
        num_interactions=3,
        correlation=2,
        num_bessel=8,
        embedding_specs=OMOL_SPECS,
        elements=OMOL_ELEMENTS,
        seed=7,
    ),
    "mh1": dict(
        COMMON,
        hidden=f"{CHANNELS}x0e+{CHANNELS}x1o",
        edge_irreps="8x0e+8x1o",
        num_interactions=2,
        correlation=3,
        num_bessel=10,
        use_edge_irreps_first=True,
        use_agnostic_product=True,
        pair_repulsion=True,
        distance_transform="Agnesi",
        heads=MH1_HEADS,
        elements=MH1_ELEMENTS,
        seed=5,
    ),
}
# build_mace's weight noise gives energies of hundreds of eV per atom and forces of
# thousands of eV/A in these blocks (messages divided by alpha + beta rho ~ 20, not by the
# neighbour count): the last layer of each RadialMLP (and OMOL-0's charge / spin tables)
# are scaled down to forces of 0.03-1 eV/A, interaction energies of a few eV per atom
RADIAL_SCALE = {"omol0": 0.1, "mh1": 0.2}
READOUT_SCALE = {"omol0": 1.0, "mh1": 1.0}
EMBEDDING_SCALE = 0.3  # OMOL-0's charge / spin tables
# (charge, spin) in atoms.info; {} = mace's defaults 0 and 1
CHARGE_SPIN: list[dict[str, int]] = [{}, {"charge": 1, "spin": 2}, {"charge": -2, "spin": 3}]

# float64 targets (COMMON.md); radial tables (CUDA) at test_mace_nonlinear.py's bounds
FORCES_F64, ENERGY_PER_ATOM_F64, STRESS_F64 = 1e-10, 1e-12, 1e-12
FORCES_TABLE, ENERGY_PER_ATOM_TABLE, STRESS_TABLE = 3e-6, 1e-7, 1e-6

_MODELS: dict[tuple[str, str], tuple[Any, Path]] = {}
CUDA_ONLY = DEVICES[1:]  # the CUDA case of DEVICES (skipped without a GPU)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: Any) -> Path:
    return tmp_path_factory.mktemp("mace_omol_mh")


def build(name: str) -> Any:
    """The reduced-width architecture `name` in float64 with random weights."""
    from e3nn import o3

    options = dict(ARCHS[name])
    options["edge_irreps"] = o3.Irreps(options["edge_irreps"])
    model = build_mace(**options)
    with torch.no_grad():
        for inter in model.interactions:
            last = inter.conv_tp_weights.net[-1]
            last.weight.mul_(RADIAL_SCALE[name])
            last.bias.mul_(RADIAL_SCALE[name])
        for readout in model.readouts:
            for prm in readout.parameters():
                prm.mul_(READOUT_SCALE[name])
        if name == "omol0":
            for table in model.joint_embedding.embedders.values():
                table.weight.mul_(EMBEDDING_SCALE)
            e0 = torch.tensor(OMOL_E0, dtype=torch.float64)
            model.atomic_energies_fn.atomic_energies.copy_(
                e0.reshape_as(model.atomic_energies_fn.atomic_energies)
            )
            model.scale_shift.scale.fill_(OMOL_SCALE)
            model.scale_shift.shift.fill_(OMOL_SHIFT)
    return model


def converted(name: str, workdir: Path, head: str | None = None) -> tuple[Any, Path]:
    """(model, its .e3f for `head`), built once per name and converted once per head."""
    key = (name, head or "")
    if key not in _MODELS:
        model = _MODELS[(name, "")][0] if (name, "") in _MODELS else build(name)
        path = workdir / f"{name}-{head or 'default'}.e3f"
        mace_convert.convert(model, path, head=head)
        _MODELS[key] = (model, path)
    return _MODELS[key]


def molecule(seed: int) -> Atoms:
    """A 32-atom H/C/N/O cluster (no periodicity): the rattled lattice without its cell."""
    atoms = structure(OMOL_ELEMENTS, seed=seed, cubic=True)
    atoms.pbc = False
    atoms.cell = np.zeros((3, 3))
    return atoms


def omol_structure(kind: str, seed: int) -> Atoms:
    return molecule(seed) if kind == "molecule" else structure(OMOL_ELEMENTS, seed, cubic=True)


def mh1_alloy(seed: int) -> Atoms:
    """32 atoms of H, O, Cu and Au with a Cu-Au pair at 1.5 A, inside ZBL's reach."""
    atoms = structure(MH1_ELEMENTS, seed=seed, cubic=True)
    rng = np.random.default_rng(seed)
    numbers = rng.permutation(np.resize(np.array(MH1_ELEMENTS), len(atoms)))
    second = int(np.argsort(atoms.get_distances(0, range(len(atoms)), mic=True))[1])
    numbers[0], numbers[second] = 29, 79
    atoms.set_atomic_numbers(numbers)
    direction = atoms.get_distance(0, second, mic=True, vector=True)
    atoms.positions[second] = atoms.positions[0] + 1.5 * direction / np.linalg.norm(direction)
    return atoms


def assert_matches(ours: dict[str, Any], ref: dict[str, Any], n: int, exact: bool) -> None:
    forces, energy, stress = (
        (FORCES_F64, ENERGY_PER_ATOM_F64, STRESS_F64)
        if exact
        else (FORCES_TABLE, ENERGY_PER_ATOM_TABLE, STRESS_TABLE)
    )
    assert abs(ours["energy"] - float(ref["energy"])) / n < energy
    # Per-atom energies carry their element's E0 (about -1000 to -2000 eV for C, N, O here),
    # where one unit in the last place is 1.1e-13 to 2.3e-13 eV: besides the target, allow 16
    # of them per value (another summation order than mace-torch's; the exact CUDA path
    # measured up to 3.0e-12 eV at -1940 eV, 13 of them, on an H100 and an H200).
    limit = energy + 16 * np.spacing(np.abs(np.asarray(ref["energies"], dtype=np.float64)))
    assert (np.abs(ours["energies"] - ref["energies"]) < limit).all()
    assert np.abs(ours["forces"] - ref["forces"]).max() < forces
    if "stress" in ref:
        assert np.abs(ours["stress"] - ref["stress"]).max() < stress
    assert np.abs(ref["forces"]).max() > 1e-2  # the comparison is not trivial


# --------------------------------------------------------------------------------------
# MACE-OMOL-0
# --------------------------------------------------------------------------------------


def test_omol0_architecture(workdir: Path) -> None:
    """The model carries OMOL-0's options (mace-torch 0.3.16 attribute names), and the
    converted file keeps them: three non-linear layers, no cutoff on the radial basis,
    no transform, no ZBL, a per-element product basis, both per-system inputs."""
    model, _ = converted("omol0", workdir)
    assert [type(i).__name__ for i in model.interactions] == [BLOCK] * 3
    assert not model.radial_embedding.apply_cutoff
    assert model.radial_embedding.out_dim == 8
    assert not hasattr(model, "pair_repulsion_fn")
    assert not hasattr(model.radial_embedding, "distance_transform")
    assert type(model.radial_embedding.bessel_fn).__name__ == "BesselBasis"
    assert not hasattr(model, "embedding_readout")
    contraction = model.products[0].symmetric_contractions.contractions[0]
    assert contraction.weights_max.shape[0] == len(OMOL_ELEMENTS)  # not agnostic
    assert len(model.readouts) == 3
    assert str(model.interactions[1].linear_up.irreps_out) == "8x0e+8x1o+8x2e"
    assert float(model.r_max) == 6.0
    arch, _store = mace_convert.extract(mace_convert.load_mace_model(model), {})
    assert "pair_repulsion" not in arch and "transform" not in arch["radial"]
    assert len(arch["layers"]) == 3
    # the block's plain skip_tp is stored once, not once per species (83 copies at full
    # width would be 3.5 GB of float64)
    assert all(len(layer["skip"]["elements"]) == 1 for layer in arch["layers"])
    from e3fuse import _core

    file_model = _core.Model.load(str(converted("omol0", workdir)[1]))
    # in the order of OMOL-0's embedding_specs: spin first; mace's defaults 1 and 0
    assert file_model.system_inputs == [
        ("total_spin", "spin", 1.0),
        ("total_charge", "charge", 0.0),
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["periodic", "molecule"])
def test_omol0_matches_mace_torch(kind: str, device: str, workdir: Path) -> None:
    """Several total charges and spins (atoms.info, one calculator): energies, per-atom
    energies, forces (and stress) against mace-torch in float64, the RadialMLP exactly per
    edge (radial="mlp")."""
    check_omol0(kind, device, "mlp", workdir)


@pytest.mark.parametrize("device", CUDA_ONLY)
def test_omol0_tables_match_mace_torch(device: str, workdir: Path) -> None:
    """The same with radial="table" in float64 on CUDA (its only way before the per-edge
    RadialMLP ran there): within the tables' bounds (the CPU's tables: test_mace_nonlinear)."""
    check_omol0("periodic", device, "table", workdir)


def check_omol0(kind: str, device: str, radial: str, workdir: Path) -> None:
    model, path = converted("omol0", workdir)
    reference_calc = reference.mace_calculator(model, "float64")
    calc = Calculator(str(path), device=device, dtype="float64", radial=radial)
    base = omol_structure(kind, seed=1)
    energies = []
    for info in CHARGE_SPIN:
        atoms = base.copy()
        atoms.info.update(info)
        ref = reference.evaluate_mace(reference_calc, atoms)
        atoms.calc = calc
        ours = {
            "energy": atoms.get_potential_energy(),
            "energies": atoms.get_potential_energies(),
            "forces": atoms.get_forces(),
        }
        if kind == "periodic":
            ours["stress"] = atoms.get_stress()
        assert_matches(ours, ref, len(atoms), exact=radial == "mlp")
        energies.append(ours["energy"])
    assert len({round(e, 6) for e in energies}) == len(CHARGE_SPIN)  # the inputs matter


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("radial", ["table", "mlp"])
def test_omol0_float32_close_to_float64(radial: str, device: str, workdir: Path) -> None:
    """float32 (tables, float32's default, or the per-edge RadialMLP) against the CPU's exact
    float64."""
    model, path = converted("omol0", workdir)
    atoms = omol_structure("periodic", seed=2)
    atoms.info.update(charge=-1, spin=2)
    f64 = e3fuse_eval(path, atoms, "float64", "cpu", radial="mlp")
    f32 = e3fuse_eval(path, atoms, "float32", device, radial=radial)
    assert_float32_close(model, atoms, f32, f64)


def test_omol0_cuda_runs_the_per_edge_mlp(workdir: Path) -> None:
    """CUDA no longer refuses the non-linear block's per-edge RadialMLP: radial="mlp" and
    float64's default ("auto", the same path) give the same numbers, the CPU's to rounding."""
    from e3fuse import _core

    if not _core.cuda_available():
        pytest.skip("e3fuse built without CUDA or no GPU")
    _, path = converted("omol0", workdir)
    atoms = molecule(seed=3)
    atoms.info.update(charge=1, spin=2)
    exact = e3fuse_eval(path, atoms, "float64", "cuda", radial="mlp")
    default = e3fuse_eval(path, atoms, "float64", "cuda", radial="auto")
    cpu = e3fuse_eval(path, atoms, "float64", "cpu", radial="mlp")
    assert np.array_equal(exact["forces"], default["forces"])
    assert np.array_equal(exact["energies"], default["energies"])
    assert np.abs(exact["forces"] - cpu["forces"]).max() < 1e-11
    assert abs(exact["energy"] - cpu["energy"]) / len(atoms) < ENERGY_PER_ATOM_F64


def test_omol0_charge_spin_in_lammps(workdir: Path, tmp_path: Path) -> None:
    """pair_style e3fuse ... charge Q spin S on 1 rank (comm images) and 2 ranks (comm
    exchange) equals the ASE calculator with atoms.info (float64, CPU)."""
    lammps_tests = pytest.importorskip("test_lammps")
    from helpers_lammps import parse_lmp, run_lmp

    _, path = converted("omol0", workdir)
    atoms = lammps_tests.lammps_frame(omol_structure("periodic", seed=4))
    for ranks, info in ((1, {"charge": -2, "spin": 3}), (2, {"charge": 1, "spin": 2})):
        style = f"charge {info['charge']} spin {info['spin']}"
        if ranks > 1:
            style += " comm exchange"
        run = tmp_path / f"np{ranks}"
        proc = run_lmp(run, lammps_tests.lmp_input(atoms, path, style), ranks)
        got = parse_lmp(run, proc)
        assert ("comm exchange" if ranks > 1 else "comm images") in proc.stdout
        expected = atoms.copy()
        expected.info.update(info)
        ours = e3fuse_eval(path, expected, "float64", "cpu")
        n = len(atoms)
        assert abs(float(got["energy"]) - ours["energy"]) / n < ENERGY_PER_ATOM_F64
        assert np.abs(got["energies"] - ours["energies"]).max() < ENERGY_PER_ATOM_F64
        assert np.abs(got["forces"] - ours["forces"]).max() < FORCES_F64
        # virial (LAMMPS order xx yy zz xy xz yz) = -stress * volume (ASE order)
        stress = -got["virial"][[0, 1, 2, 5, 4, 3]] / atoms.get_volume()
        assert np.abs(stress - ours["stress"]).max() < STRESS_F64


# --------------------------------------------------------------------------------------
# MACE-MH-1
# --------------------------------------------------------------------------------------


def test_mh1_architecture(workdir: Path) -> None:
    """MH-1's options (mace-torch 0.3.16 attribute names), and the converted file: ZBL,
    Agnesi, two non-linear layers, one head's readout."""
    model, _ = converted("mh1", workdir, "omat_pbe")
    assert model.heads == MH1_HEADS
    assert [type(i).__name__ for i in model.interactions] == [BLOCK] * 2
    assert not model.radial_embedding.apply_cutoff
    assert model.radial_embedding.out_dim == 10
    assert hasattr(model, "pair_repulsion_fn")
    contraction = model.products[0].symmetric_contractions.contractions[0]
    assert contraction.weights_max.shape[0] == 1  # use_agnostic_product
    assert str(model.interactions[0].linear_up.irreps_out) == "8x0e"  # use_edge_irreps_first
    assert str(model.interactions[1].linear_up.irreps_out) == "8x0e+8x1o"
    arch, _store = mace_convert.extract(mace_convert.load_mace_model(model), {}, head="omol")
    assert arch["radial"]["transform"]["kind"] == "agnesi"
    assert "pair_repulsion" in arch
    assert arch["source"]["head"] == "omol"


def test_mh1_head_is_required(workdir: Path, tmp_path: Path) -> None:
    model, _ = converted("mh1", workdir, "omat_pbe")
    with pytest.raises(mace_convert.UnsupportedModel, match="several heads.*spice_wB97M"):
        mace_convert.convert(model, tmp_path / "no-head.e3f")
    with pytest.raises(ValueError, match="'pbe' not in the model's heads"):
        mace_convert.convert(model, tmp_path / "bad-head.e3f", head="pbe")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head", ["omat_pbe", "omol"])
def test_mh1_matches_mace_torch(head: str, device: str, workdir: Path) -> None:
    """float64 against mace-torch, the RadialMLP exactly per edge (radial="mlp")."""
    check_mh1(head, device, "mlp", workdir)


@pytest.mark.parametrize("device", CUDA_ONLY)
def test_mh1_tables_match_mace_torch(device: str, workdir: Path) -> None:
    """radial="table" in float64 on CUDA: within the tables' bounds."""
    check_mh1("omat_pbe", device, "table", workdir)


def check_mh1(head: str, device: str, radial: str, workdir: Path) -> None:
    model, path = converted("mh1", workdir, head)
    atoms = mh1_alloy(seed=11)
    ref = reference.evaluate_mace(reference.mace_calculator(model, "float64", head=head), atoms)
    ours = e3fuse_eval(path, atoms, "float64", device, radial=radial)
    assert_matches(ours, ref, len(atoms), exact=radial == "mlp")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("radial", ["table", "mlp"])
def test_mh1_float32_close_to_float64(radial: str, device: str, workdir: Path) -> None:
    model, path = converted("mh1", workdir, "omol")
    atoms = mh1_alloy(seed=12)
    f64 = e3fuse_eval(path, atoms, "float64", "cpu", radial="mlp")
    f32 = e3fuse_eval(path, atoms, "float32", device, radial=radial)
    assert_float32_close(model, atoms, f32, f64, head="omol")
