"""Float64 values of the constants that e3nn and mace-torch compute when a model is
built: the Wigner 3j symbols of e3nn tensor products (buffers `_w3j_<l1>_<l2>_<l3>`
of their generated code), the U matrices of mace's symmetric contraction
(`U_matrix_<nu>`), the cutoff radius (`r_max`, typed as a decimal) and the
frequencies and prefactor of mace's fixed Bessel basis. A model built (or saved) in
float32 carries them rounded to float32, and casting it to float64 keeps that
rounding (~1e-8 relative, 1e-6 eV/A in forces). `restore_float64_constants`
recomputes each from its definition in float64 and writes it back into the module,
after checking that the stored value is that constant (to float32 rounding): the
converter then reads exact constants, and the reference evaluations compare against
the same float64 math."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import torch

_W3J = re.compile(r"_w3j_(\d+)_(\d+)_(\d+)$")
_U = re.compile(r"U_matrix_(\d+)$")

# How far a stored constant may be from its float64 value, relative to its largest
# entry: e3nn rounds its float64 Wigner 3j symbols to float32 (2^-24 relative); mace
# computes U in the model's dtype, a few float32 operations per entry.
_W3J_ROUNDING = 2.0**-23
_U_ROUNDING = 1e-5


def _close(stored: torch.Tensor, exact: torch.Tensor, relative: float) -> bool:
    if stored.shape != exact.shape:
        return False
    scale = float(exact.abs().max()) if exact.numel() else 0.0
    return float((stored.to(torch.float64) - exact).abs().max()) <= relative * max(scale, 1e-30)


def _is_float32_rounded(t: torch.Tensor) -> bool:
    """True when every entry is a float32 number (a constant computed in float32)."""
    t64 = t.detach().to(torch.float64)
    return bool(torch.equal(t64.to(torch.float32).to(torch.float64), t64))


def _exact_u_matrix(contraction: Any, irrep_out: Any, nu: int, stored: torch.Tensor) -> Any:
    """mace's U matrix of correlation order nu in float64 (the construction that
    reproduces the stored one: mace builds it with or without cuequivariance's
    reduced CG basis depending on what was installed)."""
    from e3nn import o3
    from mace.tools.cg import U_matrix_real

    for use_cueq_cg in (False, True):
        try:
            exact = U_matrix_real(
                irreps_in=contraction.coupling_irreps,
                irreps_out=o3.Irreps(str(irrep_out)),
                correlation=nu,
                use_cueq_cg=use_cueq_cg,
                dtype=torch.float64,
            )[-1]
        except (NotImplementedError, ImportError):
            continue
        if _close(stored, exact, _U_ROUNDING):
            return exact
    return None


def restore_float64_constants(model: torch.nn.Module) -> dict[str, int]:
    """Replace float32-rounded Wigner 3j and U-matrix buffers by their float64
    values (in place; the model should already be float64). Returns how many of
    each kind were replaced. Raises if a stored constant is not the one its name
    says (to float32 rounding): the model was then built by code we do not know."""
    from e3nn import o3

    counts = {"wigner_3j": 0, "u_matrix": 0, "r_max": 0, "bessel": 0}
    for module_name, module in model.named_modules():
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer is None or not buffer.is_floating_point():
                continue
            if name == "r_max" and buffer.numel() == 1 and _is_float32_rounded(buffer):
                # the decimal the user gave, e.g. 4.7 for float32(4.7) = 4.69999980926...
                decimal = float(np.format_float_positional(np.float32(buffer.item())))
                setattr(module, name, torch.tensor(decimal, dtype=torch.float64))
                counts["r_max"] += 1
                continue
            w3j = _W3J.match(name)
            if w3j:
                l1, l2, l3 = (int(g) for g in w3j.groups())
                exact = o3.wigner_3j(l1, l2, l3, dtype=torch.float64)
                if not _close(buffer, exact, _W3J_ROUNDING):
                    raise ValueError(
                        f"{module_name}.{name}: stored coefficients are not the Wigner 3j symbol "
                        f"({l1}, {l2}, {l3})"
                    )
                setattr(module, name, exact.to(buffer.device))
                counts["wigner_3j"] += 1
                continue
            u = _U.match(name)
            if u and type(module).__name__ == "Contraction" and _is_float32_rounded(buffer):
                exact = _exact_u_matrix(module, _irrep_out(model, module), int(u.group(1)), buffer)
                if exact is None:
                    raise ValueError(
                        f"{module_name}.{name}: stored symmetric-contraction basis is not "
                        "reproduced by mace.tools.cg.U_matrix_real in float64"
                    )
                setattr(module, name, exact.to(buffer.device))
                counts["u_matrix"] += 1
        if type(module).__name__ == "BesselBasis" and "bessel_weights" in module._buffers:
            _restore_bessel(module_name, module)
            counts["bessel"] += 1
    return counts


def _restore_bessel(module_name: str, bessel: Any) -> None:
    """mace's fixed Bessel basis: frequencies n pi / r_max (n = 1..N), prefactor
    sqrt(2 / r_max) (mace.modules.radial.BesselBasis)."""
    r_max = float(bessel.r_max)
    n = bessel.bessel_weights.numel()
    weights = math.pi / r_max * torch.arange(1, n + 1, dtype=torch.float64)
    prefactor = torch.tensor(math.sqrt(2.0 / r_max), dtype=torch.float64)
    for name, exact in (("bessel_weights", weights), ("prefactor", prefactor)):
        if not _close(getattr(bessel, name), exact, _U_ROUNDING):
            raise ValueError(f"{module_name}.{name}: not the Bessel basis of r_max = {r_max}")
        setattr(bessel, name, exact)


def _irrep_out(model: torch.nn.Module, contraction: Any) -> Any:
    """The output irrep of one mace Contraction (its parent SymmetricContraction
    builds one Contraction per output irrep, in order)."""
    for module in model.modules():
        if type(module).__name__ == "SymmetricContraction":
            for c, (_, ir) in zip(module.contractions, module.irreps_out):
                if c is contraction:
                    return ir
    raise ValueError("symmetric contraction without a parent SymmetricContraction")
