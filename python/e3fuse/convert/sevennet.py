"""Convert a sevenn checkpoint (pretrained name or path) into an .e3f file.

The model is built with sevenn's own code, in float64, and read module by module
(see e3nn_parts); anything we do not implement is refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def load_sevenn_model(source: str) -> tuple[torch.nn.Module, dict[str, Any], Path]:
    """Build the sevenn model (e3nn backend, float64, eval mode)."""
    import sevenn.util

    path = resolve_checkpoint(source)
    checkpoint = sevenn.util.load_checkpoint(str(path))
    model = checkpoint.build_model()
    model.to(torch.float64).eval()
    return model, checkpoint.config, path


def _interaction_layer(modules: dict[str, Any], t: int, store: TensorStore) -> dict[str, Any]:
    prefix = f"layers.{t}"
    intro = modules.pop(f"{t}_self_connection_intro")
    if type(intro).__name__ != "SelfConnectionLinearIntro":
        raise UnsupportedModel(
            f"{t}_self_connection_intro: {type(intro).__name__} (self_connection_type other than "
            "'linear') is not supported yet"
        )
    linear_1 = modules.pop(f"{t}_self_interaction_1")
    conv = modules.pop(f"{t}_convolution")
    if type(conv).__name__ != "IrrepsConvolution":
        raise UnsupportedModel(f"{t}_convolution: {type(conv).__name__} is not supported")
    linear_2 = modules.pop(f"{t}_self_interaction_2")
    outro = modules.pop(f"{t}_self_connection_outro")
    if type(outro).__name__ != "SelfConnectionOutro":
        raise UnsupportedModel(f"{t}_self_connection_outro: {type(outro).__name__}")
    gate_module = modules.pop(f"{t}_equivariant_gate")
    for module, key in ((linear_1, "self_interaction_1"), (linear_2, "self_interaction_2")):
        if getattr(module, "num_modalities", 0) > 1:
            raise UnsupportedModel(f"{t}_{key}: multi-modal models are not supported")
    conv_desc = parts.tensor_product_uvu(conv.convolution, f"{prefix}.conv", store)
    conv_desc["mlp"] = parts.fully_connected_net(conv.weight_nn, f"{prefix}.conv.mlp", store)
    conv_desc["denominator"] = float(conv.denominator.detach().to(torch.float64).item())
    if conv_desc["mlp"]["dims"][-1] != conv_desc["weight_numel"]:
        raise UnsupportedModel(f"{t}_convolution: radial MLP output does not match the weights")
    return {
        "self_connection": parts.linear(intro.linear, f"{prefix}.self_connection", store),
        "linear_1": parts.linear(linear_1.linear, f"{prefix}.linear_1", store),
        "conv": conv_desc,
        "linear_2": parts.linear(linear_2.linear, f"{prefix}.linear_2", store),
        "gate": parts.gate(gate_module.gate, f"{prefix}.gate"),
    }


def extract(
    model: torch.nn.Module, config: dict[str, Any], source: dict[str, Any]
) -> tuple[dict[str, Any], TensorStore]:
    """sevenn AtomGraphSequential -> (architecture JSON, tensors)."""
    store = TensorStore()
    modules = dict(model._modules)
    if config.get("use_modality", False):
        raise UnsupportedModel("multi-fidelity (modal) sevenn models are not supported yet")

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
    embedding = parts.linear(embed.linear, "embedding", store)
    num_species = int(onehot.num_classes)

    num_layers = int(config["num_convolution_layer"])
    layers = [_interaction_layer(modules, t, store) for t in range(num_layers)]

    if "reduce_input_to_hidden" not in modules:
        raise UnsupportedModel("readout_as_fcn readouts are not supported yet")
    readout = [
        parts.linear(modules.pop("reduce_input_to_hidden").linear, "readout.0", store),
        parts.linear(modules.pop("reduce_hidden_to_energy").linear, "readout.1", store),
    ]

    rescale = modules.pop("rescale_atomic_energy")
    kind = type(rescale).__name__
    if kind == "SpeciesWiseRescale":
        shift = rescale.shift.detach().to(torch.float64).reshape(-1)
        scale = rescale.scale.detach().to(torch.float64).reshape(-1)
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


def convert(source: str, output: str | Path) -> dict[str, Any]:
    """Write the .e3f file; returns the architecture dictionary."""
    import sevenn

    model, config, path = load_sevenn_model(source)
    info = {
        "kind": "sevenn",
        "name": source,
        "file": path.name,
        "sha256": sha256_of_file(path),
        "sevenn_version": sevenn.__version__,
        "sevenn_model_version": config.get("version"),
    }
    architecture, store = extract(model, config, info)
    write_model_file(output, architecture, store)
    return architecture
