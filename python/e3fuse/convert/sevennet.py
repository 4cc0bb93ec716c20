"""Convert a sevenn checkpoint (pretrained name or path) into an .e3f file.

The model is built with sevenn's own code, in float64 (torch's default dtype is
float64 while its e3nn modules are constructed, so their constants are float64),
and read module by module (see e3nn_parts); anything we do not implement is
refused by name.

Multi-fidelity (``use_modality``) models are converted for one modality, chosen
at conversion. sevenn appends the modality's one-hot to the input of each modal
o3.Linear (sevenn.nn.linear.IrrepsLinear._patch_modal_to_data): a block
``num_modalities x 0e`` whose paths reach only the scalar outputs. With the
modality fixed that input is a constant, so each such path contributes exactly
row `modality` of its (path-normalized) weight: folded here into a bias on the
scalar output, and the block is dropped. Modal-wise shift / scale
(sevenn.nn.scale.ModalWiseRescale) are read at that modality's row."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import __version__
from ..modelfile import FORMAT_VERSION, TensorStore, sha256_of_file, write_model_file
from . import e3nn_parts as parts
from .e3nn_parts import UnsupportedModel

PRETRAINED = ("7net-0", "7net-0_22May2024", "7net-0_11Jul2024", "7net-l3i5")


def resolve_checkpoint(source: str) -> Path:
    path = Path(source)
    if path.is_file():
        return path
    import sevenn.util

    try:
        return Path(sevenn.util.pretrained_name_to_path(source))
    except Exception as err:  # sevenn raises plain exceptions for unknown names
        raise FileNotFoundError(
            f"{source!r} is neither a sevenn checkpoint file nor a pretrained model name "
            f"shipped with sevenn (e.g. {', '.join(PRETRAINED)})"
        ) from err


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """torch's default dtype set to `dtype` inside the block, restored afterwards
    (also on error)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_float64(checkpoint: Any) -> torch.nn.Module:
    """sevenn's model of `checkpoint` (a sevenn.checkpoint.SevenNetCheckpoint) built
    in float64. e3nn computes its constants (Wigner 3j buffers of the tensor
    products, path normalizations) in the default dtype at construction, and sevenn
    checkpoints also store the 3j buffers (float32): so sevenn loads the checkpoint
    as usual (its compatibility patches included), and its parameters are copied
    into a second model built with float64 as the default dtype, which keeps its
    own float64 buffers."""
    from sevenn.model_build import build_E3_equivariant_model

    with default_dtype(torch.float32):  # as sevenn expects (its patches of old checkpoints)
        loaded = checkpoint.build_model()
    with default_dtype(torch.float64):
        model = build_E3_equivariant_model(checkpoint.config)
    parameters = {name: p.detach() for name, p in loaded.named_parameters()}
    state = model.state_dict()
    own = {name for name, _ in model.named_parameters()}
    if own != set(parameters):
        raise UnsupportedModel(
            "sevenn model rebuilt in float64 has other parameters than the checkpoint's: "
            + ", ".join(sorted(own ^ set(parameters))[:5])
        )
    for name in own:
        state[name] = parameters[name].to(torch.float64)
    model.load_state_dict(state, strict=True)
    return model.to(torch.float64).eval()


def load_sevenn_model(source: str) -> tuple[torch.nn.Module, dict[str, Any], Path]:
    """Build the sevenn model (e3nn backend, built in float64, eval mode)."""
    import sevenn.util

    path = resolve_checkpoint(source)
    checkpoint = sevenn.util.load_checkpoint(str(path))
    return build_float64(checkpoint), checkpoint.config, path


class ModalityError(ValueError):
    """A missing, unknown or unexpected --modal for a sevenn model."""


def choose_modality(config: dict[str, Any], modal: str | None) -> tuple[str, int] | None:
    """(name, index) of the modality to convert, None for a single-fidelity model."""
    if not config.get("use_modality", False):
        if modal is not None:
            raise ModalityError(
                f"modal={modal!r} given, but this sevenn model is not multi-fidelity "
                "(use_modality is off): convert it without a modality"
            )
        return None
    modal_map: dict[str, int] = dict(config.get("_modal_map") or {})
    available = ", ".join(sorted(modal_map, key=modal_map.__getitem__))
    if modal is None:
        raise ModalityError(
            f"this sevenn model is multi-fidelity: choose a modality (--modal / modal=), one of: "
            f"{available}"
        )
    if modal not in modal_map:
        raise ModalityError(f"unknown modality {modal!r} for this model; available: {available}")
    index = int(modal_map[modal])
    num_modalities = int(config.get("_number_of_modalities", len(modal_map)))
    if not 0 <= index < num_modalities:
        raise UnsupportedModel(f"modality {modal!r} has index {index} of {num_modalities}")
    return modal, index


def _modal_linear(
    module: Any, name: str, store: TensorStore, modality: tuple[str, int] | None
) -> dict[str, Any]:
    """A sevenn IrrepsLinear as an e3fuse linear; a modal one (num_modalities > 1)
    with the modality's one-hot input folded into biases of its scalar outputs."""
    num_modalities = int(getattr(module, "num_modalities", 0) or 0)
    lin = module.linear
    if num_modalities <= 1:
        return parts.linear(lin, name, store)
    if modality is None:
        raise UnsupportedModel(f"{name}: modal linear layer in a model without use_modality")
    modal_block = len(lin.irreps_in) - 1
    mul, ir = lin.irreps_in[modal_block]
    if mul != num_modalities or ir.l != 0 or ir.p != 1:
        raise UnsupportedModel(f"{name}: last input block {mul}x{ir} is not the modality one-hot")
    desc = parts.linear(lin, name, store)
    index = modality[1]
    bias: dict[int, Any] = {}
    for b in desc["biases"]:
        bias[b["out"]] = store.arrays.pop(b["weight"])
    kept = []
    for p in desc["paths"]:
        w = store.arrays[p["weight"]]
        if p["in"] != modal_block:
            kept.append(p)
            continue
        del store.arrays[p["weight"]]
        # e_index^T (w * path_weight): the path's whole contribution for this modality
        bias[p["out"]] = bias.get(p["out"], 0.0) + w[index]
    desc["paths"] = kept
    desc["irreps_in"] = desc["irreps_in"][:modal_block]
    desc["biases"] = [
        {"out": out, "weight": store.add(f"{name}.modal_bias.{out}", values)}
        for out, values in sorted(bias.items())
    ]
    return desc


def _self_connection(intro: Any, name: str, store: TensorStore, num_species: int) -> dict[str, Any]:
    """sevenn's self-connection intro: 'linear' (SelfConnectionLinearIntro, an
    o3.Linear of x) or 'nequip' (SelfConnectionIntro, a FullyConnectedTensorProduct
    of x with the one-hot species: one linear map per species, stored with
    "elements" as MACE's skip connection)."""
    kind = type(intro).__name__
    if kind == "SelfConnectionLinearIntro":
        return parts.linear(intro.linear, name, store)
    if kind == "SelfConnectionIntro":
        from .mace import _element_linear  # the probe of mace's skip_tp: the same module type

        if intro.key_operand != "node_attr":
            raise UnsupportedModel(f"{name}: self-connection operand {intro.key_operand!r}")
        desc = _element_linear(intro.fc_tensor_product, name, store, num_species)
        _same_paths_per_species(desc, name, store)
        return desc
    raise UnsupportedModel(f"{name}: self-connection {kind} is not supported")


def _same_paths_per_species(desc: dict[str, Any], name: str, store: TensorStore) -> None:
    """The probe leaves out a species' path whose weights are all zero; every
    species gets the same paths (zeros where left out), as the CUDA backend's
    element-linear tables expect."""
    shapes = {}
    for element in desc["elements"]:
        for p in element["paths"]:
            shapes[(p["in"], p["out"])] = store.arrays[p["weight"]].shape
    for s, element in enumerate(desc["elements"]):
        have = {(p["in"], p["out"]) for p in element["paths"]}
        for (i, o), shape in shapes.items():
            if (i, o) not in have:
                weight = store.add(f"{name}.e{s}.path.{i}.{o}", np.zeros(shape))
                element["paths"].append({"in": i, "out": o, "weight": weight})
        element["paths"].sort(key=lambda p: (p["in"], p["out"]))


def _interaction_layer(
    modules: dict[str, Any],
    t: int,
    store: TensorStore,
    num_species: int,
    modality: tuple[str, int] | None,
) -> dict[str, Any]:
    prefix = f"layers.{t}"
    intro = modules.pop(f"{t}_self_connection_intro")
    linear_1 = modules.pop(f"{t}_self_interaction_1")
    conv = modules.pop(f"{t}_convolution")
    if type(conv).__name__ != "IrrepsConvolution":
        raise UnsupportedModel(f"{t}_convolution: {type(conv).__name__} is not supported")
    linear_2 = modules.pop(f"{t}_self_interaction_2")
    outro = modules.pop(f"{t}_self_connection_outro")
    if type(outro).__name__ != "SelfConnectionOutro":
        raise UnsupportedModel(f"{t}_self_connection_outro: {type(outro).__name__}")
    gate_module = modules.pop(f"{t}_equivariant_gate")
    conv_desc = parts.tensor_product_uvu(conv.convolution, f"{prefix}.conv", store)
    conv_desc["mlp"] = parts.fully_connected_net(conv.weight_nn, f"{prefix}.conv.mlp", store)
    conv_desc["denominator"] = float(conv.denominator.detach().to(torch.float64).item())
    if conv_desc["mlp"]["dims"][-1] != conv_desc["weight_numel"]:
        raise UnsupportedModel(f"{t}_convolution: radial MLP output does not match the weights")
    return {
        "self_connection": _self_connection(intro, f"{prefix}.self_connection", store, num_species),
        "linear_1": _modal_linear(linear_1, f"{prefix}.linear_1", store, modality),
        "conv": conv_desc,
        "linear_2": _modal_linear(linear_2, f"{prefix}.linear_2", store, modality),
        "gate": parts.gate(gate_module.gate, f"{prefix}.gate"),
    }


def _drop_species(
    keep: list[int], embedding: dict[str, Any], layers: list[dict[str, Any]], store: TensorStore
) -> None:
    """Keep only the species `keep` (indices into sevenn's type map) in the
    species-indexed parts: the rows of the embedding's one-hot input block and the
    per-species self-connections (shift and scale are sliced by the caller)."""
    mul, l, p = embedding["irreps_in"][0]
    if mul <= max(keep) or l != 0:
        raise UnsupportedModel("embedding input is not the one-hot species")
    for path in embedding["paths"]:
        if path["in"] == 0:
            store.arrays[path["weight"]] = np.ascontiguousarray(store.arrays[path["weight"]][keep])
    embedding["irreps_in"] = [[len(keep), l, p]] + embedding["irreps_in"][1:]
    for layer in layers:
        sc = layer["self_connection"]
        if "elements" in sc:
            for s, element in enumerate(sc["elements"]):
                if s not in keep:
                    for path in element["paths"]:
                        del store.arrays[path["weight"]]
            sc["elements"] = [sc["elements"][s] for s in keep]


def extract(
    model: torch.nn.Module,
    config: dict[str, Any],
    source: dict[str, Any],
    modal: str | None = None,
) -> tuple[dict[str, Any], TensorStore]:
    """sevenn AtomGraphSequential -> (architecture JSON, tensors); `modal`: the
    modality of a multi-fidelity model (sevenn's name, from its modal_map)."""
    store = TensorStore()
    modules = dict(model._modules)
    modality = choose_modality(config, modal)
    if modality is not None:
        onehot_modality = modules.pop("one_hot_modality", None)
        if onehot_modality is None or int(onehot_modality.num_classes) != int(
            config.get("_number_of_modalities", len(config["_modal_map"]))
        ):
            raise UnsupportedModel("one_hot_modality: missing or of the wrong size")
        source = {**source, "modal": modality[0]}

    edge = modules.pop("edge_embedding")
    basis, envelope_module, sph = edge.basis_function, edge.cutoff_function, edge.spherical
    if type(basis).__name__ != "BesselBasis":
        raise UnsupportedModel(f"edge_embedding: radial basis {type(basis).__name__}")
    cutoff = float(config["cutoff"])
    radial = {
        "kind": "bessel",
        "num_basis": int(basis.num_basis),
        "prefactor": float(basis.prefactor),
        "coeffs": store.add("radial.coeffs", basis.coeffs.detach().to(torch.float64).numpy()),
    }
    kind = type(envelope_module).__name__
    if kind == "XPLORCutoff":
        envelope = {
            "kind": "xplor",
            "r_on": float(envelope_module.r_on),
            "r_cut": float(envelope_module.r_cut),
        }
    elif kind == "PolynomialCutoff":
        envelope = {
            "kind": "polynomial",
            "p": float(envelope_module.p),
            "r_cut": float(envelope_module.cutoff_length),
        }
    else:
        raise UnsupportedModel(f"edge_embedding: cutoff function {kind}")
    sh_module = sph.sph
    lmax = max(ir.l for _, ir in sh_module.irreps_out)
    if [ir.l for _, ir in sh_module.irreps_out] != list(range(lmax + 1)):
        raise UnsupportedModel("edge_embedding: spherical harmonics must be l = 0..lmax")
    sh = parts.spherical_harmonics(
        lmax, sh_module.normalization, "sh", store, normalize=bool(sh_module.normalize)
    )
    sh["irreps"] = parts.irreps_list(sh_module.irreps_out)

    onehot = modules.pop("onehot_idx_to_onehot")
    embed = modules.pop("onehot_to_feature_x")
    embedding = _modal_linear(embed, "embedding", store, modality)
    num_species = int(onehot.num_classes)

    num_layers = int(config["num_convolution_layer"])
    layers = [
        _interaction_layer(modules, t, store, num_species, modality) for t in range(num_layers)
    ]

    if "reduce_input_to_hidden" not in modules:
        raise UnsupportedModel("readout_as_fcn readouts are not supported yet")
    readout = [
        _modal_linear(modules.pop("reduce_input_to_hidden"), "readout.0", store, modality),
        _modal_linear(modules.pop("reduce_hidden_to_energy"), "readout.1", store, modality),
    ]

    rescale = modules.pop("rescale_atomic_energy")
    kind = type(rescale).__name__
    if kind == "SpeciesWiseRescale":
        shift = rescale.shift.detach().to(torch.float64).reshape(-1)
        scale = rescale.scale.detach().to(torch.float64).reshape(-1)
    elif kind == "ModalWiseRescale":
        if modality is None:
            raise UnsupportedModel("rescale_atomic_energy: ModalWiseRescale without use_modality")
        shift = rescale.shift.detach().to(torch.float64)
        scale = rescale.scale.detach().to(torch.float64)
        if rescale.use_modal_wise_shift:
            shift = shift[modality[1]]
        if rescale.use_modal_wise_scale:
            scale = scale[modality[1]]
        shift, scale = shift.reshape(-1), scale.reshape(-1)
    elif kind == "Rescale":
        shift = torch.full((num_species,), float(rescale.shift), dtype=torch.float64)
        scale = torch.full((num_species,), float(rescale.scale), dtype=torch.float64)
    else:
        raise UnsupportedModel(f"rescale_atomic_energy: {kind} is not supported")
    if shift.numel() == 1:
        shift = shift.expand(num_species).clone()
    if scale.numel() == 1:
        scale = scale.expand(num_species).clone()
    reduce = modules.pop("reduce_total_enegy")
    if float(getattr(reduce, "constant", 1.0)) != 1.0 or getattr(reduce, "reduce", "sum") != "sum":
        raise UnsupportedModel("reduce_total_enegy: only a plain sum of atomic energies")
    modules.pop("force_output", None)
    if modules:
        raise UnsupportedModel(f"unsupported sevenn modules: {', '.join(modules)}")

    type_map = config["_type_map"]
    atomic_numbers = [0] * num_species
    for z, index in type_map.items():
        atomic_numbers[int(index)] = int(z)
    if sorted(type_map.values()) != list(range(num_species)):
        raise UnsupportedModel("type map does not cover 0..num_species-1")
    if 0 in atomic_numbers:  # chemical_species 'univ': Z = 0 ('X') is a species slot too
        keep = [s for s, z in enumerate(atomic_numbers) if z != 0]
        _drop_species(keep, embedding, layers, store)
        atomic_numbers = [atomic_numbers[s] for s in keep]
        shift, scale = shift[keep], scale[keep]

    architecture = {
        "format_version": FORMAT_VERSION,
        "family": "sevennet",
        "e3fuse_version": __version__,
        "source": source,
        "units": {"energy": "eV", "length": "Angstrom"},
        "cutoff": cutoff,
        "atomic_numbers": atomic_numbers,
        "radial": radial,
        "envelope": envelope,
        "spherical_harmonics": sh,
        "embedding": embedding,
        "layers": layers,
        "readout": readout,
        "scale": store.add("scale", scale.numpy()),
        "shift": store.add("shift", shift.numpy()),
    }
    return architecture, store


def convert(source: str, output: str | Path, modal: str | None = None) -> dict[str, Any]:
    """Write the .e3f file; returns the architecture dictionary. `modal`: the
    modality of a multi-fidelity model (required there, refused elsewhere)."""
    return convert_keeping_model(source, output, modal)[0]


def convert_keeping_model(
    source: str, output: str | Path, modal: str | None = None
) -> tuple[dict[str, Any], torch.nn.Module]:
    """As convert; also returns the float64 sevenn model it read, so that the check
    against sevenn (e3fuse.conversion.verify) needs no second build of it."""
    import sevenn
    import sevenn.util

    # a missing or unknown modality fails before the model is built (seconds)
    choose_modality(sevenn.util.load_checkpoint(str(resolve_checkpoint(source))).config, modal)
    model, config, path = load_sevenn_model(source)
    info = {
        "kind": "sevenn",
        "name": source,
        "file": path.name,
        "sha256": sha256_of_file(path),
        "sevenn_version": sevenn.__version__,
        "sevenn_model_version": config.get("version"),
    }
    architecture, store = extract(model, config, info, modal)
    write_model_file(output, architecture, store)
    return architecture, model


def convert_model(
    model: torch.nn.Module,
    config: dict[str, Any],
    output: str | Path,
    modal: str | None = None,
    name: str = "sevenn model",
) -> dict[str, Any]:
    """Write the .e3f file of a sevenn model object (e.g. built by
    sevenn.model_build.build_E3_equivariant_model from `config`, in float64)."""
    import sevenn

    info = {
        "kind": "sevenn",
        "name": name,
        "sevenn_version": sevenn.__version__,
        "sevenn_model_version": config.get("version"),
    }
    architecture, store = extract(model, config, info, modal)
    write_model_file(output, architecture, store)
    return architecture
