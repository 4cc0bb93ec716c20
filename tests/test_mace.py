"""MACE (mace-torch) models: conversion, e3fuse vs mace-torch in float64 and
float32, the symmetric contraction op, finite differences and invariances.

Models are built with random weights by helpers_mace.build_mace (nothing is
downloaded): the MACE-MP-0 small/medium/large architectures as mace-torch's training scripts
build them (RealAgnosticInteractionBlock first, then residual blocks; 128
channels, max_ell 3, correlation 3, 10 Bessel functions, r_max 6, radial MLP
[64, 64, 64], readout MLP 16x0e) on a few elements, and smaller variants."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mace.modules")

from conftest import DEVICES, STRUCTURES, TOLERANCES  # noqa: E402
from helpers_mace import (  # noqa: E402
    build_mace,
    e3fuse_eval,
    finite_difference_forces,
    finite_difference_stress,
    structure,
)

from e3fuse import _core, cli, reference  # noqa: E402
from e3fuse.calculator import Calculator  # noqa: E402
from e3fuse.convert import mace as mace_convert  # noqa: E402

MP0 = dict(
    max_ell=3,
    correlation=3,
    num_bessel=10,
    r_max=6.0,
    radial_mlp=(64, 64, 64),
    mlp_irreps="16x0e",
    elements=(8, 28, 29),
)
ARCHS: dict[str, dict[str, Any]] = {
    "mp0-small": dict(MP0, hidden="128x0e"),
    "mp0-medium": dict(MP0, hidden="128x0e+128x1o"),
    "mp0-large": dict(MP0, hidden="128x0e+128x1o+128x2e"),
    "L0-corr2": dict(hidden="16x0e", max_ell=2, correlation=2),
    "L2-lmax2": dict(hidden="16x0e+16x1o+16x2e", max_ell=2, correlation=2),
    "three-interactions": dict(
        hidden="16x0e+16x1o",
        max_ell=2,
        correlation=[3, 2, 1],
        num_interactions=3,
        radial_mlp=(8, 8, 8),
    ),
    "many-elements": dict(
        hidden="16x0e+16x1o", max_ell=1, correlation=3, elements=(1, 6, 7, 8, 13, 26, 28, 29)
    ),
    "plain-mace-residual-first": dict(
        hidden="16x0e+16x1o",
        max_ell=2,
        correlation=2,
        scale_shift=False,
        first_residual=True,
        p=6,
        num_bessel=4,
        r_max=4.0,
        radial_mlp=(12,),
    ),
}


_CACHE: dict[str, tuple[Any, Path]] = {}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: Any) -> Path:
    return tmp_path_factory.mktemp("mace")


def converted(name: str, workdir: Path) -> tuple[Any, Path]:
    if name not in _CACHE:
        model = build_mace(**ARCHS[name])
        path = workdir / f"{name}.e3f"
        mace_convert.convert(model, path)
        _CACHE[name] = (model, path)
    return _CACHE[name]


@pytest.mark.parametrize("name", list(ARCHS))
def test_matches_mace_torch_float64(name: str, workdir: Path) -> None:
    model, path = converted(name, workdir)
    atoms = structure(ARCHS[name].get("elements", (8, 28, 29)))
    ref = reference.evaluate_mace(reference.mace_calculator(model, "float64"), atoms)
    ours = e3fuse_eval(path, atoms)
    n = len(atoms)
    assert abs(ours["energy"] - float(ref["energy"])) / n < 1e-12
    assert np.abs(ours["energies"] - ref["energies"]).max() < 1e-12
    assert np.abs(ours["forces"] - ref["forces"]).max() < 1e-10
    assert np.abs(ours["stress"] - ref["stress"]).max() < 1e-11
    assert np.abs(ref["forces"]).max() > 1e-3  # the comparison is not trivial


def test_float32_close_to_float64(workdir: Path) -> None:
    _, path = converted("mp0-medium", workdir)
    atoms = structure((8, 28, 29), seed=3)
    f64 = e3fuse_eval(path, atoms, "float64")
    f32 = e3fuse_eval(path, atoms, "float32")
    assert np.abs(f32["forces"] - f64["forces"]).max() < 3e-5
    assert abs(f32["energy"] - f64["energy"]) / len(atoms) < 1e-5


def test_radial_table_matches_the_mlp(workdir: Path) -> None:
    """float64 with the radial MLP tabulated in r (the float32 default) against the MLP:
    only the table's error (values 1e-7, slopes 1e-6 relative) is left."""
    _, path = converted("mp0-medium", workdir)
    atoms = structure((8, 28, 29), seed=5)
    exact = e3fuse_eval(path, atoms, "float64", radial="mlp")
    table = e3fuse_eval(path, atoms, "float64", radial="table")
    scale = np.abs(exact["forces"]).max()
    assert scale > 1e-3
    assert np.abs(table["forces"] - exact["forces"]).max() < 2e-6 * max(1.0, scale)
    assert abs(table["energy"] - exact["energy"]) / len(atoms) < 1e-7
    assert np.abs(table["stress"] - exact["stress"]).max() < 1e-8


def test_open_structure_and_multihead(workdir: Path) -> None:
    """A non-periodic molecule-like cluster, and head selection of a two-head model."""
    model = build_mace("16x0e+16x1o", max_ell=2, correlation=2, heads=["pbe", "r2scan"], seed=5)
    atoms = structure((8, 28, 29), seed=4)
    atoms.pbc = False
    for head in ("pbe", "r2scan"):
        path = workdir / f"multihead-{head}.e3f"
        mace_convert.convert(model, path, head=head)
        ref = reference.evaluate_mace(reference.mace_calculator(model, "float64", head), atoms)
        ours = e3fuse_eval(path, atoms)
        assert abs(ours["energy"] - float(ref["energy"])) / len(atoms) < 1e-10
        assert np.abs(ours["forces"] - ref["forces"]).max() < 1e-9
    with pytest.raises(mace_convert.UnsupportedModel, match="--head"):
        mace_convert.convert(model, workdir / "nohead.e3f")


@pytest.mark.parametrize("device", DEVICES)
def test_symmetric_contraction_op(workdir: Path, device: str) -> None:
    """The core's symmetric contraction and its transpose vs mace-torch's
    SymmetricContraction (and torch autograd) on random inputs."""
    for name in ("mp0-large", "three-interactions"):
        model, path = converted(name, workdir)
        probe = _core.OpsProbe(_core.Model.load(str(path)))
        rng = np.random.default_rng(7)
        num_elements = len(model.atomic_numbers)
        for layer, prod in enumerate(model.products):
            sc = prod.symmetric_contractions
            c = sc.irreps_in[0].mul
            num_ell = sum(ir.dim for _, ir in sc.irreps_in)
            n = 11
            species = rng.integers(0, num_elements, size=n).astype(np.int32)
            x = rng.normal(size=(n, sc.irreps_in.dim))
            xt = torch.from_numpy(x).requires_grad_(True)
            # mace's reshape_irreps: [n, mul, sum of irrep dims]
            fields, ix = [], 0
            for mul, ir in sc.irreps_in:
                fields.append(xt[:, ix : ix + mul * ir.dim].reshape(n, mul, ir.dim))
                ix += mul * ir.dim
            attrs = torch.nn.functional.one_hot(torch.from_numpy(species).long(), num_elements).to(
                torch.float64
            )
            expected = sc(torch.cat(fields, dim=-1), attrs)
            assert expected.shape[1] == c * sum(ir.dim for _, ir in sc.irreps_out)
            ours = probe.symmetric_contraction(layer, x, species, device=device)
            scale = max(1.0, float(expected.detach().abs().max()))
            assert np.abs(ours - expected.detach().numpy()).max() < 1e-12 * scale
            g = rng.normal(size=expected.shape)
            (expected * torch.from_numpy(g)).sum().backward()
            grad = probe.symmetric_contraction_transpose(layer, x, species, g, device=device)
            scale = max(1.0, float(xt.grad.abs().max()))
            assert np.abs(grad - xt.grad.numpy()).max() < 1e-12 * scale
            assert num_ell == sc.irreps_in.dim // c


@pytest.mark.parametrize("device", DEVICES)
def test_element_linear_op(workdir: Path, device: str) -> None:
    """The element-dependent skip linear on 301 nodes of mixed species (on the GPU: several
    node tiles, each with several species): row i equals the same layer run with every node
    of species s_i, and CUDA equals the CPU; forward and transpose."""
    model, path = converted("three-interactions", workdir)
    probe = _core.OpsProbe(_core.Model.load(str(path)))
    rng = np.random.default_rng(11)
    num_elements = len(model.atomic_numbers)
    n = 301
    species = rng.integers(0, num_elements, size=n).astype(np.int32)
    assert len(set(species.tolist())) == num_elements > 1
    for layer, block in enumerate(model.interactions):
        dims = (block.skip_tp.irreps_in1.dim, block.skip_tp.irreps_out.dim)
        for transpose in (False, True):
            x = rng.normal(size=(n, dims[1] if transpose else dims[0]))
            ours = probe.element_linear(layer, x, species, transpose=transpose, device=device)
            scale = max(1.0, float(np.abs(ours).max()))
            for s in range(num_elements):
                uniform = probe.element_linear(
                    layer, x, np.full(n, s, np.int32), transpose=transpose, device=device
                )
                rows = species == s
                assert np.abs(ours[rows] - uniform[rows]).max() < 1e-13 * scale
            cpu = probe.element_linear(layer, x, species, transpose=transpose)
            assert np.abs(ours - cpu).max() < 1e-12 * scale
            # the float32 kernels, to float32 accuracy
            ours32 = probe.element_linear(
                layer, x, species, transpose=transpose, device=device, dtype="float32"
            )
            assert ours32.dtype == np.float32
            assert np.abs(ours32 - cpu).max() < 2e-6 * scale


def test_element_linear_float32_large_tiles_cuda(workdir: Path) -> None:
    """The float32 element linear on 34,000 nodes of mixed species, forward and transpose:
    over 2 blocks of 128 nodes per SM on a 132-SM GPU even for one column tile, so the
    large-system tiles run, each tile once per species present (301 nodes run the small
    ones)."""
    if not _core.cuda_available():
        pytest.skip("e3fuse built without CUDA or no GPU")
    model, path = converted("three-interactions", workdir)
    probe = _core.OpsProbe(_core.Model.load(str(path)))
    rng = np.random.default_rng(12)
    n = 34000
    species = rng.integers(0, len(model.atomic_numbers), size=n).astype(np.int32)
    for layer, block in enumerate(model.interactions):
        dims = (block.skip_tp.irreps_in1.dim, block.skip_tp.irreps_out.dim)
        for transpose in (False, True):
            x = rng.normal(size=(n, dims[1] if transpose else dims[0]))
            cpu = probe.element_linear(layer, x, species, transpose=transpose)
            ours32 = probe.element_linear(
                layer, x, species, transpose=transpose, device="cuda", dtype="float32"
            )
            assert ours32.dtype == np.float32
            assert np.abs(ours32 - cpu).max() < 2e-6 * max(1.0, float(np.abs(cpu).max()))


def test_finite_differences(workdir: Path) -> None:
    """Forces = -dE/dr and stress = dE/d(strain)/V, central differences in float64."""
    _, path = converted("three-interactions", workdir)
    atoms = structure((8, 28, 29), seed=6)
    calc = Calculator(str(path), device="cpu", dtype="float64")
    atoms.calc = calc
    forces, stress = atoms.get_forces(), atoms.get_stress(voigt=False)
    entries, components = [(0, 0), (3, 1), (5, 2)], [(0, 0), (1, 2), (0, 1)]
    for (i, a), fd in zip(entries, finite_difference_forces(path, atoms, entries)):
        assert abs(fd - forces[i, a]) < 1e-7
    for (a, b), fd in zip(components, finite_difference_stress(path, atoms, components)):
        assert abs(fd - stress[a, b]) < 1e-8


def test_invariances(workdir: Path) -> None:
    from scipy.spatial.transform import Rotation

    _, path = converted("L2-lmax2", workdir)
    atoms = structure((8, 28, 29), seed=8)
    base = e3fuse_eval(path, atoms)
    rot = Rotation.random(random_state=3).as_matrix()
    moved = atoms.copy()
    moved.set_cell(atoms.cell.array @ rot.T, scale_atoms=False)
    moved.positions = atoms.positions @ rot.T + np.array([0.3, -1.2, 2.0])
    perm = np.random.default_rng(0).permutation(len(atoms))
    moved = moved[perm]
    out = e3fuse_eval(path, moved)
    assert abs(out["energy"] - base["energy"]) < 1e-10
    assert np.abs(out["forces"] - (base["forces"] @ rot.T)[perm]).max() < 1e-10


def test_cli_convert_verifies_and_refuses(workdir: Path, tmp_path: Path) -> None:
    model = build_mace("8x0e+8x1o", max_ell=1, correlation=2, seed=2)
    source = tmp_path / "small.model"
    torch.save(model, source)
    out = tmp_path / "small.e3f"
    assert cli.main(["convert", "mace", str(source), "-o", str(out)]) == 0
    assert _core.Model.load(str(out)).family == "mace"
    assert _core.Model.load(str(out)).num_layers == 2
    zbl = build_mace("8x0e", max_ell=1, correlation=1, seed=2, pair_repulsion=True)
    torch.save(zbl, tmp_path / "zbl.model")  # ZBL: converted and verified (test_mace_zbl.py)
    assert cli.main(["convert", "mace", str(tmp_path / "zbl.model"), "-o", str(out)]) == 0
    assert "pair repulsion: ZBL" in _core.Model.load(str(out)).summary()
    assert cli.main(["convert", "mace", str(tmp_path / "missing.model"), "-o", str(out)]) == 1


@pytest.mark.parametrize(
    "structure_name", [name for name in STRUCTURES if name not in ("cu_bulk_108", "ethanol")]
)
def test_structure_variety_float64(structure_name: str, workdir: Path) -> None:
    """The SevenNet structure catalog (cells smaller than the cutoff, triclinic, slab,
    molecules, mirror images, isolated atoms, pairs near the cutoff) with a MACE-MP-0
    medium-architecture model covering all their elements, against mace-torch."""
    if "variety" not in _CACHE:
        elements = sorted(
            {int(z) for name in STRUCTURES for z in STRUCTURES[name]().get_atomic_numbers()}
        )
        model = build_mace(**dict(ARCHS["mp0-medium"], elements=tuple(elements)))
        path = workdir / "variety.e3f"
        mace_convert.convert(model, path)
        _CACHE["variety"] = (model, path)
    model, path = _CACHE["variety"]
    atoms = STRUCTURES[structure_name]()
    ref = reference.evaluate_mace(reference.mace_calculator(model, "float64"), atoms)
    ours = e3fuse_eval(path, atoms)
    n = len(atoms)
    tol = TOLERANCES["float64"]
    assert abs(ours["energy"] - float(ref["energy"])) / n < tol.energy_per_atom
    assert np.abs(ours["energies"] - ref["energies"]).max() < tol.energy_per_atom
    assert np.abs(ours["forces"] - ref["forces"]).max() < tol.forces
    if atoms.pbc.all():
        assert np.abs(ours["stress"] - ref["stress"]).max() < tol.stress
