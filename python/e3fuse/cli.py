"""The `e3fuse` command: convert, info, bench."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .conversion import verification_structure, verify  # noqa: F401 - e3fuse.cli.verify


def usage_lines(model_path: str | Path, atomic_numbers: list[int]) -> list[str]:
    """The LAMMPS and Python lines that use the model file `model_path`."""
    from ase.data import chemical_symbols

    symbols = [chemical_symbols[z] for z in atomic_numbers]
    shown = str(model_path)
    lines = ["", "Use it in LAMMPS (units metal):"]
    lines.append(
        "  pair_style e3fuse device cpu precision float64   # GPU: device cuda precision float32"
    )
    if len(symbols) <= 8:
        lines.append(f"  pair_coeff * * {shown} {' '.join(symbols)}")
        lines.append(
            "  # one element per atom type, in type order (NULL for a type the model lacks)"
        )
    else:
        example = [s for s in ("Cu", "Ni", "O") if s in symbols] or symbols[:2]
        lines.append(f"  pair_coeff * * {shown} {' '.join(example)}")
        lines.append(
            "  # one element per atom type, in type order (NULL for a type the model lacks); "
            f"the model's {len(symbols)} elements:"
        )
        for start in range(0, len(symbols), 20):
            lines.append("  #   " + " ".join(symbols[start : start + 20]))
    lines += [
        "or in Python (ASE):",
        "  from e3fuse import Calculator",
        f'  atoms.calc = Calculator({shown!r}, device="cpu", dtype="float64")'
        '  # GPU: device="cuda", dtype="float32"',
    ]
    return lines


def cmd_convert(args: argparse.Namespace) -> int:
    from .conversion import convert_to_file
    from .modelfile import read_architecture

    output = Path(args.output)
    convert_to_file(
        args.family,
        args.source,
        output,
        modal=args.modal,
        head=args.head,
        check=not args.no_verify,
    )
    print(f"wrote {output} ({output.stat().st_size / 1e6:.1f} MB)")
    print("\n".join(usage_lines(output, read_architecture(output)["atomic_numbers"])))
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from ._core import E3fuseError, Model
    from .filekind import identify

    if Path(args.file).is_dir():
        from .model_source import directory_message

        raise IsADirectoryError(directory_message(args.file, Path(args.file)))
    if Path(args.file).is_file():  # a wrong file: say what it is, before the core reads it
        kind = identify(args.file)
        if kind.problem:
            raise E3fuseError(kind.problem)
        if kind.family:
            raise E3fuseError(
                f"{args.file!r} is a {kind.kind.replace('-', ' ')}, not an .e3f file: convert it "
                f"with `e3fuse convert {kind.family} {args.file} -o model.e3f`"
            )

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

        if isinstance(err, (E3fuseError, OSError, ImportError, RuntimeError, ValueError)):
            print(f"e3fuse: error: {err}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
