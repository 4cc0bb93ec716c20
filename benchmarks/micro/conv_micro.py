"""The convolution alone: e3fuse's kernels against cuEquivariance's, per layer (issue 21).

For each model (SevenNet-0, SevenNet-l3i5, the MACE-MP-0 medium architecture) and each size
of rattled fcc Cu (cases.py; default 864 and 32,000 atoms):

- e3fuse: `e3fuse_conv_micro` (conv_micro.cu, CMake option E3FUSE_MICROBENCH) times
  conv_forward and conv_backward of every layer as the engine launches them (float32, radial
  table), on the graph of the engine's GPU neighbor list (cutoff + skin 0.5 A);
- cuEquivariance: the module that sevenn / mace-torch run for the same layer with
  cuEquivariance enabled (sevenn: `cueq_fused_scatter_channelwise_conv` of
  `checkpoint.build_model(enable_cueq=True)`; mace: `conv_tp` of
  `mace.cli.convert_e3nn_cueq.run(model, device="cuda")`, a fused `cuet.SegmentedPolynomial`,
  method uniform_1d), on the same edges (those inside the cutoff, in the same order), with
  random node features, spherical harmonics and per-edge weights, and beside it the
  package's own radial MLP of that layer (which the cuEquivariance kernel does not include).

Forward and backward are timed with CUDA events after warm-up; the flop and byte model per
edge is counted from the model file's plan (README.md in this folder says what each number
includes). One JSON and one markdown file come out (--json, --markdown).

  python benchmarks/micro/conv_micro.py --exe build/gpu/e3fuse_conv_micro \
      --json micro.json --markdown micro.md
  python benchmarks/micro/conv_micro.py --dry-run     # CPU: graphs, irreps, the work model
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.append(str(REPO / "python"))

import cases  # noqa: E402

MODELS = {"7net-0": "sevennet", "7net-l3i5": "sevennet", "mp0-medium": "mace"}
DEFAULT_SIZES = [864, 32000]
SKIN = 0.5  # e3fuse.Calculator's default
FLOAT = 4  # bytes


def _dim(l: int) -> int:
    return 2 * l + 1


# --------------------------------------------------------------------------- work model


def layer_work(conv: dict[str, Any]) -> dict[str, Any]:
    """Multiply-adds and bytes per directed edge of one convolution layer (README.md).

    conv: a layer's "conv" of the model file's architecture (irreps [mul, l, p] lists,
    instructions {in, sh, out}, mlp dims). Paths p = (mul, d1, d2, d3)."""
    paths = []
    for ins in conv["instructions"]:
        mul, l1, _ = conv["irreps_in"][ins["in"]]
        _, l2, _ = conv["irreps_sh"][ins["sh"]]
        _, l3, _ = conv["irreps_out"][ins["out"]]
        paths.append((mul, _dim(l1), _dim(l2), _dim(l3)))
    dim_in = sum(m * _dim(l) for m, l, _ in conv["irreps_in"])
    dim_out = sum(m * _dim(l) for m, l, _ in conv["irreps_out"])
    weights = sum(m for m, _, _, _ in paths)
    # forward: M = CG . Y once per edge and path, then per channel x . M and w * (.) + acc
    tp_fwd = sum(d1 * d2 * d3 + m * (d1 * d3 + d3) for m, d1, d2, d3 in paths)
    # adjoint, the least any design does: M and K = dM/dv (4 d1 d2 d3), per channel
    # g' = M g (d1 d3), dE/dx += w g' (d1), dE/dw = x . g' (d1), S = sum_u x (w g) (d1 d3 + d3),
    # then the force S . K once per path (3 d1 d3)
    tp_bwd = sum(
        4 * d1 * d2 * d3 + 3 * d1 * d3 + m * (2 * d1 * d3 + 2 * d1 + d3) for m, d1, d2, d3 in paths
    )
    # as e3fuse's backward runs it (tp_backward_edge): per channel 4 d1 d3 + 2 d1 (the K
    # contraction per lane, summed over the warp afterwards; K's two components in the edge's
    # frame since 88c2930, three before: 5 d1 d3 + 2 d1)
    tp_bwd_e3fuse = sum(4 * d1 * d2 * d3 + m * (4 * d1 * d3 + 2 * d1) for m, d1, d2, d3 in paths)
    dims = conv["mlp"]["dims"]
    mlp = sum(dims[i] * dims[i + 1] for i in range(len(dims) - 1))
    table_row = 4 * FLOAT * weights  # 4 cubic coefficients per weight (float32)
    edge_index = 4 + 4 + 3 * 8  # neighbor, shift index, the neighbor's position (double)
    return {
        "paths": len(paths),
        "paths_mul_d1_d2_d3": paths,
        "dim_in": dim_in,
        "dim_out": dim_out,
        "weight_numel": weights,
        "mlp_dims": dims,
        "tp_fwd_macs": tp_fwd,
        "tp_bwd_macs": tp_bwd,
        "tp_bwd_e3fuse_macs": tp_bwd_e3fuse,
        "table_fwd_macs": 3 * weights,  # Horner, value
        "table_bwd_macs": 6 * weights,  # value and d/dr
        "mlp_fwd_macs": mlp,  # what the table replaces (the packages run it per edge)
        "table_bytes": table_row,
        "gather_fwd_bytes": dim_in * FLOAT,  # x_j row
        "gather_bwd_bytes": dim_out * FLOAT,  # dE/dy_j row
        "index_bytes": edge_index,
        "atomic_bwd_bytes": 3 * 2 * 8,  # the receiver's force, fixed point (hi, lo)
        # per edge, e3fuse float32 with the table: what each pass must bring in
        "fwd_flops": 2 * (tp_fwd + 3 * weights),
        "bwd_flops": 2 * (tp_bwd + 6 * weights),
        "bwd_flops_e3fuse": 2 * (tp_bwd_e3fuse + 6 * weights),
        "fwd_bytes": table_row + dim_in * FLOAT + edge_index,
        "bwd_bytes": table_row + dim_out * FLOAT + edge_index + 48,
        # the TP part alone, as cuEquivariance gets it (w and Y are inputs, read per edge)
        "cueq_fwd_flops": 2 * tp_fwd,
        "cueq_bwd_flops": 2 * tp_bwd,
        "cueq_fwd_bytes": (weights + sum(_dim(l) for _, l, _ in conv["irreps_sh"]) + dim_in) * FLOAT
        + 8,
    }


# --------------------------------------------------------------------------- models


def model_files(name: str, models_dir: Path) -> tuple[Path, Path | None]:
    """(.e3f file, mace-torch source model or None) for a MODELS name, converted once."""
    if MODELS[name] == "mace":
        import mace_models

        source, e3f = mace_models.model_files(name, models_dir)
        return Path(e3f), Path(source)
    from bench_cpu import model_file

    return Path(model_file(name, models_dir)), None


def upstream_layers(name: str, source: Path | None, cueq: bool) -> list[dict[str, Any]]:
    """Per convolution layer of the upstream package: its irreps, its radial MLP module and
    (cueq) the module that runs the tensor product + scatter with cuEquivariance, built by the
    package itself as its calculator builds it."""
    import torch

    layers: list[dict[str, Any]] = []
    if MODELS[name] == "sevennet":
        import sevenn.util
        from sevenn.nn.convolution import (
            IrrepsConvolution,
            IrrepsScatterGatterFusedConvolution,
        )

        from e3fuse.convert.sevennet import resolve_checkpoint

        cp = sevenn.util.load_checkpoint(str(resolve_checkpoint(name)))
        model = cp.build_model(enable_cueq=cueq)
        if cueq:
            model = model.to("cuda")
        for module in model.modules():
            # with cueq, sevenn swaps each for the fused class (not a subclass), same fields
            if not isinstance(module, (IrrepsConvolution, IrrepsScatterGatterFusedConvolution)):
                continue
            kw = module.convolution_kwargs
            conv = module.convolution
            if cueq and type(conv).__name__ != "cueq_fused_scatter_channelwise_conv":
                raise RuntimeError(
                    f"sevenn built {type(conv).__name__} for {name}, not cuEquivariance's "
                    "fused convolution: is cuequivariance_torch importable with a GPU?"
                )
            layers.append(
                {
                    "irreps_in1": str(kw["irreps_in1"]),
                    "irreps_in2": str(kw["irreps_in2"]),
                    "irreps_out": str(kw["irreps_out"]),
                    "dim_in1": kw["irreps_in1"].dim,
                    "dim_in2": kw["irreps_in2"].dim,
                    "mlp": module.weight_nn,
                    "mlp_in": module.weight_nn_kwargs["hs"][0],
                    "weight_numel": module.weight_nn_kwargs["hs"][-1],
                    "tp": conv if cueq else None,
                    "call": "sevenn",
                }
            )
        return layers
    model = torch.load(source, map_location="cpu", weights_only=False).float().eval()
    for block in model.interactions:  # the e3nn model: irreps and radial MLPs
        tp = block.conv_tp
        layers.append(
            {
                "irreps_in1": str(tp.irreps_in1),
                "irreps_in2": str(tp.irreps_in2),
                "irreps_out": str(tp.irreps_out),
                "dim_in1": tp.irreps_in1.dim,
                "dim_in2": tp.irreps_in2.dim,
                "mlp": block.conv_tp_weights,
                "mlp_in": block.conv_tp_weights.hs[0],
                "weight_numel": tp.weight_numel,
                "tp": None,
                "call": "mace",
            }
        )
    if cueq:  # as MACECalculator(enable_cueq=True) converts it
        from mace.cli.convert_e3nn_cueq import run as e3nn_to_cueq

        converted = e3nn_to_cueq(model, device="cuda").to("cuda")
        for layer, block in zip(layers, converted.interactions, strict=True):
            if not hasattr(block.conv_tp, "original_forward"):
                raise RuntimeError("mace-torch did not build cuEquivariance's fused conv_tp")
            if block.conv_tp.weight_numel != layer["weight_numel"]:
                raise RuntimeError("cuEquivariance's conv_tp has other weights than e3nn's")
            layer["tp"] = block.conv_tp
    return layers


# --------------------------------------------------------------------------- graph


def structure(atoms_count: int) -> Any:
    c = cases.case_for_size(atoms_count)
    if c.num_atoms != atoms_count:
        raise ValueError(f"no rattled fcc Cu case of {atoms_count} atoms (4 n^3)")
    return cases.build_atoms(c)


def write_structure(atoms: Any, path: Path) -> None:
    """conv_micro.cu's input: float64 [n, cell (9), pbc (3), positions (3 n)]."""
    head = [float(len(atoms)), *np.asarray(atoms.cell, float).ravel(), *map(float, atoms.pbc)]
    np.concatenate([np.array(head), np.asarray(atoms.positions, float).ravel()]).astype(
        "<f8"
    ).tofile(path)


def edges_on_cpu(atoms: Any, cutoff: float) -> tuple[int, np.ndarray, np.ndarray]:
    """e3fuse's CPU neighbor list with the engine's skin (the GPU list holds the same edge
    set, neighbors/neighbor_list.cuh): (edges in the list, senders and receivers of those
    inside the cutoff, receiver-sorted)."""
    import e3fuse._core as core

    pos = np.ascontiguousarray(atoms.positions, dtype=float)
    nl = core.NeighborList(cutoff, SKIN)
    nl.update(pos, np.ascontiguousarray(np.asarray(atoms.cell), dtype=float), list(atoms.pbc))
    e = nl.edges(pos)
    inside = e["distances"] < cutoff
    return int(nl.num_edges), e["senders"][inside], e["receivers"][inside]


# --------------------------------------------------------------------------- timing


def _cuda_ms(fn: Any, warmup: int, repeats: int, before: Any = None) -> list[float]:
    """Milliseconds of fn() between two CUDA events, after `warmup` untimed calls; `before`
    (untimed) runs ahead of each call."""
    import torch

    times = []
    for r in range(warmup + repeats):
        arg = before() if before else None
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(arg)
        stop.record()
        torch.cuda.synchronize()
        if r >= warmup:
            times.append(start.elapsed_time(stop))
    return times


def _rand(gen: Any, *shape: int) -> Any:
    import torch

    return torch.rand(*shape, device=gen.device, generator=gen) * 2 - 1


def _time_tp(
    layer: dict[str, Any], atoms_count: int, src: Any, dst: Any, warmup: int, repeats: int
) -> dict[str, Any]:
    """cuEquivariance's TP + scatter of one layer, called as the package calls it: forward,
    and backward = dE/d(x, Y, w) given dE/dy."""
    import torch

    gen = torch.Generator(device=src.device).manual_seed(5)
    e = len(src)
    x = _rand(gen, atoms_count, layer["dim_in1"])
    sh = _rand(gen, e, layer["dim_in2"])
    w = _rand(gen, e, layer["weight_numel"])
    tp = layer["tp"]
    if layer["call"] == "sevenn":  # IrrepsScatterGatterFusedConvolution.forward
        src32, dst32 = src.to(torch.int32), dst.to(torch.int32)

        def call(x_: Any, sh_: Any, w_: Any) -> Any:
            return tp(x_, sh_, w_, src32, dst32)
    else:  # mace InteractionBlock: conv_tp(node_feats, edge_attrs, tp_weights, edge_index)
        edge_index = torch.stack([src, dst])

        def call(x_: Any, sh_: Any, w_: Any) -> Any:
            return tp(x_, sh_, w_, edge_index)

    out: dict[str, Any] = {}
    with torch.no_grad():
        y = call(x, sh, w)
        if y.shape[0] != atoms_count:
            raise RuntimeError(f"cuEquivariance output has {y.shape[0]} rows, not {atoms_count}")
        out["dim_out"] = int(y.shape[1])
        out["tp_forward_ms"] = _cuda_ms(lambda _: call(x, sh, w), warmup, repeats)
    grad_y = _rand(gen, *y.shape)
    inputs = [t.requires_grad_() for t in (x, sh, w)]
    out["tp_backward_ms"] = _cuda_ms(
        lambda yy: torch.autograd.grad(yy, inputs, grad_y),
        warmup,
        repeats,
        before=lambda: call(*inputs),
    )
    return out


def _time_mlp(layer: dict[str, Any], edges: int, warmup: int, repeats: int) -> dict[str, Any]:
    """The package's radial MLP of the layer on `edges` edges (not in the cueq kernel):
    forward, and backward to its input."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(6)
    mlp = layer["mlp"].to("cuda").float()
    emb = _rand(gen, edges, layer["mlp_in"])
    out: dict[str, Any] = {}
    with torch.no_grad():
        out["mlp_forward_ms"] = _cuda_ms(lambda _: mlp(emb), warmup, repeats)
    emb.requires_grad_()
    g_w = _rand(gen, edges, layer["weight_numel"])
    out["mlp_backward_ms"] = _cuda_ms(
        lambda ww: torch.autograd.grad(ww, [emb], g_w), warmup, repeats, before=lambda: mlp(emb)
    )
    return out


def time_cueq_layer(
    layer: dict[str, Any],
    atoms_count: int,
    senders: np.ndarray,
    receivers: np.ndarray,
    warmup: int,
    repeats: int,
) -> dict[str, Any]:
    """cuEquivariance's TP + scatter of one layer and the package's radial MLP beside it."""
    import torch

    src = torch.as_tensor(senders, device="cuda")
    dst = torch.as_tensor(receivers, device="cuda")
    out = _time_tp(layer, atoms_count, src, dst, warmup, repeats)
    torch.cuda.empty_cache()
    out.update(_time_mlp(layer, len(senders), warmup, repeats))
    torch.cuda.empty_cache()
    return out


def run_e3fuse(exe: Path, e3f: Path, struct: Path, edges_out: Path, args: Any) -> dict[str, Any]:
    cmd = [
        str(exe),
        "--model",
        str(e3f),
        "--structure",
        str(struct),
        "--skin",
        str(SKIN),
        "--warmup",
        str(args.warmup),
        "--repeats",
        str(args.repeats),
        "--edges-out",
        str(edges_out),
    ]
    return run_json(cmd, args.timeout)


def run_json(cmd: list[str], timeout: float | None) -> dict[str, Any]:
    """Runs a microbenchmark executable and returns the JSON object it prints."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


# --------------------------------------------------------------------------- report


def _median(v: list[float]) -> float:
    return float(np.median(v))


def _rate(per_edge: float, edges: int, ms: float) -> float:
    """Per-edge quantity x edges / time, in G per second."""
    return per_edge * edges / (ms * 1e-3) / 1e9


def markdown(doc: dict[str, Any]) -> str:
    meta = doc["meta"]
    out = [
        f"# Convolution microbenchmark on {meta.get('gpu') or 'no GPU'}",
        "",
        f"commit {meta['commit'][:10]}{' (dirty)' if meta['dirty'] else ''}, {meta['date']}; "
        f"`{meta['command']}`",
        "",
        "Per layer, median ms over the timed repeats (CUDA events, after warm-up), float32. "
        "**e3fuse fwd / bwd**: the engine's conv_forward / conv_backward kernels (edge walk "
        "with the cutoff test, edge vector, spherical harmonics, radial table, tensor product, "
        "sum into the receiver; backward: also dY/dv, dE/dx, the force on both atoms, per-atom "
        "virial). **cueq TP fwd / bwd**: cuEquivariance's fused tensor product + scatter "
        "module as the package calls it, with Y and w given (backward: dE/dx, dE/dY, dE/dw); "
        "**MLP fwd / bwd**: the package's radial MLP on the same edges, which the cueq kernel "
        "does not contain (nor does it compute Y). GFLOP/s and GB/s: the modelled flops and "
        "bytes per edge (README.md) x edges inside the cutoff / time. Ratios: (fwd + bwd) "
        "times of cueq's parts over e3fuse's (above 1: e3fuse faster); row 'all': the sum "
        "over the model's layers.",
        "",
        "| model | atoms | layer | edges | e3fuse fwd ms | e3fuse bwd ms | cueq TP fwd ms | "
        "cueq TP bwd ms | MLP fwd ms | MLP bwd ms | e3fuse fwd GFLOP/s | e3fuse bwd GFLOP/s "
        "| e3fuse fwd GB/s | e3fuse bwd GB/s | cueq TP / e3fuse | cueq TP+MLP / e3fuse |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def f(x: Any, spec: str = ".3f") -> str:
        return "-" if x is None else format(x, spec)

    def total(r: dict[str, Any], engine: str, key: str) -> float | None:
        vals = [(lay.get(engine) or {}).get(key) for lay in r["layers"]]
        return None if not vals or None in vals else sum(vals)

    for r in doc["rows"]:
        r["layers"] = r.get("layers", [])
        if len(r["layers"]) > 1:  # the whole model's convolutions, first
            sums = {
                "e3fuse": {k: total(r, "e3fuse", k) for k in ("fwd_ms", "bwd_ms")},
                "cueq": {
                    k: total(r, "cueq", k)
                    for k in ("tp_fwd_ms", "tp_bwd_ms", "mlp_fwd_ms", "mlp_bwd_ms")
                },
                "layer": "all",
            }
            rows_to_print = [sums, *r["layers"]]
        else:
            rows_to_print = r["layers"]
        for lay in rows_to_print:
            e3 = lay.get("e3fuse") or {}
            cq = lay.get("cueq") or {}
            ratio = with_mlp = None
            if e3.get("fwd_ms") and cq.get("tp_fwd_ms"):
                e3_ms = e3["fwd_ms"] + e3["bwd_ms"]
                ratio = (cq["tp_fwd_ms"] + cq["tp_bwd_ms"]) / e3_ms
                if cq.get("mlp_fwd_ms") is not None:
                    with_mlp = ratio + (cq["mlp_fwd_ms"] + cq["mlp_bwd_ms"]) / e3_ms
            out.append(
                f"| {r['model']} | {r['atoms']:,} | {lay['layer']} | {r.get('edges', 0):,} | "
                f"{f(e3.get('fwd_ms'))} | {f(e3.get('bwd_ms'))} | {f(cq.get('tp_fwd_ms'))} | "
                f"{f(cq.get('tp_bwd_ms'))} | {f(cq.get('mlp_fwd_ms'))} | "
                f"{f(cq.get('mlp_bwd_ms'))} | {f(e3.get('fwd_gflops'), ',.0f')} | "
                f"{f(e3.get('bwd_gflops'), ',.0f')} | {f(e3.get('fwd_gbs'), ',.0f')} | "
                f"{f(e3.get('bwd_gbs'), ',.0f')} | {f(ratio, '.2f')} | {f(with_mlp, '.2f')} |"
            )
    out += [
        "",
        "Work model per directed edge (from the model file's plan; MAC = multiply-add, "
        "flops = 2 MAC; bytes: float32 table row 16 B per weight, the gathered node row, "
        "32 B of list and neighbor position, 48 B of fixed-point force atomics in the "
        "backward):",
        "",
        "| model | layer | paths | weights | TP fwd MAC | TP bwd MAC (min) | TP bwd MAC "
        "(e3fuse) | table fwd/bwd MAC | radial MLP MAC (replaced) | fwd bytes | bwd bytes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, layers in doc["work"].items():
        for t, w in enumerate(layers):
            out.append(
                f"| {name} | {t} | {w['paths']} | {w['weight_numel']:,} | {w['tp_fwd_macs']:,} "
                f"| {w['tp_bwd_macs']:,} | {w['tp_bwd_e3fuse_macs']:,} | "
                f"{w['table_fwd_macs']:,} / {w['table_bwd_macs']:,} | {w['mlp_fwd_macs']:,} | "
                f"{w['fwd_bytes']:,} | {w['bwd_bytes']:,} |"
            )
    problems = [p for r in doc["rows"] for p in r.get("errors", [])]
    if problems:
        out += ["", "Not measured:", ""] + [f"- {p}" for p in problems]
    return "\n".join(out) + "\n"


def _git(*a: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *a], capture_output=True, text=True, check=False
    ).stdout.strip()


def metadata() -> dict[str, Any]:
    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    versions = {}
    import importlib.metadata as md

    for pkg in ("torch", "e3nn", "sevenn", "mace-torch", "cuequivariance-torch"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = "absent"
    status = _git("status", "--porcelain").splitlines()
    return {
        "gpu": gpu,
        "commit": os.environ.get("E3FUSE_COMMIT") or _git("rev-parse", "HEAD"),
        "dirty": bool(status),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "host": platform.node(),
        "versions": versions,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }


# --------------------------------------------------------------------------- driver


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES)
    p.add_argument("--exe", type=Path, default=Path(os.environ.get("E3FUSE_CONV_MICRO", "")))
    p.add_argument("--engines", nargs="+", default=["e3fuse", "cueq"], choices=["e3fuse", "cueq"])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per e3fuse run")
    p.add_argument("--deadline-s", type=float, default=None, help="start no case after this")
    p.add_argument("--models-dir", type=Path, default=BENCH / "models")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="no GPU: build the graphs and irreps, print the work model, stop before CUDA",
    )
    args = p.parse_args(argv)
    if not args.dry_run and "e3fuse" in args.engines and not args.exe.is_file():
        p.error(f"--exe {args.exe!s} is not a file (build with -DE3FUSE_MICROBENCH=ON)")
    from e3fuse.modelfile import read_architecture

    t0 = time.monotonic()
    doc: dict[str, Any] = {"benchmark": "conv-micro", "meta": metadata(), "work": {}, "rows": []}
    structures: dict[int, Any] = {n: structure(n) for n in args.sizes}
    for name in args.models:
        e3f, source = model_files(name, args.models_dir)
        arch = read_architecture(e3f)
        cutoff = float(arch["cutoff"])
        work = [layer_work(layer["conv"]) for layer in arch["layers"]]
        doc["work"][name] = work
        use_cueq = "cueq" in args.engines and not args.dry_run
        cueq_error = None
        try:
            upstream = upstream_layers(name, source, cueq=use_cueq)
        except Exception as err:  # noqa: BLE001 - e3fuse is still measured, the error kept
            if not use_cueq:
                raise
            cueq_error = f"{name}: cuEquivariance modules not built: {type(err).__name__}: {err}"
            print(f"!! {cueq_error}", flush=True)
            upstream = upstream_layers(name, source, cueq=False)
        if len(upstream) != len(work):
            raise RuntimeError(f"{name}: {len(upstream)} upstream layers, {len(work)} in {e3f}")
        for t, (up, w) in enumerate(zip(upstream, work, strict=True)):
            if up["weight_numel"] != w["weight_numel"]:
                raise RuntimeError(
                    f"{name} layer {t}: upstream weight_numel {up['weight_numel']} "
                    f"against e3fuse's {w['weight_numel']}"
                )
            print(
                f"# {name} layer {t}: {up['irreps_in1']} x {up['irreps_in2']} -> "
                f"{up['irreps_out']}; {w['paths']} paths, {w['weight_numel']} weights; per edge "
                f"fwd {w['fwd_flops']:,} flop {w['fwd_bytes']:,} B, bwd {w['bwd_flops']:,} flop "
                f"(e3fuse {w['bwd_flops_e3fuse']:,}) {w['bwd_bytes']:,} B",
                flush=True,
            )
        for n in args.sizes:
            row: dict[str, Any] = {"model": name, "atoms": n, "cutoff": cutoff, "errors": []}
            if cueq_error:
                row["errors"].append(cueq_error[:1500])
            doc["rows"].append(row)
            if args.deadline_s is not None and time.monotonic() - t0 > args.deadline_s:
                row["errors"].append(f"{name} {n}: deadline reached, not measured")
                continue
            atoms = structures[n]
            if args.dry_run:
                listed, senders, _ = edges_on_cpu(atoms, cutoff)
                inside = len(senders)
                row.update(edges_in_list=listed, edges=inside)
                row["layers"] = [
                    {
                        "layer": t,
                        "fwd_gflop_per_call": w["fwd_flops"] * inside / 1e9,
                        "bwd_gflop_per_call": w["bwd_flops"] * inside / 1e9,
                    }
                    for t, w in enumerate(work)
                ]
                print(
                    f"{name:>10} {n:>7,} atoms: {listed:,} edges in the list (skin {SKIN}), "
                    f"{inside:,} inside {cutoff} A ({inside / n:.1f} per atom); per call "
                    + ", ".join(
                        f"L{t} {x['fwd_gflop_per_call']:.2f}+{x['bwd_gflop_per_call']:.2f} GFLOP"
                        for t, x in enumerate(row["layers"])
                    ),
                    flush=True,
                )
                continue
            row["layers"] = [{"layer": t} for t in range(len(work))]
            with tempfile.TemporaryDirectory() as tmp:
                struct, edges_file = Path(tmp) / "structure.bin", Path(tmp) / "edges.bin"
                write_structure(atoms, struct)
                senders = receivers = None
                if "e3fuse" in args.engines:
                    try:
                        res = run_e3fuse(args.exe, e3f, struct, edges_file, args)
                        row.update(
                            edges=res["edges"],
                            edges_in_list=res["edges_in_list"],
                            gpu=res["device"],
                        )
                        raw = np.fromfile(edges_file, dtype="<i4").reshape(2, -1)
                        senders, receivers = raw[0].astype(np.int64), raw[1].astype(np.int64)
                        for t, (lay, w) in enumerate(zip(res["layers"], work, strict=True)):
                            fwd, bwd = _median(lay["forward_ms"]), _median(lay["backward_ms"])
                            e = res["edges"]
                            row["layers"][t]["e3fuse"] = {
                                "fwd_ms": fwd,
                                "bwd_ms": bwd,
                                "fwd_ms_all": lay["forward_ms"],
                                "bwd_ms_all": lay["backward_ms"],
                                "fwd_gflops": _rate(w["fwd_flops"], e, fwd),
                                "bwd_gflops": _rate(w["bwd_flops"], e, bwd),
                                "bwd_gflops_executed_model": _rate(w["bwd_flops_e3fuse"], e, bwd),
                                "fwd_gbs": _rate(w["fwd_bytes"], e, fwd),
                                "bwd_gbs": _rate(w["bwd_bytes"], e, bwd),
                                "table_intervals": lay["table_intervals"],
                            }
                        print(
                            f"{name:>10} {n:>7,} e3fuse: "
                            + ", ".join(
                                f"L{t} {x['e3fuse']['fwd_ms']:.3f}/{x['e3fuse']['bwd_ms']:.3f} ms"
                                for t, x in enumerate(row["layers"])
                            ),
                            flush=True,
                        )
                    except Exception as err:  # noqa: BLE001 - recorded, the run goes on
                        row["errors"].append(f"{name} {n} e3fuse: {err}"[:1500])
                        print(f"!! {row['errors'][-1]}", flush=True)
                if "cueq" in args.engines and cueq_error is None:
                    if senders is None:  # no e3fuse graph: the CPU list, inside the cutoff
                        _, senders, receivers = edges_on_cpu(atoms, cutoff)
                        row["edges"] = len(senders)
                    for t, up in enumerate(upstream):
                        try:
                            c = time_cueq_layer(
                                up, n, senders, receivers, args.warmup, args.repeats
                            )
                            w = work[t]
                            fwd, bwd = _median(c["tp_forward_ms"]), _median(c["tp_backward_ms"])
                            row["layers"][t]["cueq"] = {
                                "tp_fwd_ms": fwd,
                                "tp_bwd_ms": bwd,
                                "mlp_fwd_ms": _median(c["mlp_forward_ms"]),
                                "mlp_bwd_ms": _median(c["mlp_backward_ms"]),
                                "tp_fwd_gflops": _rate(w["cueq_fwd_flops"], len(senders), fwd),
                                "tp_bwd_gflops": _rate(w["cueq_bwd_flops"], len(senders), bwd),
                                "raw_ms": c,
                            }
                            print(
                                f"{name:>10} {n:>7,} cueq L{t}: TP {fwd:.3f}/{bwd:.3f} ms, MLP "
                                f"{row['layers'][t]['cueq']['mlp_fwd_ms']:.3f}/"
                                f"{row['layers'][t]['cueq']['mlp_bwd_ms']:.3f} ms",
                                flush=True,
                            )
                        except Exception as err:  # noqa: BLE001 - recorded, the run goes on
                            row["errors"].append(f"{name} {n} cueq layer {t}: {err}"[:1500])
                            print(f"!! {row['errors'][-1]}", flush=True)
                            del err
                            import torch

                            torch.cuda.empty_cache()
            if args.json:
                args.json.write_text(json.dumps(doc, indent=1) + "\n")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(doc))
    failed = [e for r in doc["rows"] for e in r.get("errors", [])]
    print(f"# done in {time.monotonic() - t0:.0f} s; {len(failed)} problem(s)", flush=True)
    return 1 if failed and not args.dry_run else 0


if __name__ == "__main__":
    sys.exit(main())
