"""What a model file is, told from its bytes without importing torch or executing a pickle.

``identify(path)`` names the file (an .e3f model, a mace-torch model, a SevenNet checkpoint,
or one of the usual wrong files: a state_dict, a training checkpoint, TorchScript, another
zip, JSON, an empty or truncated file, an .e3f of a newer format) and, for a wrong file,
says what to pass instead. PyTorch files are recognized from the opcodes of their pickle
(``pickletools.genops`` reads them, nothing is unpickled): torch.save's zip format keeps it
in ``<archive>/data.pkl``; the legacy format is four pickles in a row (magic number,
protocol version, system info, the object), its tensor data after them."""

from __future__ import annotations

import dataclasses
import json
import pickletools
import struct
import zipfile
from pathlib import Path
from typing import IO

from .modelfile import FORMAT_VERSION, METADATA_KEY

# What e3fuse.Calculator and `e3fuse convert` accept, for the "what to do" part of messages.
ACCEPTED = (
    "pass an .e3f file, a SevenNet pretrained name (7net-0, 7net-l3i5, 7net-mf-0, ...) or "
    "checkpoint (the checkpoint_*.pth sevenn writes), or a mace-torch model file (the model "
    "saved with torch.save(model), e.g. the .model file of mace's training)"
)

# torch.save(..., _use_new_zipfile_serialization=False) starts with the pickled magic
# number 0x1950a86a20f9469cfc6c (torch/serialization.py MAGIC_NUMBER), protocol 2.
LEGACY_TORCH_PREFIX = b"\x80\x02\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little")

# safetensors' own bound on the header (kernels/src/model/safetensors.h kMaxHeaderSize)
MAX_HEADER_BYTES = 100_000_000


@dataclasses.dataclass(frozen=True)
class FileKind:
    """kind: 'e3f', 'mace-model', 'sevenn-checkpoint', or the name of a wrong file;
    family: the converter for a convertible file ('mace' or 'sevennet'); problem: for
    a file that cannot be used, the message (what the file is and what to do)."""

    kind: str
    family: str | None = None
    problem: str | None = None

    @property
    def convertible(self) -> bool:
        return self.family is not None


def identify(path: str | Path) -> FileKind:
    """What the existing regular file `path` is (see the module docstring)."""
    path = Path(path)
    size = path.stat().st_size
    where = f"{str(path)!r}"
    if size == 0:
        return FileKind(
            "empty",
            problem=f"{where} is empty (0 bytes), truncated by an interrupted download or copy? "
            "Copy or convert the model again",
        )
    with open(path, "rb") as f:
        head = f.read(64)
        # first: a header length can begin with any byte ('{' for 123 + 256 k)
        if size >= 8 and _looks_like_safetensors(head, size):
            return _identify_safetensors(f, size, where)
        if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
            return _identify_zip(path, where)
        if head.startswith(LEGACY_TORCH_PREFIX):
            f.seek(0)
            return _identify_legacy_torch(f, where)
        if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
            f.seek(0)
            return _from_pickle(f, where, "Python pickle (not a torch.save file)")
        text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
        if text[:1] in (b"{", b"["):
            return _identify_json(path, where)
    if size < 8:
        return FileKind(
            "too-short",
            problem=f"{where} is {size} bytes long, too short for any model file: truncated? "
            "Copy or convert the model again",
        )
    if _is_text(head):
        return FileKind(
            "text",
            problem=f"{where} is a text file (it starts with "
            f"{head[:40].decode(errors='replace')!r}), not a model (a configuration or "
            f"structure file?): {ACCEPTED}",
        )
    return FileKind(
        "unknown",
        problem=f"{where} is not a model file e3fuse recognizes: not a safetensors file (.e3f), "
        f"nor a PyTorch, TorchScript or JSON file (it starts with bytes {head[:8].hex(' ')}): "
        f"{ACCEPTED}",
    )


# --------------------------------------------------------------------------------------
# safetensors (.e3f)
# --------------------------------------------------------------------------------------


def _looks_like_safetensors(head: bytes, size: int) -> bool:
    """An 8-byte little-endian header length of a plausible size: within the file, or
    followed by a JSON object (or by the end of a file cut right after the length)."""
    (length,) = struct.unpack("<Q", head[:8])
    if not 0 < length <= MAX_HEADER_BYTES:
        return False
    return length <= size - 8 or len(head) == 8 or head[8:9] == b"{"


def _identify_safetensors(f: IO[bytes], size: int, where: str) -> FileKind:
    f.seek(0)
    (length,) = struct.unpack("<Q", f.read(8))
    if 8 + length > size:
        return FileKind(
            "truncated-e3f",
            problem=f"{where} is a truncated safetensors (.e3f) file: {size} bytes, but its "
            f"header alone needs {8 + length}; the copy or conversion was cut short: copy it "
            "again or convert the source model again",
        )
    try:
        header = json.loads(f.read(length))
    except ValueError:
        return FileKind("e3f")  # corrupt header: the core names what is wrong with it
    if not isinstance(header, dict):
        return FileKind("e3f")
    data_size = size - 8 - length
    ends = [
        entry["data_offsets"][1]
        for name, entry in header.items()
        if name != "__metadata__"
        and isinstance(entry, dict)
        and isinstance(entry.get("data_offsets"), list)
        and len(entry["data_offsets"]) == 2
        and isinstance(entry["data_offsets"][1], int)
    ]
    if ends and max(ends) > data_size:
        return FileKind(
            "truncated-e3f",
            problem=f"{where} is a truncated safetensors (.e3f) file: its tensors need "
            f"{8 + length + max(ends)} bytes, the file has {size}; the copy or conversion was "
            "cut short: copy it again or convert the source model again",
        )
    metadata = header.get("__metadata__")
    if not isinstance(metadata, dict) or METADATA_KEY not in metadata:
        names = [name for name in header if name != "__metadata__"]
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        return FileKind(
            "safetensors",
            problem=f"{where} is a safetensors file but not an e3fuse model (no 'e3fuse' "
            f"metadata; {len(names)} tensors: {shown}), e.g. weights without the architecture: "
            f"{ACCEPTED}",
        )
    try:
        version = json.loads(metadata[METADATA_KEY]).get("format_version")
    except (ValueError, AttributeError):
        return FileKind("e3f")  # the core reports the broken metadata
    if isinstance(version, int) and version > FORMAT_VERSION:
        from . import __version__

        return FileKind(
            "newer-e3f",
            problem=f"{where} has format version {version}, newer than this e3fuse "
            f"({__version__}) reads ({FORMAT_VERSION}): it was written by a newer e3fuse; "
            "upgrade e3fuse (pip install -U e3fuse), or convert the source model again with "
            "this version",
        )
    return FileKind("e3f")


# --------------------------------------------------------------------------------------
# zip: torch.save, TorchScript, others
# --------------------------------------------------------------------------------------


def _identify_zip(path: Path, where: str) -> FileKind:
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        return FileKind(
            "bad-zip",
            problem=f"{where} starts like a zip archive (as PyTorch files do) but cannot be read "
            "as one: truncated or corrupt? Copy or save the model again",
        )
    with archive:
        names = archive.namelist()
        data_pkl = [n for n in names if n.endswith("data.pkl") and n.count("/") <= 1]
        if any(n.endswith("constants.pkl") for n in names) or any("/code/" in n for n in names):
            return _torchscript(names, where)
        if not data_pkl:
            shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
            return FileKind(
                "zip",
                problem=f"{where} is a zip archive ({len(names)} entries: {shown}) but not a "
                f"PyTorch file (no data.pkl): {ACCEPTED}",
            )
        try:
            with archive.open(data_pkl[0]) as stream:
                return _from_pickle(stream, where, "PyTorch file (torch.save)")
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            return FileKind(
                "bad-zip",
                problem=f"{where} is a PyTorch file (torch.save) that cannot be read ({err}): "
                "truncated or corrupt? Copy or save the model again",
            )


def _torchscript(names: list[str], where: str) -> FileKind:
    code = " ".join(n for n in names if "/code/" in n)
    if "__torch__/mace" in code:
        what = (
            "a TorchScript (torch.jit) MACE model, such as the compiled or -lammps.pt file "
            "that mace writes for LAMMPS or OpenMM: e3fuse needs the mace-torch model file it "
            "was made from (saved with torch.save(model), e.g. the .model of mace's training)"
        )
    elif "__torch__/sevenn" in code:
        what = (
            "a TorchScript SevenNet model deployed for LAMMPS (sevenn_get_model): e3fuse needs "
            "the checkpoint it was deployed from (checkpoint_*.pth) or its pretrained name"
        )
    else:
        what = f"a TorchScript (torch.jit) model, which e3fuse cannot read: {ACCEPTED}"
    return FileKind("torchscript", problem=f"{where} is {what}")


def _identify_legacy_torch(f: IO[bytes], where: str) -> FileKind:
    try:  # magic number, protocol version, system info, then the object
        for _ in range(3):
            for _op in pickletools.genops(f):
                pass
    except Exception:  # noqa: BLE001 - any parse failure: a damaged file
        return FileKind(
            "bad-pickle",
            problem=f"{where} starts like a PyTorch file in the legacy format but cannot be "
            "read: truncated or corrupt? Copy or save the model again",
        )
    return _from_pickle(f, where, "PyTorch file (torch.save, legacy format)")


# --------------------------------------------------------------------------------------
# pickles, read as opcodes
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class _PickleSummary:
    top: str  # 'dict', 'list', ... or the "module qualname" of the first class
    globals: list[str]
    strings: set[str]


def _summarize_pickle(stream: IO[bytes]) -> _PickleSummary:
    top = ""
    found: list[str] = []
    strings: set[str] = set()
    recent: list[str] = []  # the last strings pushed, for STACK_GLOBAL (protocol 4+)
    for op, arg, _ in pickletools.genops(stream):
        name = op.name
        if name == "GLOBAL":
            found.append(str(arg))
        elif name == "STACK_GLOBAL" and len(recent) >= 2:
            found.append(f"{recent[-2]} {recent[-1]}")
        elif isinstance(arg, str):
            strings.add(arg)
            recent = (recent + [arg])[-2:]
        if not top:
            if name in ("GLOBAL", "STACK_GLOBAL") and found:
                top = found[-1]
            elif name in ("EMPTY_DICT", "DICT"):
                top = "dict"
            elif name in ("EMPTY_LIST", "LIST"):
                top = "list"
            elif name in ("EMPTY_TUPLE", "TUPLE", "MARK"):
                top = "tuple" if name != "MARK" else ""
    return _PickleSummary(top, found, strings)


def _from_pickle(stream: IO[bytes], where: str, container: str) -> FileKind:
    try:
        summary = _summarize_pickle(stream)
    except Exception:  # noqa: BLE001 - a pickle cut short or damaged
        return FileKind(
            "bad-pickle",
            problem=f"{where} is a {container} that cannot be read to the end: truncated or "
            "corrupt? Copy or save the model again",
        )
    is_class = " " in summary.top  # "module qualname" of a GLOBAL, else a container
    package = summary.top.split(".")[0].split(" ")[0] if is_class else ""
    strings = summary.strings
    if package == "mace":
        return FileKind("mace-model", family="mace")
    if summary.top == "dict" and {"model_state_dict", "config"} <= strings:
        return FileKind("sevenn-checkpoint", family="sevennet")
    is_state_dict = summary.top == "collections OrderedDict" or (
        summary.top == "dict" and "torch._utils _rebuild_tensor_v2" in summary.globals
    )
    if summary.top == "dict" and "model" in strings and "optimizer" in strings:
        return FileKind(
            "training-checkpoint",
            problem=f"{where} is a {container} holding a training checkpoint (the state dicts "
            "of a model and its optimizer, as mace's checkpoints/*.pt), not a model: pass the "
            "model file written at the end of training (mace: the .model file, saved with "
            "torch.save(model)) or a SevenNet checkpoint",
        )
    if package == "sevenn":
        return FileKind(
            "sevenn-model-object",
            problem=f"{where} is a {container} holding a SevenNet model object "
            f"({summary.top.split(' ')[-1]}) without its configuration: pass the checkpoint "
            "sevenn writes (checkpoint_*.pth, with 'config' and 'model_state_dict') or a "
            "pretrained name",
        )
    if is_state_dict and not any(g.split(".")[0] in ("mace", "sevenn") for g in summary.globals):
        family = _state_dict_family(strings)
        return FileKind(
            "state-dict",
            problem=f"{where} is a {container} holding a state_dict{family} (weights without "
            "the architecture), which e3fuse cannot convert: pass the whole mace-torch model "
            "(saved with torch.save(model), the .model file) or the SevenNet checkpoint "
            "(with 'config' and 'model_state_dict')",
        )
    if package and package not in ("collections", "builtins", "torch", "numpy", "copyreg"):
        return FileKind(
            "other-pickle",
            problem=f"{where} is a {container} holding a {summary.top.replace(' ', '.')} "
            f"object (package {package!r}), which e3fuse cannot convert: {ACCEPTED}",
        )
    return FileKind(
        "other-pickle",
        problem=f"{where} is a {container} holding neither a mace-torch model nor a SevenNet "
        f"checkpoint (top-level object: {summary.top.replace(' ', '.') or 'unknown'}): "
        f"{ACCEPTED}",
    )


def _state_dict_family(strings: set[str]) -> str:
    if any(s.startswith(("interactions.", "products.", "node_embedding.")) for s in strings):
        return " of a MACE model"
    if any("_self_connection_intro" in s or s.startswith("onehot_to_feature_x") for s in strings):
        return " of a SevenNet model"
    return ""


# --------------------------------------------------------------------------------------
# text
# --------------------------------------------------------------------------------------


def _identify_json(path: Path, where: str) -> FileKind:
    try:
        with open(path, encoding="utf-8-sig") as f:
            value = json.load(f)
    except (ValueError, UnicodeDecodeError):
        return FileKind(
            "text",
            problem=f"{where} is a text file (it starts like JSON but is not valid JSON), not a "
            f"model: {ACCEPTED}",
        )
    if isinstance(value, dict):
        keys = list(value)
        content = f"a JSON object with keys {', '.join(map(str, keys[:5]))}" + (
            ", ..." if len(keys) > 5 else ""
        )
    else:
        content = f"a JSON {type(value).__name__}"
    return FileKind(
        "json",
        problem=f"{where} is a JSON file ({content}), not a model (a configuration?): {ACCEPTED}",
    )


def _is_text(head: bytes) -> bool:
    return all(b >= 32 and b != 127 or b in (9, 10, 13) for b in head)
