"""Per model and size, and per linear at one size, the medians of scripts/gpu_ab.sh MICRO=linear.

python summarize.py call7 32000
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def main(folder: Path, atoms: int | None) -> None:
    totals: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    per: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(folder.glob("*_round*.json")):
        config = path.name.split("_round")[0]
        for row in json.loads(path.read_text())["rows"]:
            if "layers" not in row:
                continue
            key = (row["model"], row["atoms"])
            layers = row["layers"]
            totals[key][config].append(
                (
                    sum(x["e3fuse"]["fwd_ms"] for x in layers),
                    sum(x["e3fuse"]["bwd_ms"] for x in layers),
                )
            )
            for x in layers:
                e = x["e3fuse"]
                per[(*key, x["linear"])][config].append(
                    (e["fwd_ms"], e["bwd_ms"], x["macs_per_node"])
                )
    print("model, atoms: per configuration forward / transpose ms, all linears (rounds)")
    for key, configs in totals.items():
        cells = [
            f"{c}: {statistics.median(v[0] for v in vals):.3f} / "
            f"{statistics.median(v[1] for v in vals):.3f} ({len(vals)})"
            for c, vals in sorted(configs.items())
        ]
        print(f"{key[0]:>10} {key[1]:>6}  " + "  ".join(cells))
    if atoms is None:
        return
    print(f"\nper linear at {atoms} atoms: forward / transpose ms (fp32-equivalent TMAC/s)")
    for key, configs in per.items():
        if key[1] != atoms:
            continue
        cells = []
        for c, vals in sorted(configs.items()):
            f = statistics.median(v[0] for v in vals)
            b = statistics.median(v[1] for v in vals)
            mac = vals[0][2] * atoms
            cells.append(f"{c} {f:.4f}/{b:.4f} ({mac / f / 1e9:.1f}/{mac / b / 1e9:.1f})")
        print(f"{key[0]:>10} {key[2]:<18} " + "  ".join(cells))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None)
