"""mace-torch models for the MACE benchmark, with random weights (nothing is downloaded).

"mp0-small", "mp0-medium", "mp0-large": the MACE-MP-0 architectures as mace-torch's
foundation-model training built them (mace/calculators/foundations_models.py only lists the
checkpoints' URLs; the hyper-parameters are those of the MACE-MP-0 paper, as in
tests/test_mace.py):
ScaleShiftMACE, RealAgnosticInteractionBlock first then RealAgnosticResidualInteractionBlock,
2 interactions, 128 channels (0e / 0e+1o / 0e+1o+2e), max_ell 3, correlation 3, 10 Bessel
functions, polynomial cutoff p = 5, r_max 6 A, radial MLP [64, 64, 64], readout MLP 16x0e,
89 elements (Z = 1..89 here; MP-0's table has 89 entries, so the per-element weights have
MP-0's shapes), avg_num_neighbors 61.96 (a normalisation constant; it costs nothing).
Timing does not depend on the weights.

"omat0-medium": MACE-OMAT-0 medium's architecture (mace-foundations/mace_omat/
mace-omat-medium.sh; MPA-0 medium has the same blocks): RealAgnosticDensityInteractionBlock
first then RealAgnosticDensityResidualInteractionBlock, 128x0e+128x1o, 2 interactions,
r_max 6, the Agnesi distance transform, and mace's defaults otherwise (max_ell 3,
correlation 3, 8 Bessel functions, p = 5, radial MLP [64, 64, 64], MLP_irreps 16x0e), 89
elements, with its ZBL pair repulsion.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

HIDDEN = {
    "mp0-small": "128x0e",
    "mp0-medium": "128x0e+128x1o",
    "mp0-large": "128x0e+128x1o+128x2e",
    "omat0-medium": "128x0e+128x1o",
}


def _options(name: str) -> dict[str, Any]:
    """Keyword arguments of ScaleShiftMACE that differ between the architectures."""
    from mace import modules

    if name.startswith("omat0"):
        return dict(
            num_bessel=8,
            interaction_cls=modules.interaction_classes[
                "RealAgnosticDensityResidualInteractionBlock"
            ],
            interaction_cls_first=modules.interaction_classes[
                "RealAgnosticDensityInteractionBlock"
            ],
            distance_transform="Agnesi",
            pair_repulsion=True,
        )
    return dict(
        num_bessel=10,
        interaction_cls=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
        interaction_cls_first=modules.interaction_classes["RealAgnosticInteractionBlock"],
    )


def build(name: str, seed: int = 0) -> Any:
    """The `name` architecture (HIDDEN) with seeded random weights, float64, eval mode."""
    import torch
    from e3nn import o3
    from mace import modules

    if name not in HIDDEN:
        raise KeyError(f"unknown MACE architecture {name!r} (one of {', '.join(HIDDEN)})")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    elements = list(range(1, 90))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = modules.ScaleShiftMACE(
                r_max=6.0,
                num_polynomial_cutoff=5,
                max_ell=3,
                num_interactions=2,
                num_elements=len(elements),
                hidden_irreps=o3.Irreps(HIDDEN[name]),
                MLP_irreps=o3.Irreps("16x0e"),
                atomic_energies=-rng.uniform(1, 10, len(elements)),
                avg_num_neighbors=61.96,
                atomic_numbers=elements,
                correlation=3,
                gate=torch.nn.functional.silu,
                radial_MLP=[64, 64, 64],
                atomic_inter_scale=0.8,
                atomic_inter_shift=-0.1,
                **_options(name),
            )
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def _package_versions() -> str:
    """The versions of the packages a pickled mace-torch model depends on ("none": absent;
    mace-torch picks some of its modules by whether cuequivariance-torch imports)."""
    from importlib.metadata import PackageNotFoundError, version

    def one(package: str) -> str:
        try:
            return f"{package} {version(package)}"
        except PackageNotFoundError:
            return f"{package} none"

    return " ".join(one(p) for p in ("mace-torch", "e3nn", "torch", "cuequivariance-torch"))


def model_files(name: str, models_dir: Path) -> tuple[Path, Path]:
    """(mace-torch model file, .e3f file) for `name`: an architecture name above (built with
    random weights and saved once per set of package versions, kept beside it in
    <model>.versions: a model pickled without cuequivariance-torch made the cuEquivariance
    anchor fail) or a mace-torch model file (torch.save(model))."""
    import torch

    models_dir.mkdir(parents=True, exist_ok=True)
    if name in HIDDEN:
        source = models_dir / f"mace-{name}-random.model"
        stamp = source.with_suffix(".versions")
        versions = _package_versions()
        if not source.is_file() or not stamp.is_file() or stamp.read_text() != versions:
            print(f"building {name} with random weights -> {source} ({versions})", flush=True)
            torch.save(build(name), source)
            stamp.write_text(versions)
    else:
        source = Path(name)
        if not source.is_file():
            raise FileNotFoundError(
                f"{name!r}: neither a mace-torch model file nor one of {', '.join(HIDDEN)}"
            )
    out = models_dir / f"{source.stem}.e3f"
    if not out.is_file() or out.stat().st_mtime < source.stat().st_mtime:
        from e3fuse import cli

        print(f"converting {source} -> {out}", flush=True)
        if cli.main(["convert", "mace", str(source), "-o", str(out)]) != 0:
            raise RuntimeError(f"conversion of {source} failed")
    return source, out
