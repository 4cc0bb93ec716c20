"""Tables of README.md from the microbenchmark JSON of device call 3 (base_call3.json,
new_call3.json): per model and size, all layers summed, forward / backward median ms, and
the per-layer backward. Usage: python summarize.py"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def rows(name: str) -> dict[tuple[str, int], list[dict]]:
    data = json.loads((HERE / name).read_text())
    return {(r["model"], r["atoms"]): [la["e3fuse"] for la in r["layers"]] for r in data["rows"]}


def main() -> None:
    base, new = rows("base_call3.json"), rows("new_call3.json")
    print("| model | atoms | forward base | new | backward base | new | new / base |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for key, layers in base.items():
        fb = sum(la["fwd_ms"] for la in layers)
        bb = sum(la["bwd_ms"] for la in layers)
        fn = sum(la["fwd_ms"] for la in new[key])
        bn = sum(la["bwd_ms"] for la in new[key])
        print(
            f"| {key[0]} | {key[1]:,} | {fb:.3f} | {fn:.3f} | {bb:.3f} | {bn:.3f} | {bn / bb:.2f} |"
        )
    print()
    print("| model | atoms | backward per layer, base -> new ms |")
    print("|---|---:|---|")
    for key, layers in base.items():
        per = ", ".join(
            f"L{i} {b['bwd_ms']:.2f} -> {n['bwd_ms']:.2f}"
            for i, (b, n) in enumerate(zip(layers, new[key]))
        )
        print(f"| {key[0]} | {key[1]:,} | {per} |")


if __name__ == "__main__":
    main()
