"""Reference evaluations with the upstream packages (sevenn), in float64, for the
converter's verification step, the tests and the benchmarks. Imports torch and
sevenn lazily: e3fuse itself never needs them at run time."""

from __future__ import annotations

from typing import Any

import numpy as np


def _onehot_to_float64(module: Any) -> None:
    """sevenn's OnehotEmbedding casts to float32 unconditionally; make it follow
    the model dtype so that the whole reference runs in float64."""
    import torch

    original = module.forward

    def forward(data: Any) -> Any:
        data = original(data)
        for key in (module.key_output, module.key_additional_output):
            if key is not None and key in data and data[key].is_floating_point():
                data[key] = data[key].to(torch.float64)
        return data

    module.forward = forward


def sevenn_calculator(source: Any, dtype: str = "float64", modal: str | None = None) -> Any:
    """sevenn's own SevenNetCalculator on the model `source` (a checkpoint path or
    pretrained name, or a built sevenn model), in `dtype`: float64 models are BUILT
    in float64 (e3nn's constants computed in float64, not cast from float32).
    `modal`: the modality of a multi-fidelity model."""
    import sevenn.util
    import torch
    from sevenn.calculator import SevenNetCalculator

    from .convert.sevennet import build_float64, resolve_checkpoint

    if isinstance(source, torch.nn.Module):
        model = source
    else:
        checkpoint = sevenn.util.load_checkpoint(str(resolve_checkpoint(source)))
        model = build_float64(checkpoint) if dtype == "float64" else checkpoint.build_model()
    if dtype == "float64":
        model.to(torch.float64)
        _onehot_to_float64(model._modules["onehot_idx_to_onehot"])
    model.eval()
    model.set_is_batch_data(False)
    calc = SevenNetCalculator(model, file_type="model_instance", device="cpu", modal=modal)
    calc._e3fuse_dtype = dtype
    return calc


def _sevenn_results(calc: Any, atoms: Any) -> dict[str, Any]:
    """SevenNetCalculator.calculate in float64: sevenn casts every float input to
    float32 (sevenn.util.dtype_correct); route that cast to float64 for the call."""
    import sevenn.util
    import torch

    original = sevenn.util.dtype_correct

    def dtype_correct(
        v: Any, float_dtype: Any = torch.float64, int_dtype: Any = torch.int64
    ) -> Any:
        return original(v, torch.float64, int_dtype)

    previous = torch.get_default_dtype()
    sevenn.util.dtype_correct = dtype_correct
    torch.set_default_dtype(torch.float64)
    try:
        atoms = atoms.copy()
        calc.calculate(atoms, ["energy", "forces", "stress"])
        return dict(calc.results)
    finally:
        sevenn.util.dtype_correct = original
        torch.set_default_dtype(previous)


def _as_arrays(results: dict[str, Any], periodic: bool) -> dict[str, np.ndarray]:
    out = {key: np.asarray(results[key]) for key in ("energy", "energies", "forces")}
    if periodic:
        out["stress"] = np.asarray(results["stress"])
    return out


def evaluate(calc: Any, atoms: Any) -> dict[str, np.ndarray]:
    """energy, energies, forces and (periodic systems) stress of `atoms` with a
    reference calculator (float64 sevenn models are evaluated in float64)."""
    if getattr(calc, "_e3fuse_dtype", None) == "float64":
        results = _sevenn_results(calc, atoms)
    else:
        atoms = atoms.copy()
        atoms.calc = calc
        calc.calculate(atoms, ["energy", "forces", "stress"])
        results = calc.results
    return _as_arrays(results, bool(atoms.pbc.all()))


def mace_calculator(source: Any, dtype: str = "float64", head: str | None = None) -> Any:
    """mace-torch's own MACECalculator on `source` (a model file written by
    torch.save(model), or a model object), in `dtype`."""
    import copy
    import warnings

    import torch
    from mace.calculators import MACECalculator

    if isinstance(source, torch.nn.Module):
        model = copy.deepcopy(source)
    else:
        model = torch.load(str(source), map_location="cpu", weights_only=False)
    model = model.to(torch.float64 if dtype == "float64" else torch.float32).eval()
    if dtype == "float64":  # the upstream model in float64 = with float64 constants
        from .convert.exact_constants import restore_float64_constants

        restore_float64_constants(model)
    kwargs: dict[str, Any] = {"head": head} if head is not None else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        calc = MACECalculator(models=model, device="cpu", default_dtype=dtype, **kwargs)
    return calc


def evaluate_mace(calc: Any, atoms: Any) -> dict[str, np.ndarray]:
    """energy, energies, forces and (periodic systems) stress with a MACECalculator.

    The model runs under torch's default dtype set to the calculator's: mace-torch forms
    some constants from Python floats and integer tensors (ZBLBasis: 14.3996 * Z_u * Z_v),
    which take the global default dtype, float32 unless set, even in a float64 model."""
    import torch

    atoms = atoms.copy()
    atoms.calc = calc
    previous = torch.get_default_dtype()
    if getattr(calc, "default_dtype", "") == "float64":
        torch.set_default_dtype(torch.float64)
    try:
        calc.calculate(atoms, ["energy", "forces", "stress"])
    finally:
        torch.set_default_dtype(previous)
    results = calc.results
    return _as_arrays(results, bool(atoms.pbc.all()))
