"""The `e3fuse` command: convert, info, bench."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np


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
    source,
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


def cmd_convert(args: argparse.Namespace) -> int:
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".e3f", dir=output.parent)
    os.close(fd)
    try:
        if args.family == "sevennet":
            from .convert import sevennet

            sevennet.convert(args.source, tmp, modal=args.modal)
        elif args.family == "mace":
            from .convert import mace

            if args.modal is not None:
                raise ValueError("--modal is for sevennet multi-fidelity models (mace: --head)")
            mace.convert(args.source, tmp, head=args.head)
        else:
            raise SystemExit(f"unknown model family {args.family!r}")
        if not args.no_verify:
            verify(args.family, args.source, tmp, head=args.head, modal=args.modal)
        os.replace(tmp, output)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    print(f"wrote {output} ({output.stat().st_size / 1e6:.1f} MB)")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from ._core import Model

    print(Model.load(args.file).summary(), end="")
    return 0


def cmd_bench_scaling(args: argparse.Namespace) -> int:
    from . import bench

    rows = bench.run_scaling(
        args.model,
        device=args.device,
        dtype=args.dtype,
        sizes=args.sizes,
        max_atoms=args.max_atoms,
        steps=args.steps,
        skin=args.skin,
        displacement=args.displacement,
        time_limit_s=args.time_limit_s,
        plot=args.plot,
        json_out=args.json,
        radial=args.radial,
        region_atoms=args.region_atoms,
    )
    return 0 if rows else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="e3fuse", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "convert", help="convert a sevenn checkpoint or a mace-torch model to an .e3f model file"
    )
    p.add_argument("family", choices=["sevennet", "mace"])
    p.add_argument(
        "source",
        help="sevennet: pretrained name (7net-0, 7net-l3i5, ...) or "
        "checkpoint path; mace: model file saved with torch.save(model)",
    )
    p.add_argument("--head", default=None, help="mace multi-head models: the head to convert")
    p.add_argument(
        "--modal",
        default=None,
        help="sevennet multi-fidelity models: the modality (fidelity) to convert, by sevenn's "
        "name (e.g. PBE or R2SCAN for 7net-mf-0)",
    )
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--no-verify", action="store_true", help="skip the comparison with the source")
    p.set_defaults(func=cmd_convert)
    p = sub.add_parser("info", help="describe an .e3f model file")
    p.add_argument("file")
    p.set_defaults(func=cmd_info)
    p = sub.add_parser("bench", help="benchmarks (scaling: time and memory against system size)")
    bench_sub = p.add_subparsers(dest="bench_command", required=True)
    p = bench_sub.add_parser(
        "scaling",
        help="copper supercells growing until out of memory: ms/step and peak memory per size",
        description="Rattled fcc Cu supercells (864, 4000, 32000 atoms, then about x2 per "
        "step) until the device runs out of memory or a limit is reached; per size, K MD-like "
        "steps (small random displacements, so the neighbor list is reused as in MD). Prints "
        "one row per size while it runs and optionally draws a PNG (time and memory against "
        "atoms, log-log).",
    )
    p.add_argument("--model", required=True, help=".e3f model file")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument(
        "--radial",
        default="auto",
        choices=["auto", "mlp", "table"],
        help="radial MLP per edge or tabulated in r (auto: table in float32)",
    )
    p.add_argument(
        "--sizes", type=int, nargs="+", default=None, help="atom counts (each 4 n^3, e.g. 864 4000)"
    )
    p.add_argument(
        "--max-atoms",
        type=int,
        default=None,
        help="largest size of the default growth (default: on cuda, the first size evaluated "
        "in regions, i.e. beyond one pass; 4000 on cpu)",
    )
    p.add_argument("--steps", type=int, default=10, help="timed steps per size")
    p.add_argument("--skin", type=float, default=0.5, help="neighbor-list skin (A)")
    p.add_argument(
        "--displacement",
        type=float,
        default=0.01,
        help="random displacement per step and coordinate (A, standard deviation)",
    )
    p.add_argument(
        "--time-limit-s",
        type=float,
        default=None,
        help="stop growing when the next size would end after this many seconds",
    )
    p.add_argument(
        "--region-atoms",
        type=int,
        default=0,
        help="most atoms (owned + ghosts) per region for systems evaluated region by region "
        "(0: automatic, as many as the GPU's free memory holds)",
    )
    p.add_argument("--plot", default=None, help="write a PNG of time and memory against atoms")
    p.add_argument("--json", default=None, help="write the rows and metadata as JSON")
    p.set_defaults(func=cmd_bench_scaling)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except Exception as err:  # noqa: BLE001 - report cleanly, non-zero exit
        from ._core import E3fuseError

        if isinstance(err, (E3fuseError, FileNotFoundError, RuntimeError, ValueError)):
            print(f"e3fuse: error: {err}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
