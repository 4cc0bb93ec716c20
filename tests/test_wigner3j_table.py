"""The CUDA convolution evaluates each tensor-product path as alpha x w3j(l1, l2, l3) with the
Wigner 3j entries compiled in (kernels/src/ops/wigner3j_table.h, cuda/conv_kernels.cuh). These tests
keep that premise true: the generated table equals e3nn's float64 symbols, and every path of the
converted models is a multiple of its symbol to float64 rounding."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import MODELS, ModelCache
from e3nn import o3
from safetensors.numpy import load_file

from e3fuse.modelfile import METADATA_KEY

TABLE = Path(__file__).resolve().parents[1] / "kernels" / "src" / "ops" / "wigner3j_table.h"


def _table() -> dict[tuple[int, int, int], np.ndarray]:
    text = TABLE.read_text()
    symbols = {}
    for match in re.finditer(r"struct Wigner3j<(\d), (\d), (\d)> \{(.*?)\n\};", text, re.S):
        l1, l2, l3 = (int(g) for g in match.groups()[:3])
        dense = np.zeros((2 * l1 + 1, 2 * l2 + 1, 2 * l3 + 1))
        for a, b, q, value in re.findall(r"f\((\d), (\d), (\d), ([-0-9.e]+)\);", match.group(4)):
            dense[int(a), int(b), int(q)] = float(value)
        symbols[(l1, l2, l3)] = dense
    return symbols


def test_table_is_e3nn_float64_wigner_3j() -> None:
    symbols = _table()
    assert len(symbols) == 34  # every triangle (l1, l2, l3) with l <= 3
    for (l1, l2, l3), dense in symbols.items():
        exact = o3.wigner_3j(l1, l2, l3, dtype=torch.float64).numpy()
        np.testing.assert_array_equal(dense, exact, err_msg=f"w3j({l1}, {l2}, {l3})")


def _conv_paths(path: Path) -> list[tuple[int, int, int, np.ndarray]]:
    """(l1, l2, l3, cg) of every convolution path in an .e3f file."""
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
    architecture = json.loads(header["__metadata__"][METADATA_KEY])
    tensors = load_file(str(path))
    found = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "instructions" in node and "irreps_sh" in node:
                degree = lambda irreps, i: irreps[i][1]  # noqa: E731 (mul, l, parity) rows
                for ins in node["instructions"]:
                    found.append(
                        (
                            degree(node["irreps_in"], ins["in"]),
                            degree(node["irreps_sh"], ins["sh"]),
                            degree(node["irreps_out"], ins["out"]),
                            tensors[ins["cg"]],
                        )
                    )
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(architecture)
    return found


@pytest.mark.parametrize("model_name", MODELS)
def test_model_paths_are_multiples_of_the_table(models: ModelCache, model_name: str) -> None:
    symbols = _table()
    paths = _conv_paths(models.path(model_name))
    assert paths, "no convolution paths found"
    for l1, l2, l3, cg in paths:
        w = symbols[(l1, l2, l3)]
        largest = np.unravel_index(np.argmax(np.abs(w)), w.shape)
        alpha = cg[largest] / w[largest]
        assert np.abs(cg - alpha * w).max() <= 8 * np.finfo(np.float64).eps * abs(alpha), (
            f"path ({l1}, {l2}, {l3}) of {model_name} is not alpha x w3j"
        )
