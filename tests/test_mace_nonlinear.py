"""mace-torch 0.3.16's RealAgnosticResidualNonLinearInteractionBlock (MACE-OMOL-0's
interaction): the radial MLP (Linear-LayerNorm-SiLU) of the Bessel embedding and the source /
target species embeddings, the density normalisation alpha + beta rho with its own RadialMLP,
linear_res, the gated non-linearity and linear_2 (issue 20).

e3fuse evaluates the block's RadialMLPs from per-ordered-species-pair radial tables
(radial="table", both devices), or exactly per edge in double (radial="mlp", float64's
default: the reference, to 1e-10 eV/A of mace-torch), on the CPU and on CUDA (there through a
per-edge array of the weights, cuda/conv.cuh). With several elements the two directions of an
edge have different radial weights (source and target embeddings): the OMOL-like model has
three.

Small OMOL-like models (two non-linear interactions, correlation 3, edge irreps up to l = 2,
a distance transform, apply_cutoff False) with random weights, built in float64 and in
float32 through tests/helpers_mace.py's build_mace; compared with mace-torch built in float64.
The tables are accurate to float32 rounding (ops/radial_table.h), so float64 e3fuse agrees
with upstream to about 1e-7 relative, and float32 within 3e-5 eV/A; the tables are C1 in r,
so finite differences of e3fuse's own energy check its forces and stress to 1e-6."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mace.modules")

from conftest import DEVICES, assert_regions_match_one_pass  # noqa: E402
from helpers_mace import (  # noqa: E402
    FORCES_F32,
    build_mace,
    e3fuse_eval,
    finite_difference_forces,
    finite_difference_stress,
    structure,
)

from e3fuse import reference  # noqa: E402
from e3fuse.convert import mace as mace_convert  # noqa: E402

BLOCK = "RealAgnosticResidualNonLinearInteractionBlock"
ELEMENT = (6,)
ELEMENTS = (1, 6, 8)
ARCHS: dict[str, dict[str, Any]] = {
    # MACE-OMOL-0's layout scaled down: non-linear blocks first and after, edge irreps
    "omol-like": dict(
        hidden="8x0e+8x1o",
        max_ell=2,
        correlation=3,
        interaction=BLOCK,
        interaction_first=BLOCK,
        edge_irreps="8x0e+8x1o+8x2e",
        distance_transform="Agnesi",
        apply_cutoff=False,
        use_agnostic_product=True,
        elements=ELEMENTS,
    ),
    # the plain options: apply_cutoff True, no transform, no edge irreps, linear-only 3 layers
    "plain": dict(
        hidden="8x0e+8x1o",
        max_ell=2,
        correlation=2,
        num_interactions=3,
        interaction=BLOCK,
        interaction_first=BLOCK,
        elements=ELEMENT,
    ),
}
# Radial tables: value error <= 1e-7, derivative <= 1e-6 of each weight's largest magnitude
# (measured: forces 3e-7 / 7e-7 eV/A of 4 / 16 eV/A, energies 1e-9 eV/atom of ~400 eV/atom)
FORCES_TABLE, ENERGY_PER_ATOM_TABLE, STRESS_TABLE = 3e-6, 1e-7, 1e-6
RADIAL_SCALE = 0.05

_CACHE: dict[tuple[str, str], tuple[Any, Path]] = {}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: Any) -> Path:
    return tmp_path_factory.mktemp("mace_nonlinear")


def _build(name: str, dtype: str = "float64", elements: tuple[int, ...] | None = None) -> Any:
    from e3nn import o3

    options = dict(ARCHS[name])
    if elements is not None:
        options["elements"] = elements
    if "edge_irreps" in options:
        options["edge_irreps"] = o3.Irreps(options["edge_irreps"])
    model = build_mace(**options)
    # build_mace's weight noise makes this block's messages large (they are divided by
    # alpha + beta rho ~ 20, not by the number of neighbours): scale its radial weights down
    # to O(1) features, forces of a few eV/A
    with torch.no_grad():
        for inter in model.interactions:
            last = inter.conv_tp_weights.net[-1]
            last.weight.mul_(RADIAL_SCALE)
            last.bias.mul_(RADIAL_SCALE)
    if dtype == "float32":  # built in float32 (its constants so), the float64 model's weights
        model32 = build_mace(**options, dtype=torch.float32)
        params = {k: v.float() for k, v in model.named_parameters()}
        missing = model32.load_state_dict(params, strict=False).missing_keys
        assert not set(missing) & set(params)
        return model32.eval()
    return model


def converted(name: str, workdir: Path, dtype: str = "float64") -> tuple[Any, Path]:
    key = (name, dtype)
    if key not in _CACHE:
        model = _build(name, dtype)
        path = workdir / f"{name}-{dtype}.e3f"
        mace_convert.convert(model, path)
        _CACHE[key] = (model, path)
    return _CACHE[key]


def evaluate(
    path: Path, atoms: Any, device: str, dtype: str = "float64", radial: str = "table"
) -> dict[str, Any]:
    """e3fuse_eval with stress and stresses; radial tables unless `radial` says ("mlp": the
    exact per-edge RadialMLP)."""
    return e3fuse_eval(path, atoms, dtype, device, radial=radial, stress=True, stresses=True)


def test_model_has_the_block() -> None:
    model = _build("omol-like")
    assert all(type(i).__name__ == BLOCK for i in model.interactions)
    inter = model.interactions[1]
    assert type(inter.conv_tp_weights).__name__ == "RadialMLP"
    assert any(isinstance(m, torch.nn.LayerNorm) for m in inter.conv_tp_weights.net)
    assert not model.radial_embedding.apply_cutoff


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(ARCHS))
def test_nonlinear_block_matches_mace_torch(name: str, device: str, workdir: Path) -> None:
    model, path = converted(name, workdir)
    atoms = structure(ARCHS[name]["elements"], seed=1)
    ref = reference.evaluate_mace(reference.mace_calculator(model, "float64"), atoms)
    ours = evaluate(path, atoms, device)
    n = len(atoms)
    # the comparison is not trivial: forces of 4-16 eV/A here (torch 2.13 CPU); torch builds
    # draw other random weights (0.01-0.2 eV/A on the GPU machine's torch)
    assert np.abs(ref["forces"]).max() > 1e-3
    assert abs(ours["energy"] - float(ref["energy"])) / n < ENERGY_PER_ATOM_TABLE
    assert np.abs(ours["energies"] - ref["energies"]).max() < ENERGY_PER_ATOM_TABLE
    assert np.abs(ours["forces"] - ref["forces"]).max() < FORCES_TABLE
    assert np.abs(ours["stress"] - ref["stress"]).max() < STRESS_TABLE
    assert np.abs(ours["stresses"].sum(axis=0) - ours["stress"]).max() < 1e-12


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(ARCHS))
def test_nonlinear_block_float32(name: str, device: str, workdir: Path) -> None:
    """e3fuse float32 of the float32-built model against mace-torch built in float64."""
    model64, _ = converted(name, workdir)
    _, path32 = converted(name, workdir, "float32")
    atoms = structure(ARCHS[name]["elements"], seed=2)
    ref = reference.evaluate_mace(reference.mace_calculator(model64, "float64"), atoms)
    f32 = evaluate(path32, atoms, device, "float32")
    assert np.abs(f32["forces"] - ref["forces"]).max() < FORCES_F32
    # float32 weights and float32 sums of ~400 eV per atom
    assert abs(f32["energy"] - float(ref["energy"])) < 2e-6 * abs(float(ref["energy"]))


@pytest.mark.parametrize("device", DEVICES)
def test_nonlinear_block_finite_differences(device: str, workdir: Path) -> None:
    """Forces and stress against central differences of e3fuse's own float64 energy."""
    _, path = converted("omol-like", workdir)
    atoms = structure(ELEMENTS, seed=3)
    ours = evaluate(path, atoms, device)
    options = dict(h=1e-5, device=device, radial="table")
    entries = [(0, 0), (3, 1), (7, 2)]
    for (i, axis), fd in zip(entries, finite_difference_forces(path, atoms, entries, **options)):
        assert abs(fd - ours["forces"][i, axis]) < 1e-6
    voigt, components = [0, 5], [(0, 0), (0, 1)]
    for k, fd in zip(voigt, finite_difference_stress(path, atoms, components, **options)):
        assert abs(fd - ours["stress"][k]) < 1e-6


@pytest.mark.parametrize("device", DEVICES)
def test_nonlinear_block_rotation_invariance(device: str, workdir: Path) -> None:
    from scipy.spatial.transform import Rotation

    _, path = converted("omol-like", workdir)
    atoms = structure(ELEMENTS, seed=4)
    rot = Rotation.from_euler("zyx", [0.3, -1.1, 2.0]).as_matrix()
    rotated = atoms.copy()
    rotated.set_cell(atoms.cell.array @ rot.T, scale_atoms=True)
    a, b = evaluate(path, atoms, device), evaluate(path, rotated, device)
    assert abs(a["energy"] - b["energy"]) < 1e-9
    assert np.abs(a["forces"] @ rot.T - b["forces"]).max() < 1e-9


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(ARCHS))
def test_exact_radial_mlp_matches_mace_torch(name: str, device: str, workdir: Path) -> None:
    """float64, the RadialMLP evaluated per edge (radial="mlp", the float64 default): the
    targets of every other model, 1e-10 eV/A and 1e-12 eV/atom, on each device."""
    model, path = converted(name, workdir)
    atoms = structure(ARCHS[name]["elements"], seed=1)
    ref = reference.evaluate_mace(reference.mace_calculator(model, "float64"), atoms)
    ours = evaluate(path, atoms, device, radial="mlp")
    n = len(atoms)
    assert np.abs(ref["forces"]).max() > 1e-3
    # these random weights give ~750 eV per atom, where 1e-12 eV is 9 float64 ulps: the
    # per-atom limit is 1e-12 eV or 16 ulps of the largest per-atom energy
    per_atom = max(1e-12, 16 * np.finfo(float).eps * np.abs(ref["energies"]).max())
    assert abs(ours["energy"] - float(ref["energy"])) / n < 1e-12
    assert np.abs(ours["energies"] - ref["energies"]).max() < per_atom
    assert np.abs(ours["forces"] - ref["forces"]).max() < 1e-10
    assert np.abs(ours["stress"] - ref["stress"]).max() < 1e-12
    assert np.abs(ours["stresses"].sum(axis=0) - ours["stress"]).max() < 1e-12
    # the tables of the other tests stay within their bound of the exact path
    table = evaluate(path, atoms, device, radial="table")
    assert np.abs(table["forces"] - ours["forces"]).max() < FORCES_TABLE


@pytest.mark.parametrize("device", DEVICES)
def test_exact_radial_mlp_finite_differences(device: str, workdir: Path) -> None:
    """The exact path's forces against central differences of its own energy."""
    _, path = converted("omol-like", workdir)
    atoms = structure(ELEMENTS, seed=6)
    ours = evaluate(path, atoms, device, radial="mlp")
    entries = [(1, 0), (4, 2), (6, 1)]
    fds = finite_difference_forces(path, atoms, entries, device=device, radial="mlp")
    for (i, axis), fd in zip(entries, fds, strict=True):
        assert abs(fd - ours["forces"][i, axis]) < 1e-7 * max(1.0, abs(fd))


@pytest.mark.parametrize("device", DEVICES)
def test_exact_radial_mlp_float32(device: str, workdir: Path) -> None:
    """float32 with the per-edge RadialMLP (computed in double, stored in float32)."""
    model64, _ = converted("omol-like", workdir)
    _, path32 = converted("omol-like", workdir, "float32")
    atoms = structure(ELEMENTS, seed=2)
    ref = reference.evaluate_mace(reference.mace_calculator(model64, "float64"), atoms)
    f32 = evaluate(path32, atoms, device, "float32", radial="mlp")
    assert np.abs(f32["forces"] - ref["forces"]).max() < FORCES_F32


def test_cuda_runs_the_per_edge_mlp(workdir: Path) -> None:
    """CUDA no longer refuses radial="mlp" for this block: float64's default ("auto") is the
    exact per-edge RadialMLP there too (the same numbers as radial="mlp", and as the CPU's to
    rounding), and radial="table" still runs, within the tables' bound of it."""
    from e3fuse import _core

    if not _core.cuda_available():
        pytest.skip("e3fuse built without CUDA or no GPU")
    _, path = converted("omol-like", workdir)
    atoms = structure(ELEMENTS, seed=5)
    exact = evaluate(path, atoms, "cuda", radial="mlp")
    default = evaluate(path, atoms, "cuda", radial="auto")
    table = evaluate(path, atoms, "cuda", radial="table")
    cpu = evaluate(path, atoms, "cpu", radial="mlp")
    for key in ("energies", "forces", "stress"):
        assert np.array_equal(default[key], exact[key])
    assert np.abs(exact["forces"] - cpu["forces"]).max() < 1e-11
    scale = max(1.0, np.abs(cpu["energies"]).max())  # ~750 eV per atom here
    assert np.abs(exact["energies"] - cpu["energies"]).max() < 1e-13 * scale
    assert np.abs(table["forces"] - exact["forces"]).max() < FORCES_TABLE


@pytest.mark.parametrize("device", DEVICES[1:])  # CUDA's per-edge weights array
def test_exact_radial_mlp_regions_match_one_pass(device: str, workdir: Path) -> None:
    """On CUDA the per-edge RadialMLP weights go to an array sized by the whole graph's edge
    count, known on the host (no read-back of the count, no stream synchronization), and only
    the edges of the rows' receivers are written: region by region (each layer's rows a
    prefix of the nodes, so fewer edges than the graph has) the results equal one pass."""
    _, path = converted("omol-like", workdir)
    atoms = structure(ELEMENTS, seed=8, cubic=True).repeat((4, 1, 1))  # 128 atoms, 29 A long
    assert_regions_match_one_pass(path, atoms, device, "float64", 40, 1e-12)


@pytest.mark.parametrize("radial", ["mlp", "table"])
def test_cuda_halo_overlap(workdir: Path, radial: str) -> None:
    """The CUDA engine's halo exchange overlapped with the convolution of interior rows
    (cuda/halo.cuh) against the CPU engine in float64, with the per-edge RadialMLP
    (radial="mlp": its weights written once for both row sets of a convolution) and with
    the pair tables (test_graph_reuse.overlap_runs)."""
    from test_graph_reuse import assert_overlap_matches, overlap_runs

    from e3fuse import _core

    if not _core.cuda_available():
        pytest.skip("e3fuse built without CUDA or no GPU")
    _, path = converted("omol-like", workdir)
    assert_overlap_matches(overlap_runs(path, "float64", ELEMENTS, radial=radial), "float64")


def test_radial_weights_differ_between_edge_directions() -> None:
    """The premise of the ordered-pair backward: R(r, s_i, s_j) != R(r, s_j, s_i)."""
    model = _build("omol-like")
    inter = model.interactions[1]
    attrs = torch.eye(len(ELEMENTS), dtype=torch.float64)
    source, target = inter.source_embedding(attrs), inter.target_embedding(attrs)
    basis = torch.full((1, model.radial_embedding.out_dim), 0.3, dtype=torch.float64)
    forward = inter.conv_tp_weights(torch.cat([basis, source[:1], target[2:3]], dim=-1))
    backward = inter.conv_tp_weights(torch.cat([basis, source[2:3], target[:1]], dim=-1))
    assert (forward - backward).abs().max() > 1e-3 * forward.abs().max()
