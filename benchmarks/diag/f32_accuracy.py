"""Float32 against float64 for the MACE feature combinations of the foundation models, on
each backend: which feature makes float32 drift (issue 20: CUDA float32 of the OMAT-0 and
OMOL-0 combinations was 4 to 40 times further from float64 than the CPU's).

    python benchmarks/diag/f32_accuracy.py [--devices cpu cuda]

Prints, per variant and device, the largest force difference (eV/A), the largest force, the
energy difference per atom and the largest per-atom energy difference, float32 against the
CPU's float64, and mace-torch's own float32 force error on the same weights ("upstream")."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import test_mace_omol_mh as omol  # noqa: E402
from helpers_mace import converted_once, e3fuse_eval  # noqa: E402
from test_mace_foundation_combos import COMBINATIONS, alloy  # noqa: E402

from e3fuse import reference  # noqa: E402

VARIANTS: dict[str, dict[str, Any]] = {
    "mp0b3": COMBINATIONS["mp0b3"],
    "omat0": COMBINATIONS["omat0"],
    "omat0-no-zbl": dict(COMBINATIONS["omat0"], pair_repulsion=False),
    "omat0-no-agnesi": dict(COMBINATIONS["omat0"], distance_transform=None),
    "omat0-corr2": dict(COMBINATIONS["omat0"], correlation=2),
    "omat0-ell2": dict(COMBINATIONS["omat0"], max_ell=2),
    "omat0-density-first-only": dict(
        COMBINATIONS["omat0"], interaction="RealAgnosticResidualInteractionBlock"
    ),
    "omol0": {},  # test_mace_omol_mh's model and structure (charge -1, spin 2)
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", nargs="+", default=["cpu", "cuda"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    args = parser.parse_args()
    cache: dict[str, Any] = {}
    work = Path(tempfile.mkdtemp())
    print(
        f"{'variant':26s} {'device':6s} {'radial':6s} {'dF max':>10s} {'|F| max':>8s} "
        f"{'dE/atom':>10s} {'dEi max':>10s}"
    )
    for name in args.variants:
        atoms = alloy(seed=12)
        try:
            if name == "omol0":
                model, path = omol.converted("omol0", work)
                atoms = omol.omol_structure("periodic", seed=2)
                atoms.info.update(charge=-1, spin=2)
            else:
                model, path = converted_once(cache, name, work, **VARIANTS[name], seed=3)
        except Exception as error:  # a variant mace-torch or the converter refuses
            print(f"{name:26s} skipped: {error}")
            continue
        f64 = e3fuse_eval(path, atoms, "float64", "cpu", radial="mlp")
        upstream = reference.evaluate_mace(reference.mace_calculator(model, "float32"), atoms)
        print(
            f"{name:26s} {'mace-torch float32':13s} "
            f"{np.abs(upstream['forces'] - f64['forces']).max():10.2e}"
        )
        for device in args.devices:
            for radial in ("table", "mlp"):
                try:
                    f32 = e3fuse_eval(path, atoms, "float32", device, radial=radial)
                except Exception as error:
                    print(f"{name:26s} {device:6s} {radial:6s} {error}")
                    continue
                df = np.abs(f32["forces"] - f64["forces"]).max()
                de = abs(f32["energy"] - f64["energy"]) / len(atoms)
                dei = np.abs(f32["energies"] - f64["energies"]).max()
                print(
                    f"{name:26s} {device:6s} {radial:6s} {df:10.2e} "
                    f"{np.abs(f64['forces']).max():8.2f} {de:10.2e} {dei:10.2e}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
