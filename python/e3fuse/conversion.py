"""Converting a source model to an .e3f file and checking it against the source package:
the one path that `e3fuse convert` and the Calculator's conversion on first use share.

The file appears only once it is verified: it is written to a temporary file in the target
directory and renamed over the target (atomic on POSIX and Windows), so that a reader, or a
second process converting the same model at the same time, never sees a partial file."""

from __future__ import annotations

import importlib
import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

FAMILIES = ("sevennet", "mace")

# The Python packages (import name, pip name) a conversion imports, per family.
REQUIRED_PACKAGES = {
    "sevennet": (("torch", "torch"), ("e3nn", "e3nn"), ("sevenn", "sevenn")),
    "mace": (("torch", "torch"), ("e3nn", "e3nn"), ("mace", "mace-torch")),
}
UPSTREAM_NAME = {"sevennet": "sevenn", "mace": "mace-torch"}


def require_packages(family: str, what: str) -> None:
    """Raise ImportError saying exactly what to pip install when a package that converting
    `what` (a description of the source) needs is missing. Imports torch first: with a CUDA
    build of torch, importing it after e3fuse's core crashed (README, Known issue)."""
    missing = []
    for module, pip_name in REQUIRED_PACKAGES[family]:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # ValueError: sys.modules[module] is None
            found = False
        if not found:
            missing.append(pip_name)
    if missing:
        raise ImportError(
            f"{what} must be converted to an .e3f file once, which needs torch and "
            f"{UPSTREAM_NAME[family]}; missing here: {', '.join(missing)}. Install them with:\n"
            f"    pip install {' '.join(missing)}\n"
            "(or convert it on a machine that has them, `e3fuse convert`, and pass the .e3f file)"
        )
    importlib.import_module("torch")


def verification_structure(atomic_numbers: list[int], seed: int = 0):  # -> ase.Atoms
    """A random, rattled, triclinic periodic structure of up to three of the
    model's elements (Cu, Ni, O where available), the converter's check."""
    from ase.build import bulk

    preferred = [z for z in (29, 28, 8) if z in atomic_numbers] or atomic_numbers[:3]
    rng = np.random.default_rng(seed)
    atoms = bulk("Cu", "fcc", a=3.6).repeat((2, 2, 2))
    atoms.set_atomic_numbers(rng.choice(preferred, size=len(atoms)))
    atoms.set_cell(
        atoms.cell.array @ (np.eye(3) + 0.03 * rng.standard_normal((3, 3))), scale_atoms=True
    )
    atoms.positions += 0.1 * rng.standard_normal(atoms.positions.shape)
    return atoms


def verify(
    family: str,
    source: Any,
    model_path: str,
    quiet: bool = False,
    head: str | None = None,
    modal: str | None = None,
) -> dict[str, float]:
    """Evaluate a random structure with the source package and with e3fuse in
    float64; raise if they differ beyond rounding."""
    from . import reference
    from ._core import Model
    from .calculator import Calculator

    atoms = verification_structure(Model.load(model_path).atomic_numbers)
    if family == "sevennet":
        if modal is None:
            from .modelfile import read_architecture

            modal = read_architecture(model_path).get("source", {}).get("modal")
        ref = reference.evaluate(reference.sevenn_calculator(source, "float64", modal), atoms)
    elif family == "mace":
        if head is None:
            from .modelfile import read_architecture

            head = read_architecture(model_path).get("source", {}).get("head")
        ref = reference.evaluate_mace(reference.mace_calculator(source, "float64", head), atoms)
    else:
        raise ValueError(f"no reference for family {family!r}")
    calc = Calculator(model_path, device="cpu", dtype="float64")
    ours = atoms.copy()
    ours.calc = calc
    diff = {
        "energy_per_atom": abs(ours.get_potential_energy() - float(ref["energy"])) / len(atoms),
        "forces": float(np.abs(ours.get_forces() - ref["forces"]).max()),
        "stress": float(np.abs(ours.get_stress() - ref["stress"]).max()),
    }
    limits = {"energy_per_atom": 1e-9, "forces": 1e-8, "stress": 1e-9}
    bad = [k for k in diff if not diff[k] <= limits[k]]
    if not quiet:
        print(
            f"verification on {len(atoms)} atoms ({atoms.get_chemical_formula()}), float64: "
            + ", ".join(f"max |d {k}| = {v:.2e}" for k, v in diff.items())
        )
    if bad:
        raise RuntimeError(
            "conversion does NOT reproduce the source model: "
            + ", ".join(f"{k} differs by {diff[k]:.3e} (limit {limits[k]:.0e})" for k in bad)
        )
    return diff


def convert_to_file(
    family: str,
    source: Any,
    output: str | Path,
    modal: str | None = None,
    head: str | None = None,
    check: bool = True,
    quiet: bool = False,
) -> dict[str, float] | None:
    """Convert `source` (sevennet: a pretrained name or checkpoint path; mace: a model file)
    to `output`, verified against the source package unless `check` is off; `output`
    appears only when everything succeeded. Returns the verification's differences."""
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r} (one of {', '.join(FAMILIES)})")
    if family == "sevennet" and head is not None:
        raise ValueError(
            f"head={head!r} is for mace-torch multi-head models; SevenNet multi-fidelity "
            "models take modal= (--modal)"
        )
    if family == "mace" and modal is not None:
        raise ValueError(
            f"modal={modal!r} is for SevenNet multi-fidelity models; mace-torch multi-head "
            "models take head= (--head)"
        )
    if isinstance(source, (str, os.PathLike)) and os.path.isfile(source):
        _check_source_file(family, source)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
    os.close(fd)
    try:
        reference_source = source
        if family == "sevennet":
            from .convert import sevennet

            # the reference is the same float64 build of the checkpoint that verify would make
            _, reference_source = sevennet.convert_keeping_model(source, tmp, modal=modal)
        else:
            from .convert import mace

            mace.convert(source, tmp, head=head)
        diff = None
        if check:
            diff = verify(family, reference_source, tmp, quiet=quiet, head=head, modal=modal)
        os.chmod(tmp, 0o644)  # mkstemp's file is private (0600); a model file is not
        os.replace(tmp, output)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return diff


def _check_source_file(family: str, source: str | os.PathLike[str]) -> None:
    """A wrong source file is named before torch reads it (e3fuse.filekind)."""
    from .filekind import identify

    kind = identify(source)
    if kind.kind == "e3f":
        raise ValueError(f"{os.fspath(source)!r} is already an .e3f model file")
    if kind.problem:
        raise ValueError(kind.problem)
    if kind.family != family:
        raise ValueError(
            f"{os.fspath(source)!r} is a {kind.kind.replace('-', ' ')}, not a {family} model: "
            f"convert it as {kind.family} (e3fuse convert {kind.family} ...)"
        )
