"""Constants in float64 from their definition: a MACE model built (or saved) in
float32 carries its Wigner 3j symbols and symmetric-contraction U matrices rounded to
float32; the converter recomputes them, so e3fuse in float64 matches the same model
built in float64 (same weights) to rounding, not to float32's 1e-8 relative."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mace.modules")

from helpers_mace import build_mace, e3fuse_eval, structure  # noqa: E402

from e3fuse import reference  # noqa: E402
from e3fuse.convert import mace as mace_convert  # noqa: E402
from e3fuse.convert.exact_constants import restore_float64_constants  # noqa: E402

# r_max 4.7 is not a float32 number: the float32 model holds 4.69999980926...
ARCH = dict(hidden="16x0e+16x1o", max_ell=2, correlation=3, elements=(8, 28, 29), r_max=4.7)


def _float32_twin(model64: Any, **arch: Any) -> tuple[Any, Any]:
    """(the float64-built model with its weights rounded to float32, the same model
    built in float32): equal weights, constants exact in the first, rounded in the
    second, as in a model file saved from float32 training."""
    with torch.no_grad():
        for prm in model64.parameters():
            prm.copy_(prm.to(torch.float32).to(torch.float64))
        for name, b in model64.named_buffers():  # data such as E0s and scale/shift
            if b.is_floating_point() and not _is_constant(name):
                b.copy_(b.to(torch.float32).to(torch.float64))
    # build_mace builds under the default dtype it is given (float64 when none is), so the
    # float32 twin's constants are computed in float32 arithmetic, as float32 training does
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model32 = build_mace(**arch, dtype=torch.float32)
    model32 = model32.to(torch.float32)
    state = {k: v.to(torch.float32) for k, v in model64.state_dict().items()}
    model32.load_state_dict(state)
    return model64, model32.eval()


def _is_constant(buffer_name: str) -> bool:
    """The buffers that are constants of the architecture, computed at construction."""
    last = buffer_name.rsplit(".", 1)[-1]
    return (
        last.startswith("_w3j_")
        or last.startswith("U_matrix_")
        or last in ("r_max", "bessel_weights", "prefactor")
    )


def _constant_buffers(model: Any) -> dict[str, torch.Tensor]:
    return {
        name: b.detach().to(torch.float64).clone()
        for name, b in model.named_buffers()
        if _is_constant(name) and b.is_floating_point()
    }


def test_restore_replaces_float32_constants_by_exact_ones() -> None:
    model64, model32 = _float32_twin(build_mace(**ARCH), **ARCH)
    exact = _constant_buffers(model64)
    cast = model32.to(torch.float64)
    rounded = _constant_buffers(cast)
    assert exact.keys() == rounded.keys() and exact
    worst = max(float((rounded[k] - exact[k]).abs().max()) for k in exact)
    assert worst > 1e-10, "the float32 model's constants should be rounded"
    counts = restore_float64_constants(cast)
    assert counts["wigner_3j"] > 0 and counts["u_matrix"] > 0 and counts["bessel"] == 1
    restored = _constant_buffers(cast)
    for k in exact:
        assert float((restored[k] - exact[k]).abs().max()) < 1e-15, k


def test_float32_built_model_matches_float64_built(tmp_path: Path) -> None:
    model64, model32 = _float32_twin(build_mace(**ARCH), **ARCH)
    path = tmp_path / "f32.e3f"
    mace_convert.convert(model32, path)
    atoms = structure(ARCH["elements"], seed=5)
    ref = reference.evaluate_mace(reference.mace_calculator(model64, "float64"), atoms)
    ours = e3fuse_eval(path, atoms)
    n = len(atoms)
    assert abs(ours["energy"] - float(ref["energy"])) / n < 1e-12
    assert np.abs(ours["forces"] - ref["forces"]).max() < 1e-10
    assert np.abs(ours["stress"] - ref["stress"]).max() < 1e-11
    # the float32 model cast to float64 is what e3fuse matched before: it is off
    cast = model32.to(torch.float64)
    rounded = reference.evaluate_mace(_calculator_without_restore(cast), atoms)
    assert np.abs(rounded["forces"] - ref["forces"]).max() > 1e-12


def _calculator_without_restore(model: Any) -> Any:
    from mace.calculators import MACECalculator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MACECalculator(models=model, device="cpu", default_dtype="float64")
