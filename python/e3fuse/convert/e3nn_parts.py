"""Read e3nn modules (as instantiated by mace-torch or sevenn) into the explicit,
framework-free description that .e3f files store: irreps as [mul, l, parity]
lists, linear layers as per-path matrices with their path weight folded in,
tensor-product coefficients probed from the module itself, activation
normalization constants, and spherical harmonics as polynomial coefficients."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from ..modelfile import TensorStore

ACTIVATIONS = {
    "silu": torch.nn.functional.silu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "abs": torch.abs,
    "relu": torch.relu,
}


class UnsupportedModel(ValueError):
    """The source model uses a module or option e3fuse does not implement."""


def irreps_list(irreps: Any) -> list[list[int]]:
    return [[int(mul), int(ir.l), int(ir.p)] for mul, ir in irreps]


def activation_name(fn: Any) -> str:
    for name, candidate in ACTIVATIONS.items():
        if fn is candidate:
            return name
    qualname = getattr(fn, "__name__", "") or getattr(fn, "name", "") or type(fn).__name__
    lowered = qualname.lower()
    if "shiftedsoftplus" in lowered or lowered == "ssp":
        return "ssp"
    for name in ACTIVATIONS:
        if lowered == name or lowered.endswith("." + name):
            return name
    if isinstance(fn, torch.nn.SiLU):
        return "silu"
    if isinstance(fn, torch.nn.Tanh):
        return "tanh"
    raise UnsupportedModel(f"activation function {qualname!r} is not supported")


def normalized_activation(act: Any) -> dict[str, Any]:
    """An e3nn normalize2mom-wrapped activation -> {"act": name, "scale": cst}."""
    if act is None:
        return {"act": "identity", "scale": 1.0}
    if hasattr(act, "cst"):
        scale = 1.0 if getattr(act, "_is_id", False) else float(act.cst)
        return {"act": activation_name(act.f), "scale": scale}
    return {"act": activation_name(act), "scale": 1.0}


def linear(lin: Any, name: str, store: TensorStore) -> dict[str, Any]:
    """e3nn o3.Linear -> per-path weight matrices [mul_in, mul_out] with the
    path weight (1/sqrt(fan_in)) folded in, plus biases of scalar outputs."""
    if not getattr(lin, "shared_weights", True) or not getattr(lin, "internal_weights", True):
        raise UnsupportedModel(f"{name}: linear layer with external weights is not supported")
    if getattr(lin, "f_in", None) is not None:
        raise UnsupportedModel(f"{name}: linear layer with f_in/f_out is not supported")
    weight = lin.weight.detach().to(torch.float64).reshape(-1)
    bias = lin.bias.detach().to(torch.float64).reshape(-1) if lin.bias.numel() else None
    paths, biases = [], []
    w_offset = b_offset = 0
    for k, ins in enumerate(lin.instructions):
        mul_out = lin.irreps_out[ins.i_out].mul
        if ins.i_in == -1:
            size = math.prod(ins.path_shape)
            assert bias is not None
            b = bias[b_offset : b_offset + size] * ins.path_weight
            b_offset += size
            biases.append({"out": ins.i_out, "weight": store.add(f"{name}.bias.{k}", b.numpy())})
            continue
        mul_in = lin.irreps_in[ins.i_in].mul
        size = mul_in * mul_out
        w = weight[w_offset : w_offset + size].reshape(mul_in, mul_out)
        w_offset += size
        if mul_in == 0 or mul_out == 0:
            continue
        w = w * ins.path_weight
        paths.append(
            {"in": ins.i_in, "out": ins.i_out, "weight": store.add(f"{name}.path.{k}", w.numpy())}
        )
    return {
        "irreps_in": irreps_list(lin.irreps_in),
        "irreps_out": irreps_list(lin.irreps_out),
        "paths": paths,
        "biases": biases,
    }


def tensor_product_uvu(tp: Any, name: str, store: TensorStore) -> dict[str, Any]:
    """e3nn TensorProduct with 'uvu' instructions and per-edge weights, the
    channelwise convolution of NequIP/SevenNet/MACE. Each instruction's
    coefficient tensor C[i, j, k] (path weight included) is probed from the
    module itself in float64, so specialized code paths and stored Wigner-3j
    buffers are reproduced exactly as the source model evaluates them."""
    if tp.shared_weights or tp.internal_weights:
        raise UnsupportedModel(f"{name}: tensor product with internal weights is not supported")
    instructions = []
    weight_offset = 0
    dtype = torch.float64
    for k, ins in enumerate(tp.instructions):
        if ins.connection_mode != "uvu" or not ins.has_weight:
            raise UnsupportedModel(
                f"{name}: tensor product instruction mode {ins.connection_mode!r} is not supported"
            )
        mul1, ir1 = tp.irreps_in1[ins.i_in1]
        mul2, ir2 = tp.irreps_in2[ins.i_in2]
        mul_out, ir_out = tp.irreps_out[ins.i_out]
        if mul2 != 1 or mul_out != mul1:
            raise UnsupportedModel(f"{name}: uvu instruction with second multiplicity {mul2}")
        d1, d2, d3 = ir1.dim, ir2.dim, ir_out.dim
        # Probe: x1 = e_(u=0, i), x2 = e_j, weight 1 on this instruction only.
        x1 = torch.zeros(d1 * d2, tp.irreps_in1.dim, dtype=dtype)
        x2 = torch.zeros(d1 * d2, tp.irreps_in2.dim, dtype=dtype)
        start1 = tp.irreps_in1.slices()[ins.i_in1].start
        start2 = tp.irreps_in2.slices()[ins.i_in2].start
        for i, j in itertools.product(range(d1), range(d2)):
            x1[i * d2 + j, start1 + i] = 1.0
            x2[i * d2 + j, start2 + j] = 1.0
        w = torch.zeros(d1 * d2, tp.weight_numel, dtype=dtype)
        w[:, weight_offset : weight_offset + mul1] = 1.0
        with torch.no_grad():
            out = tp(x1, x2, w)
        start3 = tp.irreps_out.slices()[ins.i_out].start
        cg = out[:, start3 : start3 + d3].reshape(d1, d2, d3)
        instructions.append(
            {
                "in": ins.i_in1,
                "sh": ins.i_in2,
                "out": ins.i_out,
                "weight_offset": weight_offset,
                "cg": store.add(f"{name}.cg.{k}", cg.numpy()),
            }
        )
        weight_offset += mul1
    assert weight_offset == tp.weight_numel
    return {
        "irreps_in": irreps_list(tp.irreps_in1),
        "irreps_sh": irreps_list(tp.irreps_in2),
        "irreps_out": irreps_list(tp.irreps_out),
        "weight_numel": int(tp.weight_numel),
        "instructions": instructions,
    }


def fully_connected_net(fc: Any, name: str, store: TensorStore) -> dict[str, Any]:
    """e3nn FullyConnectedNet: x <- act(x @ W / sqrt(h_in * var_in)) * sqrt(var_out)
    for hidden layers; the last layer has no activation. Scales folded into W."""
    layers = [getattr(fc, f"layer{i}") for i in range(len(fc.hs) - 1)]
    weights, act = [], None
    for i, layer in enumerate(layers):
        w = layer.weight.detach().to(torch.float64)
        if layer.act is not None:
            w = w / (layer.h_in * layer.var_in) ** 0.5
            if layer.var_out != 1:
                raise UnsupportedModel(f"{name}: radial MLP with variance_out != 1")
            this_act = normalized_activation(layer.act)
            if act is not None and this_act != act:
                raise UnsupportedModel(f"{name}: radial MLP with mixed activations")
            act = this_act
        else:
            if i != len(layers) - 1:
                raise UnsupportedModel(f"{name}: radial MLP with a linear hidden layer")
            w = w / (layer.h_in * layer.var_in / layer.var_out) ** 0.5
        weights.append(store.add(f"{name}.w{i}", w.numpy()))
    return {
        "dims": [int(h) for h in fc.hs],
        "weights": weights,
        **(act or {"act": "identity", "scale": 1.0}),
    }


def gate(g: Any, name: str) -> dict[str, Any]:
    """e3nn nn.Gate: input = [scalars | gates | gated] (flat), output =
    [act(scalars) | act(gates) * gated]."""
    irreps_scalars, irreps_gates, irreps_gated = g.sc.irreps_outs
    scalars, offset = [], 0
    for (mul, ir), act in zip(irreps_scalars, g.act_scalars.acts):
        scalars.append({"start": offset, "dim": mul * ir.dim, **normalized_activation(act)})
        offset += mul * ir.dim
    gates = []
    for (mul, ir), act in zip(irreps_gates, g.act_gates.acts):
        gates.append({"start": offset, "dim": mul * ir.dim, **normalized_activation(act)})
        offset += mul * ir.dim
    gated = []
    for mul, ir in irreps_gated:
        gated.append({"start": offset, "mul": mul, "l": ir.l})
        offset += mul * ir.dim
    if irreps_gated.dim:
        with torch.no_grad():
            ones = g.mul(
                torch.ones(1, irreps_gated.dim, dtype=torch.float64),
                torch.ones(1, irreps_gates.dim, dtype=torch.float64),
            )
        factor = float(ones.abs().max())
        if not torch.allclose(ones, torch.full_like(ones, factor), rtol=1e-14, atol=0):
            raise UnsupportedModel(f"{name}: gate product with non-uniform normalization")
    else:
        factor = 1.0
    return {
        "irreps_in": irreps_list(g.irreps_in),
        "irreps_out": irreps_list(g.irreps_out),
        "scalars": scalars,
        "gates": gates,
        "gated": gated,
        "gated_factor": factor,
    }


def monomial_exponents(degree: int) -> list[tuple[int, int, int]]:
    return [
        (a, b, degree - a - b) for a in range(degree, -1, -1) for b in range(degree - a, -1, -1)
    ]


def _integer_columns(matrix: np.ndarray) -> tuple[list[list[int]], list[Fraction]]:
    """Each float64 column as integers over one power of two: column j = ints[j] * scales[j],
    exactly (floats are dyadic rationals)."""
    ints, scales = [], []
    for column in np.asarray(matrix, dtype=np.float64).T.tolist():
        fractions = [Fraction(v) for v in column]
        den = max(f.denominator for f in fractions)
        ints.append([f.numerator * (den // f.denominator) for f in fractions])
        scales.append(Fraction(1, den))
    return ints, scales


def exact_least_squares(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin_x |a x - b| for float64 a [n, k] (full column rank) and b [n, m], solved exactly
    and rounded once to float64. LAPACK's solution differs in the last bits from one process
    to the next (its blocked kernels follow the arrays' alignment), which made two conversions
    of one checkpoint differ; this one depends on the inputs' values only.

    With a = A S and b = B T (integers A, B over powers of two S, T: _integer_columns), the
    normal equations S A^T A S x = S A^T B T become G Y = H for the integers G = A^T A,
    H = A^T B and x = S^-1 Y T, solved by fraction-free Gauss-Jordan elimination (Bareiss,
    Math. Comp. 22 (1968) 565): every division below is exact, and at the end each diagonal
    entry is det G and row i holds det G * Y[i]."""
    a_ints, a_scales = _integer_columns(a)
    b_ints, b_scales = _integer_columns(b)
    k, m = len(a_ints), len(b_ints)

    def dot(x: list[int], y: list[int]) -> int:
        return sum(p * q for p, q in zip(x, y))

    system = [
        [dot(a_ints[i], a_ints[j]) for j in range(k)] + [dot(a_ints[i], y) for y in b_ints]
        for i in range(k)
    ]
    previous = 1
    for col in range(k):
        pivot = next((r for r in range(col, k) if system[r][col] != 0), None)
        if pivot is None:
            raise RuntimeError("exact_least_squares: the columns are linearly dependent")
        system[col], system[pivot] = system[pivot], system[col]
        lead = system[col]
        for r in range(k):
            if r == col:
                continue
            row, factor = system[r], system[r][col]
            for j in range(k + m):
                value, rest = divmod(lead[col] * row[j] - factor * lead[j], previous)
                if rest:
                    raise RuntimeError("exact_least_squares: inexact division (a bug)")
                row[j] = value
        previous = lead[col]
    return np.array(
        [
            [
                float(Fraction(system[i][k + j], system[i][i]) * b_scales[j] / a_scales[i])
                for j in range(m)
            ]
            for i in range(k)
        ],
        dtype=np.float64,
    )


def spherical_harmonics(
    lmax: int, normalization: str, name: str, store: TensorStore, normalize: bool = True
) -> dict[str, Any]:
    """e3nn's real spherical harmonics (normalize=False) of degree l are homogeneous
    polynomials of (x, y, z); we store their monomial coefficients, fitted to float64 values
    on random points (exact to rounding; the fit in rational arithmetic, so that every
    conversion stores the same bits), so the core needs no convention of its own."""
    from e3nn import o3

    rng = np.random.default_rng(0)
    points = torch.from_numpy(rng.normal(size=(256, 3)))
    polynomials = []
    for l in range(lmax + 1):
        exps = monomial_exponents(l)
        basis = torch.stack(
            [points[:, 0] ** a * points[:, 1] ** b * points[:, 2] ** c for a, b, c in exps], dim=1
        )
        values = o3.spherical_harmonics(l, points, normalize=False, normalization=normalization)
        coeffs = torch.from_numpy(exact_least_squares(basis.numpy(), values.numpy()))
        coeffs[coeffs.abs() < 1e-13] = 0.0  # [monomials, 2l+1]
        residual = (basis @ coeffs - values).abs().max().item()
        if residual > 1e-10 * max(1.0, values.abs().max().item()):
            raise RuntimeError(f"spherical harmonics l={l}: polynomial fit residual {residual}")
        polynomials.append(
            {
                "l": l,
                "exponents": store.add(f"{name}.l{l}.exponents", np.array(exps), dtype="int64"),
                "coeffs": store.add(f"{name}.l{l}.coeffs", coeffs.T.numpy()),  # [2l+1, monomials]
            }
        )
    return {
        "lmax": lmax,
        "normalize": normalize,  # False: Y(v) = P(v) of the raw edge vector
        "normalization": normalization,
        "polynomials": polynomials,
    }
