"""Results of e3fuse's float32 CUDA engine on rattled fcc Cu (benchmarks/cases.py), saved for a
bitwise comparison between two processes (linear_pair.patch: E3FUSE_LINEAR_PAIR=1 and =0 must
give the same bits, as each output element is the same sum in the same order).

    E3FUSE_LINEAR_PAIR=0 python compare.py save off.npz --model M.e3f [--atoms 864]
    python compare.py check on.npz off.npz
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import cases  # noqa: E402


def save(path: Path, model: Path, atoms: int) -> None:
    from ase.calculators.calculator import all_changes

    import e3fuse

    system = cases.build_atoms(cases.case_for_size(atoms))
    calc = e3fuse.Calculator(str(model), device="cuda", dtype="float32")
    results = {}
    for step in range(4):  # the later calls replay where a step graph is built
        calc.calculate(system, ["energy", "energies", "forces", "stress"], all_changes)
        for key in ("energy", "energies", "forces", "stress"):
            results[f"{key}_{step}"] = np.array(calc.results[key], copy=True)
    np.savez(path, **results)


def check(first: Path, second: Path) -> int:
    a, b = np.load(first), np.load(second)
    differ = [k for k in a.files if not np.array_equal(a[k], b[k])]
    print(f"{first.name} vs {second.name}: {len(a.files)} arrays, {len(differ)} differ {differ}")
    return 1 if differ or a.files != b.files else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["save", "check"])
    p.add_argument("files", type=Path, nargs="+")
    p.add_argument("--model", type=Path)
    p.add_argument("--atoms", type=int, default=864)
    args = p.parse_args()
    if args.action == "save":
        save(args.files[0], args.model, args.atoms)
        return 0
    return check(args.files[0], args.files[1])


if __name__ == "__main__":
    sys.exit(main())
