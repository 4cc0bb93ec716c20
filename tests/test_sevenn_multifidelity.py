"""SevenNet multi-fidelity (modal) models and self_connection_type 'nequip'.

- 7net-mf-0 with its real weights (it ships in the sevenn wheel), each modality,
  against sevenn's SevenNetCalculator(modal=...) on the model built in float64.
- Random-weight models with the architectures of 7net-mf-ompa, 7net-omni and
  7net-omat (their checkpoints cannot be downloaded here), built by sevenn's own
  model builder from the settings of sevenn/presets/mf_ompa_fine_tune.yaml and
  sevenn's documentation of its pretrained models (docs/source/user_guide/pretrained.md
  of the SevenNet repository). Exact: lmax 3, 5 layers, the irreps pattern and
  parity of the preset (mf-ompa, omni: parity full with the 0o scalars of layer 3;
  omat: parity partial, as the documentation says), self_connection_type 'nequip',
  the modality structure (mf-ompa: 2 modalities mpa / omat24; omni: its 13 task
  names; modal self-interaction in and out and modal output block, modal-wise
  shift, not modal node embedding, as the preset), cutoff 6 A with the XPLOR
  envelope from 5.5 A, 8 Bessel functions, radial MLP 64-64, univ species (119
  slots, Z = 0 included). Shrunk for CPU time: the channels (128 -> 32, every
  multiplicity divided by 4). Chosen (values, not structure): convolution
  denominator and energy scale, see _architecture. Assumed where no source says:
  omni and omat use the mf-ompa preset's settings otherwise (cutoff, envelope,
  self-connection); omni enables modal node embedding too, to cover that path.
- Errors: missing, unknown or unexpected modality.

Tolerances: float64 against the float64-built reference 1e-10 eV/A (forces),
1e-12 eV/atom (energies); float32 within 3e-5 eV/A of float64."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import (
    DEVICES,
    STRUCTURES,
    TOLERANCES,
    ModelCache,
    assert_abs,
    assert_rel,
    calculator,
    central_difference_forces,
    evaluate,
    random_rotation,
)

torch = pytest.importorskip("torch")
pytest.importorskip("sevenn")

from helpers_sevenn import random_sevenn_model  # noqa: E402

from e3fuse import _core, reference  # noqa: E402
from e3fuse.convert import sevennet  # noqa: E402

MF0_MODALS = ("R2SCAN", "PBE")  # 7net-mf-0's modal_map, sevenn's own names

# The limits for float64 against the float64-built upstream model.
EXACT_FORCES = 1e-10  # eV/A
EXACT_ENERGY_PER_ATOM = 1e-12  # eV
EXACT_STRESS = 1e-12  # eV/A^3

OMNI_TASKS = [
    "mpa",
    "omat24",
    "matpes_pbe",
    "matpes_r2scan",
    "mp_r2scan",
    "oc20",
    "oc22",
    "odac23",
    "omol25_low",
    "omol25_high",
    "spice",
    "qcml",
    "pet_mad",
]


def _shrunk(irreps: str, factor: int = 4) -> str:
    """'128x0e+64x1o' -> '32x0e+16x1o' (channels divided by `factor`)."""
    out = []
    for term in irreps.split("+"):
        mul, ir = term.split("x")
        out.append(f"{int(mul) // factor}x{ir}")
    return "+".join(out)


# sevenn/presets/mf_ompa_fine_tune.yaml, model section (channels shrunk by 4)
MF_OMPA_IRREPS = [
    "128x0e",
    "128x0e+64x1o+32x2e+32x3o",
    "128x0e+64x1o+64x1e+32x2o+32x2e+32x3o+32x3e",
    "128x0o+128x0e+64x1o+64x1e+32x2o+32x2e+32x3o+32x3e",
    "128x0e+64x1o+32x2e+32x3o",
    "128x0e",
]
# parity partial (all irreps even), as 7net-l3i5
OMAT_IRREPS = [
    "128x0e",
    "128x0e+64x1e+32x2e+32x3e",
    "128x0e+64x1e+32x2e+32x3e",
    "128x0e+64x1e+32x2e+32x3e",
    "128x0e+64x1e+32x2e+32x3e",
    "128x0e",
]


def _architecture(name: str) -> dict[str, Any]:
    common = {
        "cutoff": 6.0,
        "channel": 32,
        "lmax": 3,
        "num_convolution_layer": 5,
        "radial_basis": {"radial_basis_name": "bessel", "bessel_basis_num": 8},
        "cutoff_function": {"cutoff_function_name": "XPLOR", "cutoff_on": 5.5},
        "act_radial": "silu",
        "weight_nn_hidden_neurons": [64, 64],
        "act_scalar": {"e": "silu", "o": "tanh"},
        "act_gate": {"e": "silu", "o": "tanh"},
        "use_bias_in_linear": False,
        "self_connection_type": "nequip",
        "interaction_type": "nequip",
        "readout_as_fcn": False,
        # random weights with the real models' avg_num_neigh (~35) give forces of
        # 1e-2 .. 1e-7 eV/A; a smaller denominator (and, for omat, a larger energy
        # scale) makes them O(0.1) eV/A, so that the absolute limits mean something
        "conv_denominator": 3.0,
        "scale": 1.7,
    }
    if name == "mf-ompa":
        return {
            **common,
            "irreps_manual": [_shrunk(i) for i in MF_OMPA_IRREPS],
            "is_parity": True,
            "modalities": ["mpa", "omat24"],
            "use_modal_node_embedding": False,
        }
    if name == "omni":
        return {
            **common,
            "irreps_manual": [_shrunk(i) for i in MF_OMPA_IRREPS],
            "is_parity": True,
            "modalities": OMNI_TASKS,
            "use_modal_node_embedding": True,
        }
    if name == "omat":
        return {
            **common,
            "irreps_manual": [_shrunk(i) for i in OMAT_IRREPS],
            "is_parity": False,
            "modalities": [],
            "scale": 1000.0,
        }
    raise KeyError(name)


def build_random_sevenn(name: str, seed: int = 0) -> tuple[Any, dict[str, Any]]:
    """A sevenn model of architecture `name` with random weights, built in float64
    by sevenn's own builder (sevenn.model_build.build_E3_equivariant_model)."""
    arch = _architecture(name)
    modalities = arch.pop("modalities")
    return random_sevenn_model(
        arch, species=None, modalities=modalities, seed=seed, modal_shift_spread=0.5
    )


class RandomModels:
    """Random-weight sevenn models, their .e3f files per modality and float64
    reference calculators, built once per session."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._built: dict[str, tuple[Any, dict[str, Any]]] = {}
        self._paths: dict[tuple[str, str | None], Path] = {}
        self._calcs: dict[tuple[str, str | None], Any] = {}

    def built(self, name: str) -> tuple[Any, dict[str, Any]]:
        if name not in self._built:
            self._built[name] = build_random_sevenn(name)
        return self._built[name]

    def path(self, name: str, modal: str | None) -> Path:
        key = (name, modal)
        if key not in self._paths:
            model, config = self.built(name)
            path = self.directory / f"{name}-{modal}.e3f"
            sevennet.convert_model(model, config, path, modal=modal, name=f"random {name}")
            self._paths[key] = path
        return self._paths[key]

    def reference(self, name: str, modal: str | None) -> Any:
        key = (name, modal)
        if key not in self._calcs:
            model, _ = self.built(name)
            self._calcs[key] = reference.sevenn_calculator(model, "float64", modal)
        return self._calcs[key]


@pytest.fixture(scope="session")
def random_models(tmp_path_factory: pytest.TempPathFactory) -> RandomModels:
    return RandomModels(tmp_path_factory.mktemp("random_sevenn"))


_MF0_PATHS: dict[str, Path] = {}
_MF0_REFERENCES: dict[str, Any] = {}


def mf0_path(models: ModelCache, modal: str) -> Path:
    if modal not in _MF0_PATHS:
        path = models.directory / f"7net-mf-0-{modal}.e3f"
        sevennet.convert("7net-mf-0", path, modal=modal)
        _MF0_PATHS[modal] = path
    return _MF0_PATHS[modal]


def mf0_reference(modal: str) -> Any:
    if modal not in _MF0_REFERENCES:
        _MF0_REFERENCES[modal] = reference.sevenn_calculator("7net-mf-0", "float64", modal)
    return _MF0_REFERENCES[modal]


def compare_exact(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray], label: str) -> None:
    n = len(ours["forces"])
    assert_abs(ours["energy"] / n, ref["energy"] / n, EXACT_ENERGY_PER_ATOM, f"{label}: E/atom")
    assert_abs(ours["energies"], ref["energies"], EXACT_ENERGY_PER_ATOM, f"{label}: energies")
    assert_abs(ours["forces"], ref["forces"], EXACT_FORCES, f"{label}: forces")
    assert ("stress" in ours) == ("stress" in ref)
    if "stress" in ref:
        assert_abs(ours["stress"], ref["stress"], EXACT_STRESS, f"{label}: stress")


def compare_float32(ours32: dict[str, np.ndarray], ours64: dict[str, np.ndarray], label: str):
    tol = TOLERANCES["float32"]
    n = len(ours64["forces"])
    assert_abs(ours32["energy"] / n, ours64["energy"] / n, tol.energy_per_atom, f"{label}: E/atom")
    assert_abs(ours32["energies"], ours64["energies"], tol.energy_per_atom, f"{label}: energies")
    assert_abs(ours32["forces"], ours64["forces"], tol.forces, f"{label}: forces")
    if "stress" in ours64:
        assert_abs(ours32["stress"], ours64["stress"], tol.stress, f"{label}: stress")


# --------------------------------------------------------------------------------------
# 7net-mf-0, real weights
# --------------------------------------------------------------------------------------

MF0_STRUCTURES = ["cunio_alloy", "mgo", "ethanol", "slab"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("structure_name", MF0_STRUCTURES)
@pytest.mark.parametrize("modal", MF0_MODALS)
def test_mf0_matches_sevenn(
    models: ModelCache, modal: str, structure_name: str, device: str
) -> None:
    atoms = STRUCTURES[structure_name]()
    ref = reference.evaluate(mf0_reference(modal), atoms)
    ours = evaluate(calculator(mf0_path(models, modal), "float64", device), atoms)
    compare_exact(ours, ref, f"7net-mf-0 {modal} {structure_name} float64 {device}")
    ours32 = evaluate(calculator(mf0_path(models, modal), "float32", device), atoms)
    compare_float32(ours32, ours, f"7net-mf-0 {modal} {structure_name} float32 {device}")


def test_mf0_modalities_differ_and_are_recorded(models: ModelCache) -> None:
    """The modality changes the model (folded biases, modal-wise shift), and the
    file says which one it holds (source metadata, `e3fuse info`)."""
    atoms = STRUCTURES["cunio_alloy"]()
    results = {m: evaluate(calculator(mf0_path(models, m)), atoms) for m in MF0_MODALS}
    assert abs(results["PBE"]["energy"] - results["R2SCAN"]["energy"]) > 1e-3
    assert np.abs(results["PBE"]["forces"] - results["R2SCAN"]["forces"]).max() > 1e-4
    for modal in MF0_MODALS:
        summary = _core.Model.load(str(mf0_path(models, modal))).summary()
        assert f"modal={modal}" in summary, summary


def test_mf0_folded_linear_matches_sevenn(models: ModelCache) -> None:
    """The fold itself: sevenn's modal IrrepsLinear (one-hot of the modality
    appended to its input) against e3fuse's folded linear on random inputs."""
    import sevenn._keys as KEY

    sevenn_model = mf0_reference("PBE").model
    probe = _core.OpsProbe(_core.Model.load(str(mf0_path(models, "PBE"))))
    modal_index = sevenn_model.modal_map["PBE"]
    rng = np.random.default_rng(3)
    for name, key in (
        ("layers.0.linear_1", "0_self_interaction_1"),
        ("layers.2.linear_2", "2_self_interaction_2"),
        ("readout.0", "reduce_input_to_hidden"),
    ):
        module = sevenn_model._modules[key]
        assert module.num_modalities == 2
        x = rng.standard_normal((7, module._irreps_in_wo_modal.dim))
        onehot = torch.zeros(2, dtype=torch.float64)
        onehot[modal_index] = 1.0
        data = {module.key_input: torch.from_numpy(x), module.key_modal_attr: onehot}
        with torch.no_grad():
            expected = module(data)[module.key_output].numpy()
        got = probe.linear(name, x)
        assert_rel(got, expected, 1e-14, f"{name}: folded modal linear")
    assert KEY.MODAL_ATTR == "modal_attr"


# --------------------------------------------------------------------------------------
# Random weights, architectures of 7net-mf-ompa, 7net-omni, 7net-omat
# --------------------------------------------------------------------------------------

RANDOM_CASES = [
    ("mf-ompa", "mpa"),
    ("mf-ompa", "omat24"),
    ("omni", "mpa"),
    ("omni", "omol25_low"),
    ("omat", None),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("structure_name", ["cunio_alloy", "ethanol"])
@pytest.mark.parametrize(("arch", "modal"), RANDOM_CASES)
def test_random_architecture_matches_sevenn(
    random_models: RandomModels, arch: str, modal: str | None, structure_name: str, device: str
) -> None:
    atoms = STRUCTURES[structure_name]()
    ref = reference.evaluate(random_models.reference(arch, modal), atoms)
    path = random_models.path(arch, modal)
    ours = evaluate(calculator(path, "float64", device), atoms)
    label = f"random {arch} {modal} {structure_name}"
    compare_exact(ours, ref, f"{label} float64 {device}")
    ours32 = evaluate(calculator(path, "float32", device), atoms)
    compare_float32(ours32, ours, f"{label} float32 {device}")


def test_random_mf_ompa_has_per_species_self_connection(random_models: RandomModels) -> None:
    summary = _core.Model.load(str(random_models.path("mf-ompa", "mpa"))).summary()
    assert "self-connection per species" in summary
    assert "modal=mpa" in summary
    # univ: sevenn's species slot Z = 0 is not an element; the file holds Z = 1..118
    assert _core.Model.load(str(random_models.path("mf-ompa", "mpa"))).atomic_numbers == list(
        range(1, 119)
    )


def test_random_mf_ompa_forces_finite_differences(random_models: RandomModels) -> None:
    """Forces = -dE/dx (central differences, h = 1e-4 A) through the per-species
    self-connection and the folded modal layers."""
    atoms = STRUCTURES["ethanol"]()
    calc = calculator(random_models.path("mf-ompa", "omat24"), "float64")
    forces = evaluate(calc, atoms)["forces"]
    h = 1e-4
    chosen = [0, 3, 7]
    fd = central_difference_forces(calc, atoms, chosen, h)
    assert_rel(forces[chosen], fd, 1e-6, "forces vs -dE/dx (central FD)")


def test_random_omni_rotation_translation_invariance(random_models: RandomModels) -> None:
    """Built in float64, the model's constants are float64: invariance holds to
    float64 rounding (the parity-full omni architecture is O(3)-invariant, so a
    reflection is checked too)."""
    atoms = STRUCTURES["cunio_alloy"]()
    path = random_models.path("omni", "mpa")
    before = evaluate(calculator(path), atoms)
    R = random_rotation(31)
    for label, M in (("rotation", R), ("reflection", R @ np.diag([-1.0, 1.0, 1.0]))):
        moved = atoms.copy()
        moved.positions = atoms.positions @ M.T + np.array([1.3, -7.2, 0.4])
        moved.set_cell(atoms.cell.array @ M.T, scale_atoms=False)
        after = evaluate(calculator(path), moved)
        assert_rel(after["energy"], before["energy"], 1e-12, f"energy under {label}")
        assert_rel(after["energies"], before["energies"], 1e-11, f"energies under {label}")
        assert_rel(after["forces"], before["forces"] @ M.T, 1e-10, f"forces under {label}")
        xx, yy, zz, yz, xz, xy = before["stress"]
        s = np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
        xx, yy, zz, yz, xz, xy = after["stress"]
        s2 = np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
        assert_rel(s2, M @ s @ M.T, 1e-10, f"stress under {label}")


# --------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------


def test_missing_modality_lists_the_available(tmp_path: Path) -> None:
    with pytest.raises(sevennet.ModalityError, match="choose a modality.*R2SCAN, PBE"):
        sevennet.convert("7net-mf-0", tmp_path / "x.e3f")
    assert not (tmp_path / "x.e3f").exists()


def test_unknown_modality_lists_the_available(tmp_path: Path) -> None:
    with pytest.raises(sevennet.ModalityError, match="unknown modality 'pbe'.*R2SCAN, PBE"):
        sevennet.convert("7net-mf-0", tmp_path / "x.e3f", modal="pbe")


def test_modality_for_a_single_fidelity_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(sevennet.ModalityError, match="not multi-fidelity"):
        sevennet.convert("7net-0", tmp_path / "x.e3f", modal="PBE")


def test_cli_modal_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from e3fuse import cli

    out = tmp_path / "mf0.e3f"
    assert cli.main(["convert", "sevennet", "7net-mf-0", "-o", str(out), "--no-verify"]) == 1
    assert "R2SCAN, PBE" in capsys.readouterr().err
    args = ["convert", "sevennet", "7net-mf-0", "--modal", "HSE", "-o", str(out), "--no-verify"]
    assert cli.main(args) == 1
    assert "unknown modality 'HSE'" in capsys.readouterr().err
    assert not out.exists()


def test_cli_convert_with_modal_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`e3fuse convert sevennet 7net-mf-0 --modal PBE` converts, verifies against
    sevenn with that modality, and `e3fuse info` shows the modality."""
    from e3fuse import cli

    out = tmp_path / "mf0-pbe.e3f"
    assert cli.main(["convert", "sevennet", "7net-mf-0", "--modal", "PBE", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "verification" in printed
    assert cli.main(["info", str(out)]) == 0
    assert "modal=PBE" in capsys.readouterr().out


def test_per_species_self_connection_paths_are_padded() -> None:
    """A species whose probed path weights are all zero (left out by the probe) gets
    that path with zeros: every species has the same paths (the CUDA tables)."""
    from e3fuse.modelfile import TensorStore

    store = TensorStore()
    full = [
        {"in": 0, "out": 0, "weight": store.add("sc.e0.path.0.0", np.ones((2, 3)))},
        {"in": 1, "out": 1, "weight": store.add("sc.e0.path.1.1", np.ones((4, 4)))},
    ]
    partial = [{"in": 1, "out": 1, "weight": store.add("sc.e1.path.1.1", np.ones((4, 4)))}]
    desc = {"elements": [{"paths": full}, {"paths": partial}]}
    sevennet._same_paths_per_species(desc, "sc", store)
    padded = desc["elements"][1]["paths"]
    assert [(p["in"], p["out"]) for p in padded] == [(0, 0), (1, 1)]
    assert not store.arrays[padded[0]["weight"]].any()
    assert store.arrays[padded[0]["weight"]].shape == (2, 3)
