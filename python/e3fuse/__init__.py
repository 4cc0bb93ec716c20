"""e3fuse: a fused C++/CUDA engine for equivariant interatomic potentials."""

import os as _os

__version__ = "0.1.0"

# OpenMP threads that spin between parallel regions steal the cores the next
# region needs when the machine is shared; wait passively unless told otherwise.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

try:  # the compiled core; absent only in a source tree that was never built
    from ._core import E3fuseError  # noqa: F401
except ImportError:  # pragma: no cover

    class E3fuseError(ValueError):  # type: ignore[no-redef]
        """Raised for bad input and bad model files."""


def __getattr__(name: str):  # lazy: importing e3fuse must not import ase or torch
    if name == "Calculator":
        from .calculator import Calculator

        return Calculator
    raise AttributeError(name)
