"""Per model and size, the linears' forward / transpose ms under each E3FUSE_LINEAR_POLICY
(policy_<p>.json of linear_micro.py), the sums, and whether every policy's output hashes agree
with policy 0's (same kernel, same per-lane sums: they must).

    python summary.py DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(folder: Path) -> int:
    docs = {
        int(p.stem.split("_")[1]): json.loads(p.read_text())
        for p in sorted(folder.glob("policy_*.json"))
    }
    if 0 not in docs:
        print(f"no policy_0.json in {folder}")
        return 1
    mismatches = 0
    for key, row0 in enumerate(docs[0]["rows"]):
        title = f"{row0['model']} {row0['atoms']} atoms"
        if row0["errors"]:
            print(f"{title}: {row0['errors']}")
            continue
        print(f"\n## {title} ({row0['device']}): forward / transpose ms")
        names = [x["linear"] for x in row0["layers"]]
        print("| linear | " + " | ".join(f"policy {p}" for p in docs) + " |")
        print("|---|" + "---:|" * len(docs))
        sums = {p: [0.0, 0.0] for p in docs}
        for i, name in enumerate(names):
            cells = []
            for p, doc in docs.items():
                row = doc["rows"][key]
                if row["errors"] or row["model"] != row0["model"]:
                    cells.append("-")
                    continue
                e, e0 = row["layers"][i]["e3fuse"], row0["layers"][i]["e3fuse"]
                same = (e["forward_hash"], e["transpose_hash"]) == (
                    e0["forward_hash"],
                    e0["transpose_hash"],
                )
                mismatches += not same
                sums[p][0] += e["fwd_ms"]
                sums[p][1] += e["bwd_ms"]
                cells.append(f"{e['fwd_ms']:.4f} / {e['bwd_ms']:.4f}{'' if same else ' HASH'}")
            print(f"| {name} | " + " | ".join(cells) + " |")
        print(
            "| **sum** | "
            + " | ".join(f"**{s[0]:.3f} / {s[1]:.3f}** ({s[0] + s[1]:.3f})" for s in sums.values())
            + " |"
        )
    print(f"\noutputs differing from policy 0's: {mismatches}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
