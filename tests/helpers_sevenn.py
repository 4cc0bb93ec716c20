"""SevenNet test helpers shared by the test files: a model of a given architecture with
random weights, built by sevenn's own builder (sevenn.model_build.build_E3_equivariant_model),
and its checkpoint as sevenn saves it.

Importing this module skips the importing test module where torch or sevenn is missing
(pytest.importorskip)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sevenn")


def random_sevenn_model(
    architecture: dict[str, Any],
    species: list[str] | None = None,
    modalities: list[str] | None = None,
    seed: int = 0,
    modal_shift_spread: float = 1.0,
    built_in_float64: bool = True,
    weight_noise: float = 0.0,
) -> tuple[Any, dict[str, Any]]:
    """(model, config): sevenn's default E3-equivariant config updated by `architecture`,
    for `species` (chemical symbols; None: sevenn's 'univ', Z = 0..118), with per-species
    energy shifts -3 + N(0, 1) drawn from numpy's generator of `seed` (with `modalities`:
    the modal structure of 7net-mf-ompa, each modality's shifts those plus
    `modal_shift_spread` * N(0, 1)), built after torch.manual_seed(seed).

    built_in_float64: built with torch's default dtype float64 (constants in float64) and
    cast to float64; otherwise built in the current default dtype. weight_noise: every
    parameter gets weight_noise * N(0, 1) added (sevenn's initial weights leave some of
    them zero)."""
    import sevenn._const as const
    from sevenn.model_build import build_E3_equivariant_model
    from sevenn.util import chemical_species_preprocess

    from e3fuse.convert import sevennet

    config = copy.deepcopy(const.DEFAULT_E3_EQUIVARIANT_MODEL_CONFIG)
    config.update(architecture)
    config.update(chemical_species_preprocess(species or [], universal=species is None))
    num_species = config["_number_of_species"]
    rng = np.random.default_rng(seed)
    shift = -3.0 + rng.standard_normal(num_species)
    if modalities:
        config.update(
            {
                "use_modality": True,
                "_modal_map": {m: i for i, m in enumerate(modalities)},
                "_number_of_modalities": len(modalities),
                "use_modal_self_inter_intro": True,
                "use_modal_self_inter_outro": True,
                "use_modal_output_block": True,
                "use_modal_wise_shift": True,
                "use_modal_wise_scale": False,
            }
        )
        config["shift"] = [
            (shift + modal_shift_spread * rng.standard_normal(num_species)).tolist()
            for _ in modalities
        ]
    else:
        config["shift"] = shift.tolist()
    torch.manual_seed(seed)
    if built_in_float64:
        with sevennet.default_dtype(torch.float64):
            model = build_E3_equivariant_model(config)
        model = model.to(torch.float64)
    else:
        model = build_E3_equivariant_model(config)
    if weight_noise:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(weight_noise * torch.randn_like(parameter))
    return model.eval(), config


def save_sevenn_checkpoint(model: Any, config: dict[str, Any], path: Path) -> Path:
    """`model` saved as sevenn saves checkpoints: {'config', 'model_state_dict'}."""
    torch.save({"config": config, "model_state_dict": model.state_dict()}, path)
    return path
