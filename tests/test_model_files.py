"""Wrong model files: each kind gets a message that names what the file is and what to pass
instead, from e3fuse.Calculator (Python, before the core reads the file) and, where the
core is the only reader (LAMMPS's pair_coeff, e3fuse._core.Model.load), from the core too.
Also: loading an .e3f imports neither torch nor the upstream packages, and without them a
model that needs converting says exactly what to pip install."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable

import pytest

import e3fuse
from e3fuse import E3fuseError, _core, cli, filekind, modelfile

# --------------------------------------------------------------------------------------
# Files made here, one per kind: name -> (writer, words the Calculator's message must hold)
# --------------------------------------------------------------------------------------


def _write_json(path: Path) -> None:
    path.write_text(json.dumps({"model": "mace", "r_max": 5.0}))


def _write_yaml(path: Path) -> None:
    path.write_text("model:\n  channel: 128\n  lmax: 2\n")


def _write_other_zip(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("weights/a.txt", "1 2 3")


def _write_safetensors_without_metadata(path: Path) -> None:
    store = modelfile.TensorStore()
    store.add("layer.weight", [[1.0, 2.0]])
    header = {"layer.weight": {"dtype": "F64", "shape": [1, 2], "data_offsets": [0, 16]}}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + store.arrays["layer.weight"].tobytes())


def _write_random_bytes(path: Path) -> None:
    path.write_bytes(bytes(range(7, 250)) * 10)


PLAIN_FILES: dict[str, tuple[Callable[[Path], None], list[str]]] = {
    "config.json": (_write_json, ["is a JSON file", "keys model, r_max", "pass an .e3f"]),
    "config.yaml": (_write_yaml, ["is a text file", "pass an .e3f"]),
    "empty.e3f": (lambda p: p.write_bytes(b""), ["is empty (0 bytes)", "again"]),
    "short.e3f": (lambda p: p.write_bytes(b"abc"), ["3 bytes long", "truncated"]),
    "archive.zip": (_write_other_zip, ["zip archive", "not a PyTorch file", "pass an .e3f"]),
    "weights.safetensors": (
        _write_safetensors_without_metadata,
        ["safetensors file but not an e3fuse model", "layer.weight", "pass an .e3f"],
    ),
    "random.bin": (_write_random_bytes, ["not a model file e3fuse recognizes", "pass an .e3f"]),
}


@pytest.mark.parametrize("name", sorted(PLAIN_FILES))
def test_wrong_plain_file(tmp_path: Path, name: str) -> None:
    write, words = PLAIN_FILES[name]
    path = tmp_path / name
    write(path)
    with pytest.raises(E3fuseError) as caught:
        e3fuse.Calculator(path)
    message = str(caught.value)
    assert str(path) in message
    for word in words:
        assert word in message, message


def _torch_files(tmp_path: Path) -> dict[str, tuple[Path, list[str]]]:
    """PyTorch files of every wrong kind, written with torch (skipped without it)."""
    torch = pytest.importorskip("torch")
    state = {"interactions.0.linear.weight": torch.ones(3), "products.0.w": torch.zeros(2)}
    files: dict[str, tuple[Any, list[str]]] = {
        "state_dict.pt": (
            dict(state),
            ["PyTorch file (torch.save)", "state_dict of a MACE model", "torch.save(model)"],
        ),
        "train.pt": (
            {"model": dict(state), "optimizer": {"lr": 0.01}, "lr_scheduler": {}},
            ["training checkpoint", ".model file"],
        ),
        "numbers.pt": ({"a": 1, "b": [1, 2]}, ["neither a mace-torch model nor a SevenNet"]),
        "module.pt": (torch.nn.Linear(2, 2), ["torch.nn.modules.linear.Linear", "neither"]),
    }
    out: dict[str, tuple[Path, list[str]]] = {}
    for name, (obj, words) in files.items():
        torch.save(obj, tmp_path / name)
        out[name] = (tmp_path / name, words)
    legacy = tmp_path / "legacy.pth"
    torch.save(dict(state), legacy, _use_new_zipfile_serialization=False)
    out["legacy.pth"] = (legacy, ["legacy format", "state_dict of a MACE model"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit is deprecated; deployed models remain
        torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(tmp_path / "deployed.pt"))
    out["deployed.pt"] = (tmp_path / "deployed.pt", ["TorchScript", "cannot read"])
    truncated = tmp_path / "cut.model"
    data = (tmp_path / "state_dict.pt").read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    out["cut.model"] = (truncated, ["truncated or corrupt"])
    return out


TORCH_FILES = [
    "state_dict.pt",
    "train.pt",
    "numbers.pt",
    "module.pt",
    "legacy.pth",
    "deployed.pt",
    "cut.model",
]


@pytest.mark.parametrize("name", TORCH_FILES)
def test_wrong_pytorch_file(tmp_path: Path, name: str) -> None:
    path, words = _torch_files(tmp_path)[name]
    with pytest.raises(E3fuseError) as caught:
        e3fuse.Calculator(path)
    message = str(caught.value)
    assert str(path) in message
    for word in words:
        assert word in message, message


def test_torchscript_of_mace_and_sevenn_named(tmp_path: Path) -> None:
    """TorchScript files deployed from mace-torch or sevenn are recognized by the code
    paths inside the archive (here: zips with those entry names)."""
    for package, words in (
        ("mace", ["TorchScript (torch.jit) MACE model", "torch.save(model)"]),
        ("sevenn", ["TorchScript SevenNet model", "checkpoint"]),
    ):
        path = tmp_path / f"{package}.pt"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("m/data.pkl", b"\x80\x02}q\x00.")
            archive.writestr(f"m/code/__torch__/{package}/models.py", "")
            archive.writestr("m/constants.pkl", b"\x80\x02).")
        kind = filekind.identify(path)
        assert kind.kind == "torchscript"
        for word in words:
            assert word in str(kind.problem)


def test_core_names_pytorch_pickle_and_json(tmp_path: Path) -> None:
    """The core (what LAMMPS's pair_coeff reads through) names zip, pickle and JSON files
    instead of reporting an absurd safetensors header length."""
    cases = {
        "a.zip": (_write_other_zip, "a zip archive, e.g. a PyTorch model"),
        "a.pkl": (lambda p: p.write_bytes(b"\x80\x02}q\x00" + b"x" * 64 + b"."), "Python pickle"),
        "a.json": (_write_json, "a JSON file"),
    }
    for name, (write, words) in cases.items():
        path = tmp_path / name
        write(path)
        with pytest.raises(E3fuseError, match="not an e3fuse model file but") as caught:
            _core.Model.load(str(path))
        assert words in str(caught.value) and "e3fuse convert" in str(caught.value)


def test_truncated_and_newer_e3f(sevennet0_path: Path, tmp_path: Path) -> None:
    data = sevennet0_path.read_bytes()
    cut = tmp_path / "cut.e3f"
    cut.write_bytes(data[: len(data) - 100])
    with pytest.raises(E3fuseError, match="is a truncated safetensors \\(.e3f\\) file") as caught:
        e3fuse.Calculator(cut)
    assert "copy it again or convert the source model again" in str(caught.value)
    cut.write_bytes(data[:200])  # inside the header
    with pytest.raises(E3fuseError, match="truncated safetensors .*header alone needs"):
        e3fuse.Calculator(cut)

    from safetensors.numpy import load_file

    architecture = modelfile.read_architecture(sevennet0_path)
    architecture["format_version"] = modelfile.FORMAT_VERSION + 1
    store = modelfile.TensorStore()
    for name, array in load_file(str(sevennet0_path)).items():
        store.add(name, array, dtype=str(array.dtype))
    newer = tmp_path / "newer.e3f"
    modelfile.write_model_file(newer, architecture, store)
    with pytest.raises(E3fuseError, match="newer than this e3fuse") as caught:
        e3fuse.Calculator(newer)
    assert "upgrade e3fuse" in str(caught.value)


def test_directory_and_missing_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(IsADirectoryError, match="is a directory.*holds no .e3f"):
        e3fuse.Calculator(tmp_path)
    (tmp_path / "mine.e3f").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(IsADirectoryError, match="model files in it: mine.e3f$"):
        e3fuse.Calculator(tmp_path)
    with pytest.raises(FileNotFoundError, match="'.*missing.e3f' does not exist$"):
        e3fuse.Calculator(tmp_path / "missing.e3f")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="nor a SevenNet pretrained name such as 7net-0"):
        e3fuse.Calculator("mace-mp-medium")


def test_cli_info_names_wrong_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    _write_json(path)
    assert cli.main(["info", str(path)]) == 1
    assert "is a JSON file" in capsys.readouterr().err
    assert cli.main(["info", str(tmp_path)]) == 1
    assert "is a directory" in capsys.readouterr().err


# --------------------------------------------------------------------------------------
# Without torch
# --------------------------------------------------------------------------------------

BLOCK_UPSTREAM = textwrap.dedent(
    """
    import importlib.abc, sys

    class Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "e3nn", "sevenn", "mace"):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
            return None

    sys.meta_path.insert(0, Blocked())
    """
)


def _run_without_upstream(code: str, tmp_path: Path) -> str:
    script = BLOCK_UPSTREAM + textwrap.dedent(code)
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**_environ(), "E3FUSE_CACHE": str(tmp_path / "cache")},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


def test_loading_an_e3f_never_imports_torch(sevennet0_path: Path, tmp_path: Path) -> None:
    """In a process where torch (and e3nn, sevenn, mace) cannot be imported, an .e3f loads
    and evaluates; a model that needs converting says what to pip install; wrong files are
    still told apart (from their bytes, without torch)."""
    json_file = tmp_path / "config.json"
    _write_json(json_file)
    torch_file = tmp_path / "fake-mace.model"  # a torch.save zip holding a mace class
    with zipfile.ZipFile(torch_file, "w") as archive:
        archive.writestr("fake/data.pkl", b"\x80\x02cmace.modules.models\nMACE\nq\x00)\x81q\x01.")
    out = _run_without_upstream(
        f"""
        import e3fuse
        from ase.build import bulk
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
        atoms.calc = e3fuse.Calculator({str(sevennet0_path)!r})
        print("energy", atoms.get_potential_energy())
        for source in ({str(torch_file)!r}, "7net-0"):
            try:
                e3fuse.Calculator(source)
            except ImportError as err:
                print("import error:", str(err).replace("\\n", " "))
        try:
            e3fuse.Calculator({str(json_file)!r})
        except e3fuse.E3fuseError as err:
            print("wrong file:", err)
        print("loaded:", sorted(m for m in ("torch", "e3nn", "sevenn", "mace") if m in sys.modules))
        """,
        tmp_path,
    )
    lines = out.splitlines()
    assert lines[0].startswith("energy ") and float(lines[0].split()[1]) < 0
    assert "pip install torch e3nn mace-torch" in lines[1]
    assert "mace-torch model" in lines[1] and "fake-mace.model" in lines[1]
    assert "pip install torch e3nn sevenn" in lines[2] and "'7net-0'" in lines[2]
    assert lines[3].startswith("wrong file:") and "is a JSON file" in lines[3]
    assert lines[4] == "loaded: []"


def test_cli_convert_names_wrong_sources(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.json"
    _write_json(path)
    output = tmp_path / "out.e3f"
    assert cli.main(["convert", "mace", str(path), "-o", str(output)]) == 1
    assert "is a JSON file" in capsys.readouterr().err
    sevenn_like = tmp_path / "checkpoint.pth"  # a torch.save zip of a sevenn checkpoint dict
    with zipfile.ZipFile(sevenn_like, "w") as archive:
        archive.writestr(
            "c/data.pkl",
            b"\x80\x02}q\x00(X\x06\x00\x00\x00configq\x01}q\x02"
            b"X\x10\x00\x00\x00model_state_dictq\x03}q\x04u.",
        )
    assert filekind.identify(sevenn_like).family == "sevennet"
    assert cli.main(["convert", "mace", str(sevenn_like), "-o", str(output)]) == 1
    assert "is a sevenn checkpoint, not a mace model" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pth", "config.json"]
