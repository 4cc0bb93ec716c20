"""The cache of models that e3fuse.Calculator converted on first use.

Where: ``$E3FUSE_CACHE`` if set, else the platform's user cache directory (Linux:
``$XDG_CACHE_HOME/e3fuse``, by default ``~/.cache/e3fuse``; macOS: ``~/Library/Caches/e3fuse``;
Windows: ``%LOCALAPPDATA%\\e3fuse\\Cache``). What: one .e3f file per (source file's SHA-256,
model family, modality or head, e3fuse's model-file format version), named
``<source>[-<modality or head>]-<key>.e3f`` where ``<key>`` is the first 16 hex digits of the
SHA-256 of those four; a source file edited in place, another modality or a new format version
gives another file. Files are written by ``conversion.convert_to_file`` (temporary file, then
rename), so two processes converting the same model at once each write a whole file and the
last rename wins. Deleting the directory (or one file) is always safe: it is rebuilt on the
next use."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
import time
from pathlib import Path

from . import conversion
from .modelfile import FORMAT_VERSION, sha256_of_file

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """The directory of converted models (created on first write, not here)."""
    override = os.environ.get("E3FUSE_CACHE")
    if override:
        return Path(override).expanduser()
    home = Path.home()
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA")
        return (Path(base) if base else home / "AppData" / "Local") / "e3fuse" / "Cache"
    if sys.platform == "darwin":
        return home / "Library" / "Caches" / "e3fuse"
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # the XDG spec ignores relative paths
    return (Path(xdg) if os.path.isabs(xdg) else home / ".cache") / "e3fuse"


def cache_key(source_sha256: str, family: str, selector: str | None) -> str:
    """SHA-256 over what the converted file depends on: the source's bytes, the family,
    the modality (sevenn) or head (mace) asked for, and the .e3f format version."""
    identity = {
        "source_sha256": source_sha256,
        "family": family,
        "selector": selector,
        "format_version": FORMAT_VERSION,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def safe_file_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", text).strip("._") or "model"


def cache_path(source_sha256: str, family: str, selector: str | None, label: str) -> Path:
    """The cache file of a conversion; `label` (the source's name) only makes it readable."""
    key = cache_key(source_sha256, family, selector)
    readable = safe_file_name(label)
    if selector is not None:
        readable += "-" + safe_file_name(selector)
    return cache_dir() / f"{readable}-{key[:16]}.e3f"


STALE_AFTER_S = 24 * 3600


def remove_stale_temporaries(directory: Path) -> None:
    """Temporary files of conversions that ended without cleaning up (a killed process),
    once they are a day old: a conversion still writing its file is far younger."""
    now = time.time()
    for stale in directory.glob(".*.tmp"):
        try:
            if now - stale.stat().st_mtime > STALE_AFTER_S:
                stale.unlink()
        except OSError:  # gone meanwhile, or not ours to remove
            pass


def progress(message: str) -> None:
    """One line on stderr: conversions take seconds to minutes and happen once."""
    print(f"e3fuse: {message}", file=sys.stderr, flush=True)


def converted_model(
    family: str,
    source: str,
    source_file: Path,
    label: str,
    description: str,
    modal: str | None = None,
    head: str | None = None,
    source_sha256: str | None = None,
) -> Path:
    """The cached .e3f of `source` (what the converter takes: a file path or a sevenn
    pretrained name whose checkpoint is `source_file`), converted and verified now if it
    is not in the cache yet. `description` names the source in messages."""
    sha = source_sha256 or sha256_of_file(source_file)
    selector = modal if family == "sevennet" else head
    path = cache_path(sha, family, selector, label)
    # the label only makes the name readable: the same source under another name (a sevenn
    # alias, a renamed copy) is the same conversion
    for found in [path, *sorted(path.parent.glob(f"*-{path.stem.rsplit('-', 1)[1]}.e3f"))]:
        if found.is_file():
            log.info("using %s converted before: %s", description, found)
            return found
    conversion.require_packages(family, description)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        writable = os.access(path.parent, os.W_OK)
    except OSError:
        writable = False
    if not writable:
        raise PermissionError(
            f"cannot write e3fuse's cache {str(path.parent)!r} (for {description}): set "
            "E3FUSE_CACHE to a writable directory, or convert with `e3fuse convert` and pass "
            "the .e3f file"
        )
    remove_stale_temporaries(path.parent)
    progress(
        f"converting {description} to an .e3f model file (first use; later calls reuse it): {path}"
    )
    start = time.perf_counter()
    diff = conversion.convert_to_file(
        family, source, path, modal=modal, head=head, check=True, quiet=True
    )
    checked = f" (max |d forces| = {diff['forces']:.1e} eV/A)" if diff else ""
    progress(
        f"converted and verified against {conversion.UPSTREAM_NAME[family]} in "
        f"{time.perf_counter() - start:.1f} s{checked}"
    )
    return path
