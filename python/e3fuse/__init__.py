"""e3fuse: a fused C++/CUDA engine for equivariant interatomic potentials."""

import os as _os

__version__ = "0.1.0"

# OpenMP threads that spin between parallel regions steal the cores the next
# region needs when the machine is shared; wait passively unless told otherwise.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The compiled core loads on first use, not on `import e3fuse`: on the GPU machines (a CUDA
# build of torch 2.11), `import torch` after e3fuse._core crashed, while the other order works.
# So `e3fuse convert` imports torch (for the checkpoint) before the core (for the check).


def _error_class() -> type:
    try:
        from ._core import E3fuseError as error
    except ImportError:  # pragma: no cover - a source tree that was never built

        class E3fuseError(ValueError):
            """Raised for bad input and bad model files."""

        error = E3fuseError
    globals()["E3fuseError"] = error
    return error


def __getattr__(name: str):  # lazy: importing e3fuse must not import ase, torch or the core
    if name == "E3fuseError":
        return _error_class()
    if name == "Calculator":
        from .calculator import Calculator

        return Calculator
    raise AttributeError(name)
