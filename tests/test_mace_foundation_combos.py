"""The feature combinations of the released MACE foundation models, each converted as one
model (the other test files take the features one at a time), at reduced width with random
weights, against mace-torch built in float64 and float32 against float64, on each device:

- MP-0b / 0b2 / 0b3: RealAgnosticInteractionBlock then RealAgnosticResidualInteractionBlock,
  max_ell 3, correlation 3, 10 Bessel functions, the Agnesi distance transform and ZBL pair
  repulsion (mace-torch's `pair_repulsion=True`, `distance_transform="Agnesi"`);
- MPA-0 / OMAT-0 / MATPES: the density blocks (RealAgnosticDensityInteractionBlock then
  RealAgnosticDensityResidualInteractionBlock), Agnesi and ZBL
  (`mace-foundations/mace_omat/mace-omat-medium.sh`).

Width: 32 channels (the released models have 128), hidden irreps 32x0e+32x1o. H, O, Cu and
Au, so that ZBL's pairs end at different radii (0.62 A for H-H, 2.72 A for Au-Au)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mace.modules")

from ase import Atoms  # noqa: E402
from conftest import DEVICES, assert_regions_match_one_pass, evaluate  # noqa: E402
from helpers_mace import (  # noqa: E402
    assert_float32_close,
    converted_once,
    e3fuse_eval,
    structure,
)

from e3fuse import _core, reference  # noqa: E402
from e3fuse.calculator import Calculator  # noqa: E402
from e3fuse.convert import mace as mace_convert  # noqa: E402

ELEMENTS = (1, 8, 29, 79)
COMMON: dict[str, Any] = dict(
    hidden="32x0e+32x1o",
    elements=ELEMENTS,
    r_max=5.0,
    num_interactions=2,
    distance_transform="Agnesi",
    pair_repulsion=True,
    radial_mlp=(16, 16, 16),
)
COMBINATIONS: dict[str, dict[str, Any]] = {
    "mp0b3": dict(COMMON, max_ell=3, correlation=3, num_bessel=10),
    "omat0": dict(
        COMMON,
        max_ell=3,
        correlation=3,
        num_bessel=8,
        interaction_first="RealAgnosticDensityInteractionBlock",
        interaction="RealAgnosticDensityResidualInteractionBlock",
    ),
}

_MODELS: dict[str, tuple[Any, Path]] = {}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: Any) -> Path:
    return tmp_path_factory.mktemp("mace_foundation_combos")


def converted(name: str, workdir: Path) -> tuple[Any, Path]:
    return converted_once(_MODELS, name, workdir, **COMBINATIONS[name], seed=3)


def alloy(seed: int) -> Atoms:
    """32 atoms of H, O, Cu and Au on a strained, rattled fcc lattice, with a Cu-Au pair
    pushed to 1.5 A, inside ZBL's reach (the sum of their covalent radii, 2.68 A)."""
    atoms = structure(ELEMENTS, seed=seed, cubic=True)
    rng = np.random.default_rng(seed)
    numbers = rng.permutation(np.resize(np.array(ELEMENTS), len(atoms)))
    first, second = 0, int(np.argsort(atoms.get_distances(0, range(len(atoms)), mic=True))[1])
    numbers[first], numbers[second] = 29, 79
    atoms.set_atomic_numbers(numbers)
    direction = atoms.get_distance(first, second, mic=True, vector=True)
    atoms.positions[second] = atoms.positions[first] + 1.5 * direction / np.linalg.norm(direction)
    return atoms


def test_converted_architecture(workdir: Path) -> None:
    """Each combination converts to the features it names: ZBL, Agnesi, and the density
    blocks for OMAT-0 only."""
    for name in COMBINATIONS:
        model, _ = converted(name, workdir)
        arch, _store = mace_convert.extract(mace_convert.load_mace_model(model), {})
        assert arch["radial"]["transform"]["kind"] == "agnesi", name
        assert "pair_repulsion" in arch, name
        density = [("density" in layer) for layer in arch["layers"]]
        assert density == ([True, True] if name == "omat0" else [False, False]), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_matches_mace_torch_float64(name: str, device: str, workdir: Path) -> None:
    model, path = converted(name, workdir)
    atoms = alloy(seed=11)
    ref = reference.evaluate_mace(reference.mace_calculator(model, "float64"), atoms)
    ours = e3fuse_eval(path, atoms, "float64", device)
    n = len(atoms)
    assert abs(ours["energy"] - float(ref["energy"])) / n < 1e-12
    assert np.abs(ours["energies"] - ref["energies"]).max() < 1e-12
    assert np.abs(ours["forces"] - ref["forces"]).max() < 1e-10
    assert np.abs(ours["stress"] - ref["stress"]).max() < 1e-12
    assert np.abs(ref["forces"]).max() > 1e-2  # the comparison is not trivial


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_float32_close_to_float64(name: str, device: str, workdir: Path) -> None:
    model, path = converted(name, workdir)
    atoms = alloy(seed=12)
    f64 = e3fuse_eval(path, atoms, "float64", "cpu")
    f32 = e3fuse_eval(path, atoms, "float32", device)
    assert_float32_close(model, atoms, f32, f64)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("device", DEVICES)
def test_regions_match_one_pass(device: str, dtype: str, workdir: Path) -> None:
    """OMAT-0's combination evaluated region by region (compute_system's regions: each layer's
    rows shrink towards the owned atoms, so the density layers' rho and their forces cover
    different nodes, and ZBL counts only owned atoms) equals one pass."""
    _, path = converted("omat0", workdir)
    atoms = alloy(seed=13).repeat((3, 1, 1))  # 96 atoms
    rel = 1e-12 if dtype == "float64" else 1e-5
    assert_regions_match_one_pass(path, atoms, device, dtype, 40, rel)


@pytest.mark.parametrize(
    "dtype, radial", [("float64", "auto"), ("float64", "table"), ("float32", "auto")]
)
def test_cuda_deterministic(dtype: str, radial: str, workdir: Path) -> None:
    """The density layers' and ZBL's edge walks write each node's own sums in a fixed order
    (no atomics): on the GPU, results and per-atom virials are bitwise the same from call to
    call and calculator to calculator, with the densities tabulated or exact."""
    if not _core.cuda_available():
        pytest.skip("e3fuse built without CUDA or no GPU")
    _, path = converted("omat0", workdir)
    atoms = alloy(seed=14).repeat((2, 2, 2))
    runs = []
    for _ in range(2):
        calc = Calculator(str(path), device="cuda", dtype=dtype, radial=radial)
        for _ in range(2):
            calc.reset()  # evaluate anew, not from the last call's results
            runs.append(evaluate(calc, atoms, stresses=True))
    for other in runs[1:]:
        for key in runs[0]:
            np.testing.assert_array_equal(other[key], runs[0][key], err_msg=key)
