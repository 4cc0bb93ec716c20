"""Drives e3fuse_radial_micro (radial_micro.cu): per model, size and edge tile, the radial
weights of every convolution layer from the cubic table against the radial MLP on the tensor
cores over tiles of a receiver's edges, summed per receiver (issue 21). Writes the JSON of
every run and a Markdown table of median ms per layer (table, MLP per tile) to --out.

    python benchmarks/micro/radial_micro.py --exe build/gpu-ab/e3fuse_radial_micro --out DIR \
        [--models 7net-l3i5 7net-0 mp0-medium] [--sizes 32000 864] [--configs 64:1:0 128:4:1]

A configuration TILE:ROWS:PLAIN is the MLP kernel's tile of edges, receivers per block and
whether the last layer's weights are read as plain float32 (1) or pre-split TF32 parts (0).

The structures and model files are conv_micro.py's (rattled fcc Cu; the wheel's SevenNet
checkpoints, the MACE-MP-0 medium architecture with random weights).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conv_micro  # noqa: E402


def run(exe: Path, e3f: Path, struct: Path, config: str, json_out: Path, repeats: int) -> Any:
    tile, rows, plain = config.split(":")
    cmd = [str(exe), "--model", str(e3f), "--structure", str(struct), "--tile", tile]
    cmd += ["--rows", rows, "--plain", plain, "--warmup", "3", "--repeats", str(repeats)]
    return conv_micro.run_json([*cmd, "--json-out", str(json_out)], None)


def markdown(rows: list[dict[str, Any]], configs: list[str]) -> str:
    head = (
        "| model | atoms | layer | weights | MLP dims | table ms | "
        + " | ".join(f"MLP {c} ms" for c in configs)
        + " | max rel. diff |"
    )
    lines = [head, "|---|---:|---:|---:|---|---:|" + "---:|" * len(configs) + "---:|"]
    for r in rows:
        mma = " | ".join(f"{r['mma'][c]:.3f}" for c in configs)
        lines.append(
            f"| {r['model']} | {r['atoms']:,} | {r['layer']} | {r['weights']} | "
            f"{r['dims']} | {r['table']:.3f} | {mma} | {r['diff']:.1e} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--exe", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--models", nargs="+", default=["7net-l3i5", "7net-0", "mp0-medium"])
    p.add_argument("--sizes", nargs="+", type=int, default=[32000, 864])
    p.add_argument("--configs", nargs="+", default=["64:1:0", "64:1:1", "128:4:0", "128:4:1"])
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--models-dir", type=Path, default=Path("benchmarks/models"))
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    device = "?"
    for name in a.models:
        e3f, _ = conv_micro.model_files(name, a.models_dir)
        for size in a.sizes:
            struct = a.out / f"cu{size}.bin"
            if not struct.exists():
                conv_micro.write_structure(conv_micro.structure(size), struct)
            runs = {
                c: run(
                    a.exe,
                    e3f,
                    struct,
                    c,
                    a.out / f"{name}_{size}_{c.replace(':', '-')}.json",
                    a.repeats,
                )
                for c in a.configs
            }
            first = runs[a.configs[0]]
            device = first["device"]
            for k, layer in enumerate(first["layers"]):
                row = {
                    "model": name,
                    "atoms": size,
                    "layer": k,
                    "weights": layer["weight_numel"],
                    "dims": "-".join(map(str, layer["mlp_dims"])),
                    # the table kernel runs in every configuration: the median over all
                    "table": statistics.median(
                        [x for c in a.configs for x in runs[c]["layers"][k]["table_ms"]]
                    ),
                    "mma": {
                        c: statistics.median(runs[c]["layers"][k]["mma_ms"]) for c in a.configs
                    },
                    "diff": max(runs[c]["layers"][k]["max_relative_difference"] for c in a.configs),
                }
                rows.append(row)
                print(
                    f"{name} {size} L{k}: table {row['table']:.3f} ms, "
                    + ", ".join(f"{c} {row['mma'][c]:.3f}" for c in a.configs)
                    + f" ms, diff {row['diff']:.1e}",
                    flush=True,
                )
    text = (
        f"# Radial weights: table against the MLP on the tensor cores ({device})\n\n"
        "Median ms per layer (radial_micro.py); each kernel sums every weight over each "
        "receiver's edges, nothing else. MLP TILE:ROWS:PLAIN: edges per tile, receivers "
        "per block, last-layer weights as plain float32 (1) or pre-split TF32 parts (0)."
        "\n\n" + markdown(rows, a.configs)
    )
    (a.out / "radial_summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
