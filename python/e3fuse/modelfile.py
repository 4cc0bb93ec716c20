"""Writing .e3f model files: a safetensors container whose metadata holds the
architecture as JSON (key ``e3fuse``). The C++ core reads them (kernels/src/model)."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

# 2: MACE pair repulsion, distance transforms, density blocks, system inputs, SevenNet
# per-species self-connections (a version-1 reader would ignore them silently); 3: a MACE
# skip connection with one map shared by all species (non-linear blocks; a version-2
# reader refuses it as malformed)
FORMAT_VERSION = 3
METADATA_KEY = "e3fuse"

_DTYPES = {
    np.dtype("float64"): "F64",
    np.dtype("float32"): "F32",
    np.dtype("int64"): "I64",
    np.dtype("int32"): "I32",
}


def sha256_of_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class TensorStore:
    """Collects named arrays for a model file; names are unique."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def add(self, name: str, array: Any, dtype: str = "float64") -> str:
        if name in self.arrays:
            raise ValueError(f"tensor {name!r} added twice")
        self.arrays[name] = np.ascontiguousarray(np.asarray(array, dtype=dtype))
        return name


def write_model_file(path: str | Path, architecture: dict[str, Any], tensors: TensorStore) -> None:
    """Write a safetensors file with the architecture JSON in its metadata."""
    architecture = dict(architecture)
    architecture.setdefault("format_version", FORMAT_VERSION)
    header: dict[str, Any] = {
        "__metadata__": {METADATA_KEY: json.dumps(architecture, separators=(",", ":"))}
    }
    offset = 0
    blobs = []
    for name, array in tensors.arrays.items():
        dtype = _DTYPES.get(array.dtype)
        if dtype is None:
            raise ValueError(f"tensor {name!r}: unsupported dtype {array.dtype}")
        data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)  # keep the data 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for blob in blobs:
            f.write(blob)


def read_architecture(path: str | Path) -> dict[str, Any]:
    """The architecture JSON of a model file (no validation beyond parsing)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return json.loads(header["__metadata__"][METADATA_KEY])
