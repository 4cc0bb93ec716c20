"""MACE test helpers shared by the test files: a mace-torch model with random weights
(build_mace), a random strained alloy (structure), e3fuse's results of a converted model
(e3fuse_eval) and central finite differences of its float64 energy.

Importing this module skips the importing test module where torch or mace-torch is
missing (pytest.importorskip), as the tests that use it need both."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
mace_modules = pytest.importorskip("mace.modules")

from conftest import evaluate  # noqa: E402

from e3fuse import reference  # noqa: E402
from e3fuse.calculator import Calculator  # noqa: E402


def build_mace(
    hidden: str,
    max_ell: int = 2,
    correlation: Any = 2,
    num_interactions: int = 2,
    elements: tuple[int, ...] = (8, 28, 29),
    r_max: float = 4.5,
    num_bessel: int = 6,
    p: int = 5,
    radial_mlp: tuple[int, ...] = (16, 16),
    mlp_irreps: str = "8x0e",
    scale_shift: bool = True,
    first_residual: bool = False,
    seed: int = 0,
    heads: list[str] | None = None,
    interaction: str = "RealAgnosticResidualInteractionBlock",
    interaction_first: str | None = None,
    dtype: Any = None,
    **extra: Any,
) -> Any:
    """A mace-torch model in float64 (or `dtype`, the default dtype while it is built) with
    random (non-trivial) weights."""
    from e3nn import o3

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype or torch.float64)
    n = len(elements)
    first = interaction_first or (
        "RealAgnosticResidualInteractionBlock" if first_residual else "RealAgnosticInteractionBlock"
    )
    kwargs = dict(
        r_max=r_max,
        num_bessel=num_bessel,
        num_polynomial_cutoff=p,
        max_ell=max_ell,
        interaction_cls=mace_modules.interaction_classes[interaction],
        interaction_cls_first=mace_modules.interaction_classes[first],
        num_interactions=num_interactions,
        num_elements=n,
        hidden_irreps=o3.Irreps(hidden),
        MLP_irreps=o3.Irreps(mlp_irreps),
        atomic_energies=rng.normal(size=(n,) if heads is None else (len(heads), n)),
        avg_num_neighbors=7.3,
        atomic_numbers=list(elements),
        correlation=correlation,
        gate=torch.nn.functional.silu,
        radial_MLP=list(radial_mlp),
        heads=heads,
        **extra,
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if scale_shift:
                # per head (several heads): 1.3 .. 0.7 and 0.2 .. -0.4
                scale = np.linspace(1.3, 0.7, len(heads)).tolist() if heads else 1.3
                shift = np.linspace(0.2, -0.4, len(heads)).tolist() if heads else 0.2
                model = mace_modules.ScaleShiftMACE(
                    atomic_inter_scale=scale, atomic_inter_shift=shift, **kwargs
                )
            else:
                model = mace_modules.MACE(**kwargs)
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():
        for prm in model.parameters():
            prm.add_(0.3 * torch.randn_like(prm))
    return model.eval()


def omol_specs(emb_dim: int) -> dict[str, dict[str, Any]]:
    """mace-foundations mace_omol/mace-omol.sh's embedding_specs (both inputs categorical,
    spin first), with embeddings of `emb_dim` (the released model: its channel count)."""
    return {
        "total_spin": {
            "type": "categorical",
            "per": "graph",
            "in_dim": 1,
            "emb_dim": emb_dim,
            "num_classes": 101,
            "offset": 0,
        },
        "total_charge": {
            "type": "categorical",
            "per": "graph",
            "in_dim": 1,
            "emb_dim": emb_dim,
            "num_classes": 201,
            "offset": 100,
        },
    }


def structure(
    elements: tuple[int, ...], seed: int = 0, repeat: int = 2, cubic: bool = False
) -> Any:
    """A random occupation by `elements` of a strained, rattled fcc supercell (periodic)."""
    from ase.build import bulk

    rng = np.random.default_rng(seed)
    atoms = bulk("Cu", "fcc", a=3.6, cubic=cubic).repeat((repeat, repeat, repeat))
    atoms.set_atomic_numbers(rng.choice(list(elements), size=len(atoms)))
    atoms.set_cell(
        atoms.cell.array @ (np.eye(3) + 0.03 * rng.standard_normal((3, 3))), scale_atoms=True
    )
    atoms.positions += 0.1 * rng.standard_normal(atoms.positions.shape)
    return atoms


FORCES_F32 = 3e-5  # eV/A: float32 against float64
STRESS_F32 = 1e-6  # eV/A^3
ENERGY_F32 = 1e-5  # eV/atom
# float32 energies also within 1e-6 of their own size (about 16 rounding units of float32):
# the absolute 1e-5 eV/atom is 5e-7 of -20 eV/atom, which random weights reach
ENERGY_F32_RELATIVE = 1e-6


def assert_float32_close(
    model: Any, atoms: Any, f32: dict[str, Any], f64: dict[str, Any], head: str | None = None
) -> None:
    """e3fuse's float32 results against its float64 ones: forces within 3e-5 eV/A, stress
    within 1e-6 eV/A^3, energy within 1e-5 eV/atom; where mace-torch's own float32 (the
    float64-built model cast to float32) is itself further than half those from float64,
    within twice its distance instead. Random weights can give forces of tens to thousands
    of eV/A on the test structures (density blocks and the Agnesi transform at a 1.5 A
    pair; the weights drawn depend on the torch version), where float32's relative rounding
    alone is beyond 3e-5 eV/A; there float32 e3fuse is held to upstream's float32. The
    energy, one number where the forces are 3N, may also be off by 1e-6 of itself."""
    upstream = reference.evaluate_mace(
        reference.mace_calculator(model, "float32", head=head), atoms
    )
    n = len(atoms)
    for key, bound in (("forces", FORCES_F32), ("stress", STRESS_F32)):
        if key not in f64:
            continue
        theirs = float(np.abs(upstream[key] - f64[key]).max())
        ours = float(np.abs(f32[key] - f64[key]).max())
        assert ours < max(bound, 2.0 * theirs), (key, ours, theirs)
    theirs = abs(float(upstream["energy"]) - f64["energy"]) / n
    ours = abs(f32["energy"] - f64["energy"]) / n
    relative = ENERGY_F32_RELATIVE * abs(f64["energy"]) / n
    assert ours < max(ENERGY_F32, 2.0 * theirs, relative), ("energy", ours, theirs)


def converted_once(
    cache: dict[str, tuple[Any, Path]], name: str, workdir: Path, **arch: Any
) -> tuple[Any, Path]:
    """(build_mace(**arch), its .e3f at workdir/<name>.e3f), built and converted on the first
    call for `name` and taken from `cache` afterwards."""
    if name not in cache:
        from e3fuse.convert import mace as mace_convert

        model = build_mace(**arch)
        path = workdir / f"{name}.e3f"
        mace_convert.convert(model, path)
        cache[name] = (model, path)
    return cache[name]


def e3fuse_eval(
    path: Path,
    atoms: Any,
    dtype: str = "float64",
    device: str = "cpu",
    radial: str = "auto",
    stress: bool | None = None,
    stresses: bool = False,
) -> dict[str, Any]:
    """conftest.evaluate (energy, energies, forces; stress for fully periodic systems
    unless `stress` says; per-atom stresses if `stresses`) with a fresh e3fuse
    Calculator of the model file `path`."""
    calc = Calculator(str(path), device=device, dtype=dtype, radial=radial)
    return evaluate(calc, atoms, stress=stress, stresses=stresses)


def float64_energy(path: Path, atoms: Any, device: str = "cpu", **options: Any) -> float:
    """e3fuse's float64 energy of `atoms` (a fresh calculator: no kept neighbor list);
    `options` go to the Calculator (radial=...)."""
    a = atoms.copy()
    a.calc = Calculator(str(path), device=device, dtype="float64", **options)
    return a.get_potential_energy()


def finite_difference_forces(
    path: Path, atoms: Any, entries: list[tuple[int, int]], h: float = 1e-5, **options: Any
) -> list[float]:
    """-dE/dx of the (atom, axis) entries by central differences of float64_energy
    (`options`: its device and Calculator options)."""
    out = []
    for i, axis in entries:
        plus, minus = atoms.copy(), atoms.copy()
        plus.positions[i, axis] += h
        minus.positions[i, axis] -= h
        out.append(
            -(float64_energy(path, plus, **options) - float64_energy(path, minus, **options))
            / (2 * h)
        )
    return out


def finite_difference_stress(
    path: Path, atoms: Any, components: list[tuple[int, int]], h: float = 1e-5, **options: Any
) -> list[float]:
    """dE/d(strain_ab) / volume (ASE's sign) of the components by a symmetric central
    strain, from float64_energy (`options`: its device and Calculator options)."""
    out = []
    for a, b in components:
        energies = []
        for sign in (1, -1):
            strain = np.eye(3)
            strain[a, b] += sign * h / 2
            strain[b, a] += sign * h / 2
            s = atoms.copy()
            s.set_cell(atoms.cell.array @ strain, scale_atoms=True)
            energies.append(float64_energy(path, s, **options))
        out.append((energies[0] - energies[1]) / (2 * h) / atoms.get_volume())
    return out
