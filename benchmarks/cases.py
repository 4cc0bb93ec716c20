"""Benchmark case catalog (shared by benchmarks and tests) and the work each case costs.

A case is a rattled fcc copper supercell, id "cu-fcc-<atoms>": a = 3.61 A, cubic
4-atom cell repeated n x n x n (108 = 3^3 * 4, 500 = 5^3 * 4, 2048 = 8^3 * 4,
...), every coordinate displaced by N(0, 0.05 A) drawn from a generator seeded
per case, so the same id is the same structure on every machine and in every run.

Work is counted in multiply-adds (MACs) from the model file's own architecture,
(e3fuse.modelfile.read_architecture); 1 MAC = 2 flops. Terms (E = directed edges
with r < cutoff, N = atoms; sums over interaction layers):

  per edge, forward
    radial MLP      sum_i dims[i] * dims[i+1]      (dims = [num_basis, hidden..., weight_numel])
    tensor product  sum over 'uvu' instructions (mul channels, irrep dims d1 x d2 -> d3) of
                    d1*d2*d3 + mul*(d1*d3 + d3)
                    i.e. M = CG . Y once per edge and instruction (shared by the channels),
                    then per channel x_u . M (d1*d3) and the weight times accumulate into
                    the receiving node (d3; this is also the scatter).
  per node, forward
    linear layers   sum over paths mul_in * mul_out * (2l + 1)   (self-connection, linear_1,
                    linear_2 per layer; readout MLP once). The one-hot species embedding is a
                    row lookup and counts 0.

  MACE (model files of family "mace"): the same per-edge terms (its conv is the same 'uvu'
  product and radial MLP); per node the linears (linear_up, linear, the atom's element's skip
  linear, product_linear, each layer's readout) and the symmetric contraction: for every
  channel and every nonzero of each correlation order nu's coupling tensor, nu multiply-adds
  ("product_per_node"; its adjoint counted as 2 x its forward, like the tensor product's).

  adjoint (forces and stress need gradients w.r.t. inputs only, never w.r.t. parameters)
    radial MLP      = its forward (one transposed product per layer back to the basis)
    tensor product  = 2 x its forward (grad w.r.t. x and w.r.t. M / Y, plus the weight gradient)
    linear layers   = their forward

  model work per energy+forces+stress call = forward + adjoint
      = E * (2*mlp + 3*tp) + N * (2*lin + 3*product)                          ("model_macs")

Not counted (each a few percent or less): spherical harmonics and their gradient,
radial basis and envelope, gate activations, neighbor list, the readout's final
sum. The model count is what any implementation must do; GFLOP/s in the benchmark
uses it for e3fuse and sevenn alike.

e3fuse's CPU backward also *recomputes* each layer's radial MLP and CG contraction per
node tile instead of storing per-edge features (DESIGN section 2), and handles both
directions of an atom pair at each end (no atomics), so its tensor-product adjoint runs
twice per directed edge. Its executed work is therefore about
      E * (3*mlp + 6*tp) + N * (2*lin)                                   ("e3fuse_executed_macs")
(forward 1 + recompute 1 + adjoint 1 for the MLP; forward 1 + recompute 1 + 2 x 2 for
the tensor product). The dense per-channel count mul*(d1*d2*d3 + d1*d3), the cost of
contracting the CG tensor inside the channel loop, is kept as "tp_dense" for comparison.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

LATTICE_CU = 3.61  # Angstrom
RATTLE_STDEV = 0.05  # Angstrom
SEED = 20240607

SIZES = {108: 3, 256: 4, 500: 5, 864: 6, 2048: 8, 4000: 10}


@dataclass(frozen=True)
class Case:
    id: str
    repeat: int
    lattice: float = LATTICE_CU
    rattle: float = RATTLE_STDEV

    @property
    def num_atoms(self) -> int:
        return 4 * self.repeat**3


def case(case_id: str) -> Case:
    """The case named `case_id` ("cu-fcc-<atoms>" with atoms = 4 n^3)."""
    m = re.fullmatch(r"cu-fcc-(\d+)", case_id)
    if not m:
        raise KeyError(f"unknown case {case_id!r} (expected cu-fcc-<atoms>)")
    atoms = int(m.group(1))
    n = round((atoms / 4) ** (1 / 3))
    if 4 * n**3 != atoms:
        raise KeyError(f"{case_id!r}: {atoms} is not 4 n^3")
    return Case(case_id, n)


def case_for_size(num_atoms: int) -> Case:
    return case(f"cu-fcc-{num_atoms}")


CASES = {c.id: c for c in (case_for_size(s) for s in SIZES)}


def build_atoms(c: Case | str) -> Any:
    """The ASE Atoms of a case: cubic fcc Cu, repeated, rattled with a fixed seed."""
    from ase.build import bulk

    if isinstance(c, str):
        c = case(c)
    atoms = bulk("Cu", "fcc", a=c.lattice, cubic=True).repeat((c.repeat,) * 3)
    # Seed from the size so each case is fixed regardless of which others are built.
    rng = np.random.default_rng(SEED + c.num_atoms)
    atoms.positions += rng.normal(0.0, c.rattle, size=atoms.positions.shape)
    atoms.wrap()
    return atoms


def count_edges(atoms: Any, cutoff: float) -> int:
    """Directed edges (i, j, shift) with 0 < |r_ij| < cutoff, periodic images included."""
    from ase.neighborlist import neighbor_list

    i = neighbor_list("i", atoms, cutoff, self_interaction=False)
    return int(len(i))


def _dim(degree: int) -> int:
    return 2 * degree + 1


def _linear_macs(linear: dict[str, Any]) -> int:
    total = 0
    for p in linear["paths"]:
        mul_in, l_in, _ = linear["irreps_in"][p["in"]]
        mul_out, _, _ = linear["irreps_out"][p["out"]]
        total += mul_in * mul_out * _dim(l_in)
    return total


def _readout_macs(readout: dict[str, Any]) -> int:
    """A MACE per-layer readout: {"kind": "linear", "linear": ...} or nonlinear (two linears)."""
    if readout.get("kind") == "linear":
        return _linear_macs(readout["linear"])
    return _linear_macs(readout["linear_1"]) + _linear_macs(readout["linear_2"])


def _symmetric_contraction_macs(product: dict[str, Any], num_contraction_nnz: Any) -> int:
    """MACE's symmetric contraction per node: for every channel and every nonzero of each
    correlation order nu's (element-weighted) coupling tensor, a product of nu features
    (nu multiply-adds). `num_contraction_nnz(out, nu)` gives the nonzero count."""
    total = 0
    for c in product["contractions"]:
        for t in c["terms"]:
            total += num_contraction_nnz(c, t) * t["nu"]
    return total * product["num_features"]


def model_work(architecture: dict[str, Any], nnz: Any = None) -> dict[str, int]:
    """Forward multiply-adds per edge (radial MLP, tensor product) and per node (linears;
    for MACE also the symmetric contraction, `product_per_node`).

    SevenNet layers: conv + self_connection, linear_1, linear_2, one readout at the end.
    MACE layers: conv + linear_up, linear, skip (the atom's own element's linear),
    product_linear, the per-layer readout, and the symmetric contraction, whose nonzero
    counts live in the model file's tensors (`nnz(contraction, term)`; see
    `mace_contraction_nnz`)."""
    mlp = tp = tp_dense = lin = sc = 0
    for layer in architecture["layers"]:
        conv = layer["conv"]
        dims = conv["mlp"]["dims"]
        mlp += sum(dims[i] * dims[i + 1] for i in range(len(dims) - 1))
        if "density" in layer:  # MACE density blocks: w . emb per edge (dims[0] = num_basis)
            mlp += dims[0]
        for ins in conv["instructions"]:
            mul, l1, _ = conv["irreps_in"][ins["in"]]
            _, l2, _ = conv["irreps_sh"][ins["sh"]]
            _, l3, _ = conv["irreps_out"][ins["out"]]
            d1, d2, d3 = _dim(l1), _dim(l2), _dim(l3)
            tp += d1 * d2 * d3 + mul * (d1 * d3 + d3)
            tp_dense += mul * (d1 * d2 * d3 + d1 * d3)
        if "product" in layer:  # MACE
            for key in ("linear_up", "linear", "product_linear"):
                lin += _linear_macs(layer[key])
            skip = layer.get("skip")
            if skip:
                # element-dependent: each atom applies its own element's linear
                lin += _linear_macs(skip["elements"][0] if "elements" in skip else skip)
            if layer.get("readout"):
                lin += _readout_macs(layer["readout"])
            if nnz is not None:
                sc += _symmetric_contraction_macs(layer["product"], nnz)
        else:  # SevenNet
            for key in ("self_connection", "linear_1", "linear_2"):
                # 'nequip' self-connection: each atom applies its own element's linear
                desc = layer[key]
                lin += _linear_macs(desc["elements"][0] if "elements" in desc else desc)
    for linear in architecture.get("readout") or []:
        lin += _linear_macs(linear)
    return {
        "mlp_per_edge": mlp,
        "tp_per_edge": tp,
        "tp_dense_per_edge": tp_dense,
        "linear_per_node": lin,
        "product_per_node": sc,
    }


def mace_contraction_nnz(model_path: str | Path) -> Any:
    """nnz(contraction, term) for `model_work`: the nonzero count of each symmetric-contraction
    coupling tensor, read from the .e3f file's tensors (shape of `values`)."""
    from safetensors import safe_open

    f = safe_open(str(model_path), "np")

    def nnz(_contraction: dict[str, Any], term: dict[str, Any]) -> int:
        return int(f.get_slice(term["values"]).get_shape()[0])

    return nnz


def model_work_of_file(model_path: str | Path) -> dict[str, int]:
    """`model_work` of an .e3f file (MACE's contraction counts read from its tensors)."""
    from e3fuse.modelfile import read_architecture

    arch = read_architecture(model_path)
    nnz = mace_contraction_nnz(model_path) if arch.get("family") == "mace" else None
    return model_work(arch, nnz)


def case_work(
    architecture: dict[str, Any] | None,
    num_atoms: int,
    num_edges: int,
    work: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Multiply-adds and flops of one energy+forces+stress evaluation (see module doc).
    `work`: a precomputed `model_work` (needed for MACE's symmetric contraction)."""
    w = work if work is not None else model_work(architecture)  # type: ignore[arg-type]
    e, n = num_edges, num_atoms
    sc = w.get("product_per_node", 0)
    forward = e * (w["mlp_per_edge"] + w["tp_per_edge"]) + n * (w["linear_per_node"] + sc)
    # the contraction's adjoint (w.r.t. the features) costs about twice its forward
    model = e * (2 * w["mlp_per_edge"] + 3 * w["tp_per_edge"]) + n * (
        2 * w["linear_per_node"] + 3 * sc
    )
    executed = e * (3 * w["mlp_per_edge"] + 6 * w["tp_per_edge"]) + n * (
        2 * w["linear_per_node"] + 3 * sc
    )
    return {
        **w,
        "num_atoms": n,
        "num_edges": e,
        "forward_macs": forward,
        "model_macs": model,
        "model_flops": 2 * model,
        "e3fuse_executed_macs": executed,
        "e3fuse_executed_flops": 2 * executed,
    }


def describe(model_path: str | Path, case_id: str) -> dict[str, Any]:
    """Case id, atom and edge counts and the work of one evaluation with a model file."""
    from e3fuse.modelfile import read_architecture

    arch = read_architecture(model_path)
    atoms = build_atoms(case_id)
    work = model_work_of_file(model_path)
    edges = count_edges(atoms, arch["cutoff"])
    return {"case": case_id, **case_work(arch, len(atoms), edges, work)}


if __name__ == "__main__":  # python benchmarks/cases.py MODEL.e3f [case ...]
    import json
    import sys

    ids = sys.argv[2:] or list(CASES)
    for cid in ids:
        print(json.dumps(describe(sys.argv[1], cid)))
