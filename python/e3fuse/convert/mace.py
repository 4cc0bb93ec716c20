"""Convert a mace-torch model (whole-model file written by torch.save(model), or a
model object) into an .e3f file.

Supported: MACE and ScaleShiftMACE with RealAgnosticInteractionBlock /
RealAgnosticResidualInteractionBlock / RealAgnosticDensity[Residual]InteractionBlock,
RealAgnosticResidualNonLinearInteractionBlock (its RadialMLP per ordered species pair:
exact per edge in double, radial="mlp", or from radial tables, radial="table", on both
devices),
Bessel radial basis with the polynomial cutoff, the Agnesi and Soft distance transforms,
apply_cutoff True or False, e3nn spherical harmonics, linear and non-linear readouts,
E0s, scale and shift, ZBL pair repulsion, several heads (one selected at conversion),
use_agnostic_product, use_last_readout_only, edge_irreps / use_edge_irreps_first, and
embedding_specs of the per-system total_charge / total_spin (with or without
use_embedding_readout; their values are given at run time, see
Model::with_system_inputs). Everything else is refused by module name.

Conventions (see DESIGN §5): mace's edge vector is pos[receiver] - pos[sender]
(+ shift); the core's convolution uses pos[sender] - pos[receiver], so the
tensor-product coefficients of odd-l spherical-harmonics paths are negated
(Y_l(-v) = (-1)^l Y_l(v)). The symmetric contraction is stored as sparse
generalized-CG tensors (index tuples sorted, permutations summed, which is
exact because the product of features is symmetric) plus the per-element
weights [num_elements, num_params, num_features]."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import __version__
from ..modelfile import FORMAT_VERSION, TensorStore, sha256_of_file, write_model_file
from . import e3nn_parts as parts
from .e3nn_parts import UnsupportedModel
from .exact_constants import restore_float64_constants

SUPPORTED_MODELS = ("MACE", "ScaleShiftMACE")
SUPPORTED_INTERACTIONS = (
    "RealAgnosticInteractionBlock",
    "RealAgnosticResidualInteractionBlock",
    "RealAgnosticDensityInteractionBlock",
    "RealAgnosticDensityResidualInteractionBlock",
)
DENSITY_INTERACTIONS = (
    "RealAgnosticDensityInteractionBlock",
    "RealAgnosticDensityResidualInteractionBlock",
)
NONLINEAR_INTERACTION = "RealAgnosticResidualNonLinearInteractionBlock"

# The constants of mace's distance transforms (mace/modules/radial.py AgnesiTransform,
# SoftTransform defaults), taken as float64 literals when the module's buffers equal them to
# float32 rounding (a model built in float32), else the module's values (trained ones).
AGNESI_DEFAULTS = {"q": 0.9183, "p": 4.5791, "a": 1.0805}
SOFT_DEFAULTS = {"alpha": 4.0}


def load_mace_model(source: str | Path | torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of the mace model in eval mode, its constants (Wigner 3j
    symbols, symmetric-contraction U matrices) recomputed in float64."""
    import copy

    if isinstance(source, torch.nn.Module):
        model = copy.deepcopy(source)
    else:
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"{source!r} is not a mace-torch model file")
        model = torch.load(str(path), map_location="cpu", weights_only=False)
        if not isinstance(model, torch.nn.Module):
            raise UnsupportedModel(
                f"{source!r} does not hold a whole model (torch.save(model)); got "
                f"{type(model).__name__}"
            )
    model = model.to(torch.float64).eval()
    restore_float64_constants(model)
    return model


def _element_linear(tp: Any, name: str, store: TensorStore, num_elements: int) -> dict[str, Any]:
    """FullyConnectedTensorProduct(x, one-hot species) -> one linear layer per
    element, probed from the module (e_u at m = 0 of each input block)."""
    if type(tp).__name__ != "FullyConnectedTensorProduct":
        raise UnsupportedModel(f"{name}: {type(tp).__name__} is not supported")
    irreps_in, irreps_attr, irreps_out = tp.irreps_in1, tp.irreps_in2, tp.irreps_out
    if irreps_attr.dim != num_elements or any(ir.l != 0 for _, ir in irreps_attr):
        raise UnsupportedModel(f"{name}: second input is not the one-hot species")
    starts_in = [s.start for s in irreps_in.slices()]
    starts_out = [s.start for s in irreps_out.slices()]
    elements = []
    for s in range(num_elements):
        paths = []
        for bi, (mul_in, ir_in) in enumerate(irreps_in):
            if mul_in == 0:
                continue
            x = torch.zeros(mul_in, irreps_in.dim, dtype=torch.float64)
            for u in range(mul_in):
                x[u, starts_in[bi] + u * ir_in.dim] = 1.0
            attr = torch.zeros(mul_in, num_elements, dtype=torch.float64)
            attr[:, s] = 1.0
            with torch.no_grad():
                out = tp(x, attr)
            for bo, (mul_out, ir_out) in enumerate(irreps_out):
                if ir_out != ir_in or mul_out == 0:
                    continue
                w = out[:, starts_out[bo] : starts_out[bo] + mul_out * ir_out.dim : ir_out.dim]
                if not torch.any(w != 0):
                    continue
                paths.append(
                    {
                        "in": bi,
                        "out": bo,
                        "weight": store.add(f"{name}.e{s}.path.{bi}.{bo}", w.numpy()),
                    }
                )
        elements.append(
            {
                "irreps_in": parts.irreps_list(irreps_in),
                "irreps_out": parts.irreps_list(irreps_out),
                "paths": paths,
                "biases": [],
            }
        )
    _check_element_linear(tp, elements, store, num_elements, name)
    return {
        "irreps_in": parts.irreps_list(irreps_in),
        "irreps_out": parts.irreps_list(irreps_out),
        "elements": elements,
    }


def _check_element_linear(
    tp: Any, elements: list[dict[str, Any]], store: TensorStore, num_elements: int, name: str
) -> None:
    """Rebuild the probed maps and compare with the module on random inputs."""
    irreps_in, irreps_out = tp.irreps_in1, tp.irreps_out
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(num_elements, irreps_in.dim, dtype=torch.float64, generator=gen)
    attr = torch.eye(num_elements, dtype=torch.float64)
    with torch.no_grad():
        expected = tp(x, attr)
    got = torch.zeros_like(expected)
    sl_in, sl_out = irreps_in.slices(), irreps_out.slices()
    for s, desc in enumerate(elements):
        for p in desc["paths"]:
            mul_in, ir = irreps_in[p["in"]]
            mul_out = irreps_out[p["out"]].mul
            w = torch.from_numpy(store.arrays[p["weight"]])
            xin = x[s, sl_in[p["in"]]].reshape(mul_in, ir.dim)
            got[s, sl_out[p["out"]]] += (w.T @ xin).reshape(mul_out * ir.dim)
    err = (got - expected).abs().max().item() if expected.numel() else 0.0
    if err > 1e-12 * max(1.0, expected.abs().max().item()):
        raise RuntimeError(f"{name}: element-wise linear probe does not reproduce ({err:.2e})")


def _product(prod: Any, name: str, store: TensorStore, num_elements: int) -> dict[str, Any]:
    """EquivariantProductBasisBlock's SymmetricContraction -> sparse U tensors
    (m, i_1 <= ... <= i_nu, k, value) and weights per correlation order.

    use_agnostic_product=True: mace builds the contraction for one element and feeds it
    node_attrs = ones (EquivariantProductBasisBlock.forward), i.e. the weights of that one
    element for every atom; storing them once per species is the same contraction."""
    sc = prod.symmetric_contractions
    agnostic = bool(getattr(prod, "use_agnostic_product", False))
    if type(sc).__name__ != "SymmetricContraction":
        raise UnsupportedModel(f"{name}: {type(sc).__name__} (cuequivariance/oeq) is not supported")
    irreps_in, irreps_out = sc.irreps_in, sc.irreps_out
    muls = {mul for mul, _ in irreps_in}
    if len(muls) != 1:
        raise UnsupportedModel(f"{name}: symmetric contraction input with unequal multiplicities")
    num_features = muls.pop()
    num_ell = sum(ir.dim for _, ir in irreps_in)
    contractions = []
    for c, (contraction, (mul_out, ir_out)) in enumerate(zip(sc.contractions, irreps_out)):
        if mul_out != num_features:
            raise UnsupportedModel(f"{name}: output multiplicity {mul_out} != {num_features}")
        d = ir_out.dim
        weights_by_nu = {contraction.correlation: contraction.weights_max}
        for i, w in enumerate(contraction.weights):
            weights_by_nu[contraction.correlation - i - 1] = w
        terms = []
        for nu in range(1, contraction.correlation + 1):
            u = contraction.U_tensors(nu).detach().to(torch.float64)
            k_params = u.shape[-1]
            u = u.reshape(d, *([num_ell] * nu), k_params)  # L = 0: m axis restored
            w = weights_by_nu[nu].detach().to(torch.float64)
            if agnostic and w.shape[0] == 1:
                w = w.expand(num_elements, -1, -1).contiguous()
            if tuple(w.shape) != (num_elements, k_params, num_features):
                raise UnsupportedModel(f"{name}: unexpected weight shape {tuple(w.shape)}")
            acc: dict[tuple[int, ...], float] = {}
            nz = torch.nonzero(u).tolist()
            for idx in nz:
                m, ii, k = idx[0], tuple(sorted(idx[1:-1])), idx[-1]
                key = (m, *ii, k)
                acc[key] = acc.get(key, 0.0) + float(u[tuple(idx)])
            keys = [key for key, v in acc.items() if v != 0.0]
            if not keys:
                continue
            index = np.array(keys, dtype=np.int64).reshape(len(keys), nu + 2)
            values = np.array([acc[key] for key in keys])
            terms.append(
                {
                    "nu": nu,
                    "num_params": int(k_params),
                    "index": store.add(f"{name}.c{c}.nu{nu}.index", index, dtype="int64"),
                    "values": store.add(f"{name}.c{c}.nu{nu}.values", values),
                    "weights": store.add(f"{name}.c{c}.nu{nu}.weights", w.numpy()),
                }
            )
        contractions.append({"out": c, "terms": terms})
    _check_product(sc, contractions, store, num_elements, num_features, num_ell, name, agnostic)
    return {
        "irreps_in": parts.irreps_list(irreps_in),
        "irreps_out": parts.irreps_list(irreps_out),
        "num_features": int(num_features),
        "num_ell": int(num_ell),
        "contractions": contractions,
    }


def _check_product(
    sc: Any,
    contractions: list[dict[str, Any]],
    store: TensorStore,
    num_elements: int,
    num_features: int,
    num_ell: int,
    name: str,
    agnostic: bool = False,
) -> None:
    """Evaluate the sparse form in numpy against the module on random inputs."""
    gen = torch.Generator().manual_seed(1)
    n = max(num_elements, 2)
    x = torch.randn(n, num_features, num_ell, dtype=torch.float64, generator=gen)
    species = np.arange(n) % num_elements
    attr = torch.zeros(n, num_elements, dtype=torch.float64)
    attr[torch.arange(n), torch.from_numpy(species)] = 1.0
    if agnostic:  # mace's constant node_attrs of the element-agnostic product
        attr = torch.ones(n, 1, dtype=torch.float64)
    with torch.no_grad():
        expected = sc(x, attr).numpy()
    xs = x.numpy()
    outs = []
    for desc, (_, ir) in zip(contractions, sc.irreps_out):
        out = np.zeros((n, num_features, ir.dim))
        for t in desc["terms"]:
            index, values = store.arrays[t["index"]], store.arrays[t["values"]]
            w = store.arrays[t["weights"]][species]  # [n, K, C]
            for row, v in zip(index, values):
                m, ii, k = row[0], row[1:-1], row[-1]
                prod = np.prod(xs[:, :, ii], axis=2)  # [n, C]
                out[:, :, m] += v * w[:, k, :] * prod
        outs.append(out.reshape(n, -1))
    got = np.concatenate(outs, axis=1)
    err = np.abs(got - expected).max()
    if err > 1e-10 * max(1.0, np.abs(expected).max()):
        raise RuntimeError(f"{name}: sparse symmetric contraction does not reproduce ({err:.2e})")


def _float64_constant(value: float, literal: float | None) -> float:
    """`literal` when `value` equals it to float32 rounding, else `value`."""
    if literal is not None and abs(value - literal) <= 1e-7 * abs(literal):
        return literal
    return value


def _distance_transform(
    transform: Any, atomic_numbers: list[int], store: TensorStore
) -> dict[str, Any]:
    """AgnesiTransform / SoftTransform -> constants and the covalent radii of the model's
    elements (ase's table in float64 where the module's buffer equals it to float32 rounding)."""
    from ase.data import covalent_radii

    kind = type(transform).__name__
    if kind == "AgnesiTransform":
        desc: dict[str, Any] = {"kind": "agnesi"}
        defaults: dict[str, float] = AGNESI_DEFAULTS
    elif kind == "SoftTransform":
        desc = {"kind": "soft"}
        defaults = SOFT_DEFAULTS
    else:
        raise UnsupportedModel(f"radial_embedding.distance_transform: {kind} is not supported")
    for key, literal in defaults.items():
        value = float(getattr(transform, key).detach().to(torch.float64))
        desc[key] = _float64_constant(value, literal)
    module_radii = transform.covalent_radii.detach().to(torch.float64).numpy()
    radii = np.array(
        [
            _float64_constant(float(module_radii[z]), float(covalent_radii[z]))
            for z in atomic_numbers
        ]
    )
    desc["covalent_radii"] = store.add("radial.transform.covalent_radii", radii)
    return desc


def _density(inter: Any, name: str, store: TensorStore, num_basis: int) -> dict[str, Any]:
    """density_fn, an e3nn FullyConnectedNet [num_basis, 1] (one linear layer) -> w with
    density_fn(emb) = w . emb."""
    fc = inter.density_fn
    if list(fc.hs) != [num_basis, 1]:
        raise UnsupportedModel(f"{name}.density_fn: layer sizes {list(fc.hs)} are not supported")
    layer = fc.layer0
    w = layer.weight.detach().to(torch.float64).reshape(num_basis)
    w = w / (layer.h_in * layer.var_in / layer.var_out) ** 0.5
    return {"weights": store.add(f"{name}.density.weights", w.numpy())}


def _radial_mlp(
    mlp: Any,
    inter: Any,
    name: str,
    store: TensorStore,
    num_basis: int,
    num_elements: int,
) -> dict[str, Any]:
    """mace's RadialMLP (Linear -> LayerNorm -> SiLU ... -> Linear) on [emb(r) | source
    embedding of the sender | target embedding of the receiver] -> its layers, the species
    embeddings folded into one first-layer bias per ordered species pair (RadialMlpPlan)."""
    modules = list(mlp.net)
    linears = [m for m in modules if isinstance(m, torch.nn.Linear)]
    expected: list[type] = []
    for i in range(len(linears)):
        expected.append(torch.nn.Linear)
        if i + 1 < len(linears):
            expected += [torch.nn.LayerNorm, torch.nn.SiLU]
    if [type(m) for m in modules] != expected:
        raise UnsupportedModel(f"{name}: RadialMLP layout {[type(m).__name__ for m in modules]}")
    eye = torch.eye(num_elements, dtype=torch.float64)
    with torch.no_grad():
        source = inter.source_embedding(eye)  # [species, C]
        target = inter.target_embedding(eye)
    c = source.shape[1]
    first = linears[0]
    w = first.weight.detach().to(torch.float64)  # [out, in]
    if w.shape[1] != num_basis + 2 * c:
        raise UnsupportedModel(f"{name}: RadialMLP input size {w.shape[1]}")
    b0 = first.bias.detach().to(torch.float64)
    from_source = source @ w[:, num_basis : num_basis + c].T  # [sender species, out]
    from_target = target @ w[:, num_basis + c :].T  # [receiver species, out]
    # pair (receiver a, sender b) at a * S + b
    pair_bias = b0[None, None, :] + from_target[:, None, :] + from_source[None, :, :]
    weights = [store.add(f"{name}.w0", w[:, :num_basis].T.contiguous().numpy())]
    biases = [None]
    for i, lin in enumerate(linears[1:], start=1):
        weights.append(
            store.add(f"{name}.w{i}", lin.weight.detach().to(torch.float64).T.contiguous().numpy())
        )
        biases.append(store.add(f"{name}.b{i}", lin.bias.detach().to(torch.float64).numpy()))
    norms = [m for m in modules if isinstance(m, torch.nn.LayerNorm)]
    eps = {float(m.eps) for m in norms}
    if len(eps) > 1 or any(not m.elementwise_affine or m.bias is None for m in norms):
        raise UnsupportedModel(f"{name}: LayerNorm settings")
    return {
        "dims": [num_basis] + [int(lin.out_features) for lin in linears],
        "weights": weights,
        "biases": biases[1:],
        "pair_bias": store.add(
            f"{name}.pair_bias", pair_bias.reshape(num_elements * num_elements, -1).numpy()
        ),
        "gamma": [
            store.add(f"{name}.ln{i}.gamma", m.weight.detach().to(torch.float64).numpy())
            for i, m in enumerate(norms)
        ],
        "beta": [
            store.add(f"{name}.ln{i}.beta", m.bias.detach().to(torch.float64).numpy())
            for i, m in enumerate(norms)
        ],
        "eps": eps.pop() if eps else 1e-5,
    }


def _gated_block(block: Any, name: str) -> dict[str, Any]:
    """mace's GatedEquivariantBlock (mul_ir layout): input sorted [scalars | gates | gated] as
    e3nn's Gate, silu on the scalars, sigmoid on the gates, each times its normalize2mom
    constant (the module's float values)."""
    if block._layout_is_ir_mul:
        raise UnsupportedModel(f"{name}: ir_mul layout (cuequivariance)")
    acts = (block._act_scalar, block._act_gate)
    if acts[0] is not torch.nn.functional.silu or acts[1] is not torch.nn.functional.sigmoid:
        raise UnsupportedModel(f"{name}: activations other than silu / sigmoid")
    gated = []
    for start, _length, ir_dim, mul, g_off in block._gated_info:
        gated.append({"start": start, "mul": mul, "l": (ir_dim - 1) // 2, "gate": g_off})
    if [g["gate"] for g in gated] != list(np.cumsum([0] + [g["mul"] for g in gated])[:-1]):
        raise UnsupportedModel(f"{name}: gates not in the order of the gated irreps")
    for g in gated:
        del g["gate"]
    return {
        "irreps_in": parts.irreps_list(block.irreps_in),
        "irreps_out": parts.irreps_list(block.irreps_out),
        "scalars": [
            {
                "start": block._s_start,
                "dim": block._s_len,
                "act": "silu",
                "scale": block._scalar_cst,
            }
        ],
        "gates": [
            {
                "start": block._g_start,
                "dim": block._g_len,
                "act": "sigmoid",
                "scale": block._gate_cst,
            }
        ]
        if gated
        else [],
        "gated": gated,
        "gated_factor": 1.0,
    }


def _shared_linear(lin: Any, name: str, store: TensorStore) -> dict[str, Any]:
    """A plain o3.Linear skip connection as the element-dependent one with a single map,
    shared by all species (ElementLinearPlan::shared; one copy in memory, not one per
    species)."""
    desc = parts.linear(lin, name, store)
    return {
        "irreps_in": desc["irreps_in"],
        "irreps_out": desc["irreps_out"],
        "elements": [desc],
    }


def _nonlinear_layer(
    inter: Any, prod: Any, name: str, store: TensorStore, num_basis: int, num_elements: int
) -> dict[str, Any]:
    """RealAgnosticResidualNonLinearInteractionBlock (MaceLayer::nonlinear_block)."""
    conv = parts.tensor_product_uvu(inter.conv_tp, f"{name}.conv", store)
    _flip_edge_direction(conv, store)
    conv["radial_mlp"] = _radial_mlp(
        inter.conv_tp_weights, inter, f"{name}.conv.radial_mlp", store, num_basis, num_elements
    )
    conv["denominator"] = 1.0  # divided by alpha + beta rho instead
    density = _radial_mlp(
        inter.density_fn, inter, f"{name}.density_mlp", store, num_basis, num_elements
    )
    if density["dims"][-1] != 1:
        raise UnsupportedModel(f"{name}.density_fn: {density['dims'][-1]} outputs")
    return {
        "residual": True,
        "skip": _shared_linear(inter.skip_tp, f"{name}.skip", store),
        "linear_up": parts.linear(inter.linear_up, f"{name}.linear_up", store),
        "conv": conv,
        "linear": parts.linear(inter.linear_1, f"{name}.linear_1", store),
        "nonlinear_block": {
            "linear_res": parts.linear(inter.linear_res, f"{name}.linear_res", store),
            "linear_2": parts.linear(inter.linear_2, f"{name}.linear_2", store),
            "gate": _gated_block(inter.equivariant_nonlin, f"{name}.equivariant_nonlin"),
            "density_mlp": density,
            "alpha": float(inter.alpha.detach()),
            "beta": float(inter.beta.detach()),
        },
        "product": _product(prod, f"{name}.product", store, num_elements),
        "product_linear": parts.linear(prod.linear, f"{name}.product_linear", store),
        "product_sc": bool(prod.use_sc),
    }


def _flip_edge_direction(conv: dict[str, Any], store: TensorStore) -> None:
    """Negate the coefficients of odd-l spherical-harmonics paths (see module doc)."""
    sh_degrees = [degree for _, degree, _ in conv["irreps_sh"]]
    for ins in conv["instructions"]:
        if sh_degrees[ins["sh"]] % 2 == 1:
            store.arrays[ins["cg"]] = -store.arrays[ins["cg"]]


def _readout(
    readout: Any, name: str, store: TensorStore, head: int, num_heads: int
) -> dict[str, Any]:
    kind = type(readout).__name__
    if kind == "LinearReadoutBlock":
        lin = parts.linear(readout.linear, f"{name}.linear", store)
        _select_output(lin, head, store)
        return {"kind": "linear", "linear": lin}
    if kind == "NonLinearReadoutBlock":
        lin1 = parts.linear(readout.linear_1, f"{name}.linear_1", store)
        lin2 = parts.linear(readout.linear_2, f"{name}.linear_2", store)
        acts = readout.non_linearity.acts
        if len(acts) != 1 or any(ir.l != 0 for _, ir in readout.non_linearity.irreps_in):
            raise UnsupportedModel(f"{name}: readout non-linearity on non-scalars")
        act = parts.normalized_activation(acts[0])
        hidden = readout.linear_1.irreps_out.dim
        if num_heads > 1:  # mask_head: keep the hidden units of this head only
            per = hidden // num_heads
            keep = np.zeros(hidden, dtype=bool)
            keep[head * per : (head + 1) * per] = True
            for p in lin2["paths"]:
                start = sum(m * (2 * deg + 1) for m, deg, _ in lin2["irreps_in"][: p["in"]])
                mul = lin2["irreps_in"][p["in"]][0]
                w = store.arrays[p["weight"]]
                store.arrays[p["weight"]] = w * keep[start : start + mul, None]
        _select_output(lin2, head, store)
        return {"kind": "nonlinear", "linear_1": lin1, "linear_2": lin2, **act}
    raise UnsupportedModel(f"{name}: {kind} is not supported")


def _zero_readout(features: dict[str, Any], name: str, store: TensorStore) -> dict[str, Any]:
    """A linear readout of `features`' output irreps whose one path (from the first 0e
    block) has zero weights: the energy term of a layer that mace does not read out."""
    irreps = features["irreps_out"]
    scalar = [b for b, (_, degree, parity) in enumerate(irreps) if degree == 0 and parity == 1]
    if not scalar:
        raise UnsupportedModel(f"{name}: layer features without scalars")
    mul = irreps[scalar[0]][0]
    weight = store.add(f"{name}.zero", np.zeros((mul, 1)))
    linear = {
        "irreps_in": irreps,
        "irreps_out": [[1, 0, 1]],
        "paths": [{"in": scalar[0], "out": 0, "weight": weight}],
        "biases": [],
    }
    return {"kind": "linear", "linear": linear}


def _select_output(lin: dict[str, Any], head: int, store: TensorStore) -> None:
    """Keep output column `head` of a readout linear (irreps_out = num_heads x 0e)."""
    out = lin["irreps_out"]
    if len(out) != 1 or out[0][1] != 0:
        raise UnsupportedModel("readout output must be scalars")
    if out[0][0] == 1:
        return
    for p in lin["paths"]:
        w = store.arrays[p["weight"]]
        store.arrays[p["weight"]] = np.ascontiguousarray(w[:, head : head + 1])
    for b in lin["biases"]:
        store.arrays[b["weight"]] = np.ascontiguousarray(store.arrays[b["weight"]][head : head + 1])
    lin["irreps_out"] = [[1, 0, 1]]


# mace's per-system inputs: the AtomicData field an embedding_specs name reads, the
# atoms.info key MACECalculator fills it from, and AtomicData's default (atomic_data.py).
SYSTEM_INPUTS = {"total_charge": ("charge", 0.0), "total_spin": ("spin", 1.0)}


def _bias_or_zeros(layer: Any, dim: int, store: TensorStore, name: str) -> str:
    """torch.nn.Linear's bias (zeros when built with use_bias=False)."""
    b = layer.bias
    values = np.zeros(dim) if b is None else b.detach().to(torch.float64).numpy()
    return store.add(name, values)


def _joint_embedding(
    model: torch.nn.Module, store: TensorStore, head: int, num_heads: int
) -> dict[str, Any]:
    """GenericJointEmbedding (+ the embedding readout) of per-system inputs -> their
    embedders, the projection and the readout (see JointEmbeddingPlan in plan.h)."""
    joint = model.joint_embedding
    specs = dict(model.embedding_specs)
    if not specs:  # mace-torch's own forward fails on it (torch.cat of no embeddings)
        raise UnsupportedModel("embedding_specs is empty: the joint embedding has no inputs")
    named = f"embedding_specs ({', '.join(specs)})"
    if type(joint).__name__ != "GenericJointEmbedding":
        raise UnsupportedModel(f"{named}: {type(joint).__name__} is not supported")
    inputs = []
    for name, spec in specs.items():
        if name not in SYSTEM_INPUTS:
            raise UnsupportedModel(
                f"{named}: input {name!r} is not supported (supported: {', '.join(SYSTEM_INPUTS)})"
            )
        if spec.get("per") != "graph":
            raise UnsupportedModel(f"{named}: {name} per {spec.get('per')!r} is not supported")
        key, default = SYSTEM_INPUTS[name]
        embedder = joint.embedders[name]
        entry: dict[str, Any] = {"name": name, "key": key, "default": default}
        if spec["type"] == "categorical":
            table = embedder.weight.detach().to(torch.float64)
            entry.update(
                kind="categorical",
                dim=int(table.shape[1]),
                num_classes=int(table.shape[0]),
                offset=float(spec.get("offset", 0)),
                table=store.add(f"joint_embedding.{name}.table", table.numpy()),
            )
        elif spec["type"] == "continuous":
            first, act, second = embedder
            if type(act).__name__ != "SiLU" or first.in_features != 1:
                raise UnsupportedModel(f"{named}: continuous {name} embedder layout")
            dim = int(first.out_features)

            entry.update(
                kind="continuous",
                dim=dim,
                w1=store.add(
                    f"joint_embedding.{name}.w1", first.weight.detach().double().T.numpy()
                ),
                b1=_bias_or_zeros(first, dim, store, f"joint_embedding.{name}.b1"),
                w2=store.add(
                    f"joint_embedding.{name}.w2", second.weight.detach().double().T.numpy()
                ),
                b2=_bias_or_zeros(second, dim, store, f"joint_embedding.{name}.b2"),
            )
        else:
            raise UnsupportedModel(f"{named}: {name} of type {spec['type']!r}")
        inputs.append(entry)
    linear, act = joint.project
    if type(act).__name__ != "SiLU" or linear.bias is not None:
        raise UnsupportedModel(f"{named}: projection layout")
    out: dict[str, Any] = {
        "inputs": inputs,
        "projection": store.add(
            "joint_embedding.projection", linear.weight.detach().double().T.contiguous().numpy()
        ),
    }
    if hasattr(model, "embedding_readout"):
        readout = _readout(model.embedding_readout, "embedding_readout", store, head, num_heads)
        if readout["kind"] != "linear":
            raise UnsupportedModel("embedding_readout: only a linear readout is supported")
        out["readout"] = readout["linear"]
    return out


# mace-torch 0.3.16 radial.py ZBLBasis: the screening coefficients c (a buffer), the
# exponent factors, Bohr radius and e^2/(4 pi eps0) in eV A written in forward(), and
# a_exp, a_prefactor (buffers, or parameters when trainable).
ZBL_C = (0.1818, 0.5099, 0.2802, 0.02817)
ZBL_EXPONENTS = (3.2, 0.9423, 0.4028, 0.2016)
ZBL_A_EXP = 0.300
ZBL_A_PREFACTOR = 0.4543
ZBL_BOHR = 0.529
ZBL_COULOMB = 14.3996


def _defined_value(stored: float, literal: float, name: str, from_module: list[str]) -> float:
    """The float64 value of a constant defined as `literal`: the literal when the module
    holds it (exactly, or rounded to float32 by a float32 model); otherwise the module's
    own value (trained or edited: what the model computes with), named in from_module."""
    if stored == literal or stored == float(np.float32(literal)):
        return literal
    from_module.append(name)
    return stored


def _zbl_numpy(desc: dict[str, Any], z: np.ndarray, radii: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Half the ZBL energy of edges (z[:, 0], z[:, 1]) at distances r, from `desc`."""
    zu, zv = z[:, 0].astype(np.float64), z[:, 1].astype(np.float64)
    a = desc["a_prefactor"] * desc["bohr"] / (zu ** desc["a_exp"] + zv ** desc["a_exp"])
    phi = sum(c * np.exp(-d * r / a) for c, d in zip(desc["c"], desc["exponents"]))
    r_max = radii[:, 0] + radii[:, 1]
    p = desc["p"]
    x = r / r_max
    envelope = (
        1.0
        - (p + 1.0) * (p + 2.0) / 2.0 * x**p
        + p * (p + 2.0) * x ** (p + 1)
        - p * (p + 1.0) / 2.0 * x ** (p + 2)
    ) * (r < r_max)
    return 0.5 * desc["coulomb"] * zu * zv / r * phi * envelope


def _pair_repulsion(model: torch.nn.Module, atomic_numbers: list[int]) -> dict[str, Any]:
    """mace's ZBLBasis -> the "pair_repulsion" description (constants in float64 from
    their definition, see _defined_value), checked against the module."""
    import ase.data

    fn = model.pair_repulsion_fn
    if type(fn).__name__ != "ZBLBasis":
        raise UnsupportedModel(f"pair_repulsion_fn: {type(fn).__name__} is not supported")
    stored_c = [float(v) for v in fn.c.detach().reshape(-1).tolist()]
    if len(stored_c) != len(ZBL_C):
        raise UnsupportedModel(f"pair_repulsion_fn: {len(stored_c)} screening terms, expected 4")
    stored_radii = fn.covalent_radii.detach().to(torch.float64).reshape(-1).numpy()
    from_module: list[str] = []
    radii = [
        _defined_value(
            float(stored_radii[z]),
            float(ase.data.covalent_radii[z]),
            f"covalent_radii[{z}]",
            from_module,
        )
        for z in atomic_numbers
    ]
    desc: dict[str, Any] = {
        "kind": "zbl",
        "c": [
            _defined_value(v, lit, f"c[{k}]", from_module)
            for k, (v, lit) in enumerate(zip(stored_c, ZBL_C))
        ],
        "exponents": list(ZBL_EXPONENTS),
        "a_exp": _defined_value(float(fn.a_exp), ZBL_A_EXP, "a_exp", from_module),
        "a_prefactor": _defined_value(
            float(fn.a_prefactor), ZBL_A_PREFACTOR, "a_prefactor", from_module
        ),
        "bohr": ZBL_BOHR,
        "coulomb": ZBL_COULOMB,
        "p": int(fn.p),
        "covalent_radii": radii,
        "from_module": from_module,  # constants that differ from mace-torch's definition
    }
    _check_pair_repulsion(fn, desc, atomic_numbers)
    return desc


def _check_pair_repulsion(fn: Any, desc: dict[str, Any], atomic_numbers: list[int]) -> None:
    """The module (its buffers set to the description's values, run in float64) against
    the description's formula, per edge of every species pair at short and long range:
    catches a mace-torch whose ZBLBasis computes something else."""
    import copy

    module = copy.deepcopy(fn).to(torch.float64)
    with torch.no_grad():
        module.c.copy_(torch.tensor(desc["c"], dtype=torch.float64))
        module.a_exp.copy_(torch.tensor(desc["a_exp"], dtype=torch.float64))
        module.a_prefactor.copy_(torch.tensor(desc["a_prefactor"], dtype=torch.float64))
        for z, radius in zip(atomic_numbers, desc["covalent_radii"]):
            module.covalent_radii[z] = radius
    s = len(atomic_numbers)
    pairs = np.array([(u, v) for u in range(s) for v in range(s)], dtype=np.int64)
    fractions = np.array([0.02, 0.1, 0.35, 0.7, 0.97, 1.2])  # of R_u + R_v
    species = np.repeat(pairs, len(fractions), axis=0)  # [edges, 2]: sender, receiver
    z = np.array(atomic_numbers)[species]
    radii = np.array(desc["covalent_radii"])[species]
    r = np.tile(fractions, len(pairs)) * radii.sum(axis=1)
    edges = len(r)
    # each edge its own receiver: node 2e sends to node 2e + 1
    node_species = species.reshape(-1)
    node_attrs = torch.nn.functional.one_hot(torch.from_numpy(node_species), s).to(torch.float64)
    edge_index = torch.stack([torch.arange(0, 2 * edges, 2), torch.arange(1, 2 * edges, 2)]).to(
        torch.int64
    )
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.no_grad():
            out = module(
                torch.from_numpy(r).unsqueeze(-1),
                node_attrs,
                edge_index,
                torch.tensor(atomic_numbers, dtype=torch.int64),
            )
    finally:
        torch.set_default_dtype(previous)
    got = out.detach().numpy().reshape(-1)[1::2]
    expected = _zbl_numpy(desc, z, radii, r)
    err = np.abs(got - expected).max()
    if not err <= 1e-12 * np.abs(expected).max():
        raise UnsupportedModel(
            "pair_repulsion_fn: ZBLBasis of this mace-torch does not compute e3fuse's ZBL "
            f"({err:.2e})"
        )


def extract(
    model: torch.nn.Module, source: dict[str, Any], head: str | None = None
) -> tuple[dict[str, Any], TensorStore]:
    """mace-torch MACE / ScaleShiftMACE -> (architecture JSON, tensors)."""
    store = TensorStore()
    kind = type(model).__name__
    if kind not in SUPPORTED_MODELS:
        raise UnsupportedModel(
            f"model class {kind} is not supported (supported: {', '.join(SUPPORTED_MODELS)})"
        )
    heads = list(getattr(model, "heads", None) or ["Default"])
    if head is None:
        if len(heads) > 1:
            default = [h for h in heads if h.lower() == "default"]
            if not default:
                raise UnsupportedModel(
                    f"the model has several heads ({', '.join(heads)}); choose one with --head "
                    "(e3fuse.Calculator: head=)"
                )
            head = default[0]
        else:
            head = heads[0]
    if head not in heads:
        raise ValueError(f"head {head!r} not in the model's heads ({', '.join(heads)})")
    h = heads.index(head)

    atomic_numbers = [int(z) for z in model.atomic_numbers.tolist()]
    num_elements = len(atomic_numbers)
    r_max = float(model.r_max)

    radial = model.radial_embedding
    if type(radial.bessel_fn).__name__ != "BesselBasis":
        raise UnsupportedModel(f"radial_embedding.bessel_fn: {type(radial.bessel_fn).__name__}")
    bessel = radial.bessel_fn
    radial_desc: dict[str, Any] = {
        "kind": "bessel",
        "num_basis": int(bessel.bessel_weights.numel()),
        "prefactor": float(bessel.prefactor),
        "coeffs": store.add(
            "radial.coeffs", bessel.bessel_weights.detach().to(torch.float64).numpy()
        ),
        "apply_cutoff": bool(getattr(radial, "apply_cutoff", True)),
    }
    if hasattr(radial, "distance_transform"):
        radial_desc["transform"] = _distance_transform(
            radial.distance_transform, atomic_numbers, store
        )
    cutoff_fn = radial.cutoff_fn
    if type(cutoff_fn).__name__ != "PolynomialCutoff":
        raise UnsupportedModel(f"radial_embedding.cutoff_fn: {type(cutoff_fn).__name__}")
    envelope = {"kind": "polynomial", "p": float(cutoff_fn.p), "r_cut": float(cutoff_fn.r_max)}

    sh_module = model.spherical_harmonics
    if not sh_module.normalize or sh_module.normalization != "component":
        raise UnsupportedModel("spherical_harmonics: only normalize=True, 'component'")
    ls = [ir.l for _, ir in sh_module.irreps_out]
    lmax = max(ls)
    if ls != list(range(lmax + 1)):
        raise UnsupportedModel("spherical_harmonics must be l = 0..lmax")
    sh = parts.spherical_harmonics(lmax, "component", "sh", store)
    sh["irreps"] = parts.irreps_list(sh_module.irreps_out)

    embedding = parts.linear(model.node_embedding.linear, "embedding", store)

    layers = []
    for t, (inter, prod) in enumerate(zip(model.interactions, model.products)):
        name = f"layers.{t}"
        ikind = type(inter).__name__
        if ikind == NONLINEAR_INTERACTION:
            if type(prod).__name__ != "EquivariantProductBasisBlock":
                raise UnsupportedModel(f"products.{t}: {type(prod).__name__} is not supported")
            layers.append(
                _nonlinear_layer(inter, prod, name, store, radial_desc["num_basis"], num_elements)
            )
            continue
        if ikind not in SUPPORTED_INTERACTIONS:
            raise UnsupportedModel(
                f"interactions.{t}: {ikind} is not supported (supported: "
                f"{', '.join(SUPPORTED_INTERACTIONS)})"
            )
        if hasattr(inter, "conv_fusion"):
            raise UnsupportedModel(f"interactions.{t}: fused convolution backends")
        if type(prod).__name__ != "EquivariantProductBasisBlock":
            raise UnsupportedModel(f"products.{t}: {type(prod).__name__} is not supported")
        residual = "Residual" in ikind
        density = ikind in DENSITY_INTERACTIONS
        conv = parts.tensor_product_uvu(inter.conv_tp, f"{name}.conv", store)
        _flip_edge_direction(conv, store)
        conv["mlp"] = parts.fully_connected_net(inter.conv_tp_weights, f"{name}.conv.mlp", store)
        # density blocks divide by 1 + rho (the "density" entry) instead of avg_num_neighbors
        conv["denominator"] = 1.0 if density else float(inter.avg_num_neighbors)
        layer = {
            "residual": residual,
            "skip": _element_linear(inter.skip_tp, f"{name}.skip", store, num_elements),
            "linear_up": parts.linear(inter.linear_up, f"{name}.linear_up", store),
            "conv": conv,
            "linear": parts.linear(inter.linear, f"{name}.linear", store),
            "product": _product(prod, f"{name}.product", store, num_elements),
            "product_linear": parts.linear(prod.linear, f"{name}.product_linear", store),
            "product_sc": bool(prod.use_sc),
        }
        if density:
            layer["density"] = _density(inter, name, store, radial_desc["num_basis"])
        layers.append(layer)
    # MACE.forward: readout i reads layer i's features, except that a single readout
    # reads the last layer's (feat_idx = -1): use_last_readout_only=True keeps only the
    # last layer's readout (none at all with one interaction). Layers without a readout get
    # one that adds exactly zero.
    readouts = list(model.readouts)
    if len(readouts) == 1:
        readout_of_layer = {len(layers) - 1: readouts[0]}
    elif len(readouts) in (0, len(layers)):
        readout_of_layer = dict(enumerate(readouts))
    else:
        raise UnsupportedModel(f"readouts: {len(readouts)} readouts for {len(layers)} interactions")
    for t, layer in enumerate(layers):
        name = f"layers.{t}.readout"
        if t in readout_of_layer:
            layer["readout"] = _readout(readout_of_layer[t], name, store, h, len(heads))
        else:
            layer["readout"] = _zero_readout(layer["product_linear"], name, store)

    # AtomicEnergiesBlock: energies = atleast_2d(buffer).T, [n_elements, n_heads]
    e0 = torch.atleast_2d(model.atomic_energies_fn.atomic_energies.detach().to(torch.float64)).T
    if e0.shape[0] != num_elements:
        raise UnsupportedModel(
            f"atomic_energies_fn: shape {tuple(e0.shape)} does not match {num_elements} elements"
        )
    e0 = e0[:, h] if e0.shape[1] > 1 else e0[:, 0]
    if kind == "ScaleShiftMACE":
        scale = float(torch.atleast_1d(model.scale_shift.scale)[h])
        shift = float(torch.atleast_1d(model.scale_shift.shift)[h])
    else:
        scale, shift = 1.0, 0.0

    joint_embedding = None
    if hasattr(model, "joint_embedding"):
        joint_embedding = _joint_embedding(model, store, h, len(heads))
    elif hasattr(model, "embedding_readout"):
        raise UnsupportedModel("use_embedding_readout without embedding_specs")

    architecture = {
        "format_version": FORMAT_VERSION,
        "family": "mace",
        "e3fuse_version": __version__,
        "source": {**source, "head": head},
        "units": {"energy": "eV", "length": "Angstrom"},
        "cutoff": r_max,
        "atomic_numbers": atomic_numbers,
        "radial": radial_desc,
        "envelope": envelope,
        "spherical_harmonics": sh,
        "embedding": embedding,
        "layers": layers,
        "e0": store.add("e0", e0.numpy()),
        "scale": scale,
        "shift": shift,
    }
    if joint_embedding is not None:
        architecture["joint_embedding"] = joint_embedding
    if hasattr(model, "pair_repulsion"):  # part of the interaction energy: scaled (ScaleShiftMACE)
        architecture["pair_repulsion"] = _pair_repulsion(model, atomic_numbers)
    return architecture, store


def convert(
    source: str | Path | torch.nn.Module, output: str | Path, head: str | None = None
) -> dict[str, Any]:
    """Write the .e3f file; returns the architecture dictionary."""
    import mace

    model = load_mace_model(source)
    info: dict[str, Any] = {
        "kind": "mace",
        "model_class": type(model).__name__,
        "mace_version": getattr(mace, "__version__", "unknown"),
    }
    if not isinstance(source, torch.nn.Module):
        info["file"] = Path(source).name
        info["sha256"] = sha256_of_file(source)
    architecture, store = extract(model, info, head)
    write_model_file(output, architecture, store)
    return architecture


__all__ = ["convert", "extract", "load_mace_model", "UnsupportedModel"]
