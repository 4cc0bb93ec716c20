"""Every linear layer of a model alone, forward and transpose (issue 21).

For each model (SevenNet-0, SevenNet-l3i5, the MACE-MP-0 medium architecture; the model
files of conv_micro.py) and each atom count, `e3fuse_linear_micro` (linear_micro.cu, CMake
option E3FUSE_MICROBENCH) times each linear as the engine launches it (float32 by default),
on random node rows. The JSON has conv_micro.py's shape (rows of model x atoms, a "layers"
list with e3fuse's median fwd_ms / bwd_ms), so scripts/gpu_ab.sh (MICRO=linear) compares two
builds with it; each linear also carries the hash of its outputs' bytes.

  python benchmarks/micro/linear_micro.py --exe build/gpu/e3fuse_linear_micro --json l.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import conv_micro  # noqa: E402


def run_model(exe: Path, e3f: Path, atoms: int, args: Any) -> dict[str, Any]:
    """One run of the executable: its JSON (every repeat's ms per linear)."""
    cmd = [str(exe), "--model", str(e3f), "--atoms", str(atoms), "--dtype", args.dtype]
    cmd += ["--warmup", str(args.warmup), "--repeats", str(args.repeats)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {out.returncode}: {out.stderr.strip()[-1500:]}")
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(conv_micro.MODELS))
    p.add_argument("--sizes", type=int, nargs="+", default=conv_micro.DEFAULT_SIZES)
    p.add_argument("--exe", type=Path, required=True)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    p.add_argument("--deadline-s", type=float, default=None, help="start no case after this")
    p.add_argument("--models-dir", type=Path, default=conv_micro.BENCH / "models")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if not args.exe.is_file():
        p.error(f"--exe {args.exe!s} is not a file (build with -DE3FUSE_MICROBENCH=ON)")
    t0 = time.monotonic()
    doc: dict[str, Any] = {"benchmark": "linear-micro", "meta": conv_micro.metadata(), "rows": []}
    for name in args.models:
        e3f, _ = conv_micro.model_files(name, args.models_dir)
        for n in args.sizes:
            row: dict[str, Any] = {"model": name, "atoms": n, "dtype": args.dtype, "errors": []}
            doc["rows"].append(row)
            if args.deadline_s is not None and time.monotonic() - t0 > args.deadline_s:
                row["errors"].append(f"{name} {n}: deadline reached, not measured")
                continue
            try:
                result = run_model(args.exe, e3f, n, args)
            except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as err:
                row["errors"].append(f"{name} {n}: {err}"[:2000])
                print(f"!! {row['errors'][-1]}", flush=True)
                continue
            row["device"] = result["device"]
            row["layers"] = [
                {
                    "linear": lin["linear"],
                    "dim_in": lin["dim_in"],
                    "dim_out": lin["dim_out"],
                    "macs_per_node": lin["macs_per_node"],
                    "species_sets": lin["species_sets"],
                    "e3fuse": {
                        "fwd_ms": statistics.median(lin["forward_ms"]),
                        "bwd_ms": statistics.median(lin["transpose_ms"]),
                        "fwd_ms_all": lin["forward_ms"],
                        "bwd_ms_all": lin["transpose_ms"],
                        "forward_hash": lin["forward_hash"],
                        "transpose_hash": lin["transpose_hash"],
                    },
                }
                for lin in result["linears"]
            ]
            fwd = sum(x["e3fuse"]["fwd_ms"] for x in row["layers"])
            bwd = sum(x["e3fuse"]["bwd_ms"] for x in row["layers"])
            macs = sum(x["macs_per_node"] for x in row["layers"]) * n
            print(
                f"{name:>10} {n:>7,} atoms: {len(row['layers'])} linears, forward {fwd:.3f} ms, "
                f"transpose {bwd:.3f} ms ({macs / 1e9:.2f} GMAC each way; "
                f"{2 * macs / (fwd + bwd) / 1e6:.1f} GMAC/s)",
                flush=True,
            )
            for x in row["layers"]:
                e = x["e3fuse"]
                print(
                    f"    {x['linear']:<22} {x['dim_in']:>6} -> {x['dim_out']:<6} "
                    f"fwd {e['fwd_ms']:8.4f} ms  bwd {e['bwd_ms']:8.4f} ms  "
                    f"{e['forward_hash']} {e['transpose_hash']}",
                    flush=True,
                )
            if args.json:
                args.json.write_text(json.dumps(doc, indent=1) + "\n")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 1 if any(r["errors"] for r in doc["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
