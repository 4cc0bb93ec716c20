"""Sums over a model's layers of microbenchmark rounds (median of rounds): forward and
backward ms of two configurations and their ratio. Rounds are <config>_round<r>.json.

    python summarize.py [folder [old new]]      (default: call2/, base new)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def totals(path: Path) -> dict[tuple[str, int], tuple[float, float]]:
    doc = json.loads(path.read_text())
    out = {}
    for row in doc["rows"]:
        layers = [layer["e3fuse"] for layer in row["layers"]]
        out[(row["model"], row["atoms"])] = (
            sum(x["fwd_ms"] for x in layers),
            sum(x["bwd_ms"] for x in layers),
        )
    return out


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "call2")
    old, new = sys.argv[2:4] if len(sys.argv) > 3 else ("base", "new")
    runs = {
        cfg: [totals(p) for p in sorted(folder.glob(f"{cfg}_round*.json"))] for cfg in (old, new)
    }
    ratio = f"{new}/{old}"
    print(f"| model | atoms | fwd {old} | fwd {new} | {ratio} | bwd {old} | bwd {new} | {ratio} |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for key in runs[old][0]:
        med = {
            cfg: [statistics.median(r[key][i] for r in runs[cfg]) for i in (0, 1)] for cfg in runs
        }
        fb, bb = med[old]
        fn, bn = med[new]
        cells = [f"{x:.3f}" for x in (fb, fn, fn / fb, bb, bn, bn / bb)]
        print(f"| {key[0]} | {key[1]:,} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
