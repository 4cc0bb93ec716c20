"""The converter's spherical harmonics: e3nn's polynomials stored as monomial coefficients,
fitted in exact arithmetic (e3nn_parts.exact_least_squares), so that converting one checkpoint
twice, in two processes, stores the same bits (LAPACK's fit did not: its last bits followed
the arrays' alignment)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("e3nn")

from e3fuse.convert.e3nn_parts import exact_least_squares  # noqa: E402

FIT_BYTES = """
import hashlib, numpy as np
from e3fuse.convert.e3nn_parts import spherical_harmonics
class Store:
    def __init__(self): self.arrays = []
    def add(self, name, value, dtype=None):
        self.arrays.append(np.ascontiguousarray(value).tobytes()); return name
store = Store()
spherical_harmonics(3, "component", "sh", store)
print(hashlib.sha256(b"".join(store.arrays)).hexdigest())
"""


def test_same_bits_in_three_processes() -> None:
    digests = {
        subprocess.run(
            [sys.executable, "-c", FIT_BYTES], capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(3)
    }
    assert len(digests) == 1


def test_consistent_system_solved_exactly() -> None:
    rng = np.random.default_rng(1)
    a = rng.integers(-50, 50, size=(40, 6)).astype(np.float64) / 8
    x = rng.integers(-1000, 1000, size=(6, 3)).astype(np.float64) / 64
    b = a @ x  # exact: small dyadic numbers
    np.testing.assert_array_equal(exact_least_squares(a, b), x)


def test_matches_lapack_on_noisy_data() -> None:
    rng = np.random.default_rng(2)
    a = rng.normal(size=(256, 10))
    b = a @ rng.normal(size=(10, 7)) + 1e-3 * rng.normal(size=(256, 7))
    expected = np.linalg.lstsq(a, b, rcond=None)[0]
    np.testing.assert_allclose(exact_least_squares(a, b), expected, rtol=0, atol=1e-13)


def test_dependent_columns_refused() -> None:
    a = np.ones((5, 2))
    with pytest.raises(RuntimeError, match="linearly dependent"):
        exact_least_squares(a, np.ones((5, 1)))
