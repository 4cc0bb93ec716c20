"""From what a user passes to e3fuse.Calculator to an .e3f file: the file itself, or a
SevenNet pretrained name, SevenNet checkpoint or mace-torch model file converted once into
the cache (e3fuse.cache). Wrong files are refused here, before the core sees them, with a
message saying what the file is and what to pass instead (e3fuse.filekind).

Loading an .e3f imports neither torch nor the upstream packages; only a conversion does."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from . import cache, filekind
from .modelfile import read_architecture, sha256_of_file

SEVENN_NAME_PREFIXES = ("7net", "sevennet")
MODEL_SUFFIXES = (".e3f", ".pth", ".pt", ".model", ".ckpt")
KIND_DESCRIPTIONS = {"mace-model": "mace-torch model", "sevenn-checkpoint": "SevenNet checkpoint"}


@dataclasses.dataclass(frozen=True)
class ResolvedModel:
    path: Path  # the .e3f file to load
    converted: bool  # True: a file of the cache, converted from `source`
    source: str  # what the user passed


def _error(message: str) -> Exception:
    from . import E3fuseError

    return E3fuseError(message)


def resolve(
    model: str | os.PathLike[str], modal: str | None = None, head: str | None = None
) -> ResolvedModel:
    """The .e3f file for `model` (see the module docstring)."""
    text = os.fspath(model)
    path = Path(text).expanduser()
    if path.is_dir():
        raise IsADirectoryError(directory_message(text, path))
    if path.is_file():
        kind = filekind.identify(path)
        if kind.kind == "e3f":
            _check_selection(path, modal, head)
            return ResolvedModel(path, False, text)
        if not kind.convertible:
            raise _error(str(kind.problem))
        if kind.family == "sevennet" and head is not None:
            raise ValueError(
                f"head={head!r} given for the SevenNet checkpoint {text!r}: SevenNet "
                "multi-fidelity models take modal="
            )
        if kind.family == "mace" and modal is not None:
            raise ValueError(
                f"modal={modal!r} given for the mace-torch model {text!r}: mace-torch "
                "multi-head models take head="
            )
        description = f"{KIND_DESCRIPTIONS[kind.kind]} {text!r}" + _selection(modal, head)
        cached = cache.converted_model(
            str(kind.family), str(path), path, path.stem, description, modal=modal, head=head
        )
        return ResolvedModel(cached, True, text)
    if _looks_like_sevenn_name(text):
        if head is not None:
            raise ValueError(f"head={head!r} given for the SevenNet model {text!r}: use modal=")
        checkpoint, sha = pretrained_checkpoint(text)
        description = f"SevenNet pretrained model {text!r}" + _selection(modal, None)
        cached = cache.converted_model(
            "sevennet",
            text,
            checkpoint,
            text.lower(),
            description,
            modal=modal,
            source_sha256=sha,
        )
        return ResolvedModel(cached, True, text)
    hint = ""
    if not Path(text).suffix and os.sep not in text and "/" not in text:
        hint = (
            " (nor a SevenNet pretrained name such as 7net-0; MACE foundation models: download "
            "their .model file and pass its path)"
        )
    raise FileNotFoundError(f"model file {text!r} does not exist{hint}")


def _selection(modal: str | None, head: str | None) -> str:
    if modal is not None:
        return f", modality {modal!r}"
    if head is not None:
        return f", head {head!r}"
    return ""


def _looks_like_sevenn_name(text: str) -> bool:
    return "/" not in text and os.sep not in text and text.lower().startswith(SEVENN_NAME_PREFIXES)


def directory_message(text: str, path: Path) -> str:
    try:
        inside = sorted(p.name for p in path.iterdir() if p.suffix in MODEL_SUFFIXES)
    except OSError:
        inside = []
    if inside:
        shown = ", ".join(inside[:5]) + (", ..." if len(inside) > 5 else "")
        return f"{text!r} is a directory, not a model file; model files in it: {shown}"
    return (
        f"{text!r} is a directory, not a model file (it holds no "
        f"{', '.join(MODEL_SUFFIXES)} file): {filekind.ACCEPTED}"
    )


def _check_selection(path: Path, modal: str | None, head: str | None) -> None:
    """An .e3f holds one modality / head, chosen at conversion: a modal= or head= that
    asks for another is an error, not silently ignored."""
    if modal is None and head is None:
        return
    source = read_architecture(path).get("source", {})
    for name, asked, option in (("modality", modal, "modal"), ("head", head, "head")):
        if asked is None:
            continue
        held = source.get(option)
        if held is None:
            raise ValueError(
                f"{option}={asked!r} given, but {str(path)!r} has no {name} to choose (an .e3f "
                f"file holds the one chosen at conversion; this one has none)"
            )
        if held != asked:
            raise ValueError(
                f"{str(path)!r} was converted for {name} {held!r}, not {asked!r}: pass the "
                f"source model with {option}={asked!r}, or convert it again "
                f"(e3fuse convert ... --{option} {asked})"
            )


# --------------------------------------------------------------------------------------
# SevenNet pretrained names
# --------------------------------------------------------------------------------------


def _names_file(name: str) -> Path:
    return cache.cache_dir() / "pretrained" / f"{cache.safe_file_name(name.lower())}.json"


def pretrained_checkpoint(name: str) -> tuple[Path, str]:
    """(checkpoint file, its SHA-256) of a sevenn pretrained name, with sevenn's own
    resolution (its aliases; it downloads the checkpoints not shipped in its wheel). The
    answer is remembered in the cache, so that a later call with the checkpoint unchanged
    (same size and modification time) needs neither sevenn nor torch, nor the hash."""
    memo = _names_file(name)
    try:
        known = json.loads(memo.read_text())
        stat = os.stat(known["checkpoint"])
        if stat.st_size == known["size"] and stat.st_mtime_ns == known["mtime_ns"]:
            return Path(known["checkpoint"]), str(known["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    from . import conversion

    conversion.require_packages("sevennet", f"the SevenNet pretrained model {name!r}")
    import sevenn
    import sevenn.util

    cache.progress(f"looking up the SevenNet pretrained model {name!r} with sevenn")
    try:
        checkpoint = Path(sevenn.util.pretrained_name_to_path(name))
    except ValueError as err:
        known_names = getattr(sevenn.util, "get_available_pretrained_models", list)()
        raise FileNotFoundError(
            f"{name!r} is not a file, nor a pretrained model name sevenn {sevenn.__version__} "
            f"knows ({', '.join(known_names) or 'see its documentation'})"
        ) from err
    sha = sha256_of_file(checkpoint)
    stat = checkpoint.stat()
    record = {
        "checkpoint": str(checkpoint.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sha256": sha,
    }
    try:
        _write_atomically(memo, json.dumps(record, indent=1))
    except OSError:  # a read-only cache only costs the lookup next time
        pass
    return checkpoint, sha


def _write_atomically(path: Path, text: str) -> None:
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
