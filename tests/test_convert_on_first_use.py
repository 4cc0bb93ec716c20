"""e3fuse.Calculator on models that are not .e3f files: a SevenNet checkpoint, a SevenNet
pretrained name and a mace-torch model file are converted once (verified against the
upstream package, as `e3fuse convert` does) into the cache, then reused; the cache key
follows the source's bytes, the modality / head and the format version. Also the lines
`e3fuse convert` prints for using the file.

The models are tiny and random (built here, saved to files); a conversion with its
verification takes about a second or two."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ase.build import bulk

torch = pytest.importorskip("torch")
pytest.importorskip("sevenn")
pytest.importorskip("mace.modules")

from helpers_mace import build_mace  # noqa: E402
from helpers_sevenn import random_sevenn_model, save_sevenn_checkpoint  # noqa: E402

import e3fuse  # noqa: E402
from e3fuse import cache, cli, conversion, modelfile, reference  # noqa: E402


class Recorded(Exception):
    """Raised by a stand-in for the converter."""


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("E3FUSE_CACHE", str(directory))
    return directory


def _atoms(symbols: tuple[str, ...] = ("Cu", "Ni", "O"), seed: int = 1) -> Any:
    rng = np.random.default_rng(seed)
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.symbols = [symbols[i] for i in rng.integers(0, len(symbols), len(atoms))]
    atoms.rattle(0.1, seed=seed)
    return atoms


def _energy_forces(calc: Any, atoms: Any) -> tuple[float, np.ndarray]:
    atoms = atoms.copy()
    atoms.calc = calc
    return atoms.get_potential_energy(), atoms.get_forces()


def _cache_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


# --------------------------------------------------------------------------------------
# Tiny models saved to files
# --------------------------------------------------------------------------------------


def save_tiny_sevenn_checkpoint(path: Path, modalities: list[str] | None = None) -> Path:
    """A random SevenNet model (2 layers, 4 channels, lmax 1, Cu Ni O) saved as sevenn
    saves checkpoints: {'config', 'model_state_dict', ...}."""
    import sevenn

    architecture = {
        "cutoff": 4.0,
        "channel": 4,
        "lmax": 1,
        "num_convolution_layer": 2,
        "is_parity": False,
        "weight_nn_hidden_neurons": [8],
        "radial_basis": {"radial_basis_name": "bessel", "bessel_basis_num": 4},
        "conv_denominator": 3.0,
        "scale": 1.5,
        "version": sevenn.__version__,
    }
    # built in torch's default dtype, as training saves it, with noise on every weight
    model, config = random_sevenn_model(
        architecture,
        species=["Cu", "Ni", "O"],
        modalities=modalities,
        built_in_float64=False,
        weight_noise=0.3,
    )
    return save_sevenn_checkpoint(model, config, path)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("sources")
    mace_model = build_mace("8x0e+8x1o", max_ell=1, correlation=2, radial_mlp=(8,), seed=3)
    two_heads = build_mace(
        "8x0e+8x1o", max_ell=1, correlation=2, radial_mlp=(8,), heads=["pbe", "r2scan"], seed=4
    )
    torch.save(mace_model, directory / "tiny.model")
    torch.save(two_heads, directory / "two-heads.model")
    return {
        "mace": directory / "tiny.model",
        "mace-heads": directory / "two-heads.model",
        "sevenn-mf": save_tiny_sevenn_checkpoint(directory / "mf.pth", ["low", "high"]),
    }


# --------------------------------------------------------------------------------------
# Conversion on first use, then the cache
# --------------------------------------------------------------------------------------


def test_mace_file_converted_once_then_reused(
    models: dict[str, Path],
    cache_dir: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    atoms = _atoms()
    calc = e3fuse.Calculator(models["mace"])
    err = capfd.readouterr().err
    assert re.search(r"converting mace-torch model '.*tiny.model' to an .e3f model file", err)
    assert re.search(r"converted and verified against mace-torch in \d+\.\d s", err), err
    assert calc.converted and calc.source == str(models["mace"])
    assert Path(calc.model_path).parent == cache_dir
    assert _cache_files(cache_dir) == [Path(calc.model_path).name]  # no temporary file left
    energy, forces = _energy_forces(calc, atoms)
    expected = reference.evaluate_mace(
        reference.mace_calculator(str(models["mace"]), "float64"), atoms
    )
    assert abs(energy - float(expected["energy"])) < 1e-10
    assert np.abs(forces - expected["forces"]).max() < 1e-10
    assert "converted from" in repr(calc)

    # the second call converts nothing: the converter is not even reachable
    def no_conversion(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(conversion, "convert_to_file", no_conversion)
    again = e3fuse.Calculator(models["mace"])
    assert "converting" not in capfd.readouterr().err
    assert again.model_path == calc.model_path
    assert _energy_forces(again, atoms)[0] == energy
    # a copy of the source under another name is the same conversion
    renamed = cache_dir.parent / "renamed.model"
    renamed.write_bytes(models["mace"].read_bytes())
    assert e3fuse.Calculator(renamed).model_path == calc.model_path


def test_mace_heads(models: dict[str, Path], cache_dir: Path) -> None:
    """One cache file per head; a model of several heads without head= is an error that
    lists them; modal= is refused for mace models."""
    with pytest.raises(ValueError, match=r"several heads \(pbe, r2scan\).*head="):
        e3fuse.Calculator(models["mace-heads"])
    with pytest.raises(ValueError, match="head 'hse' not in the model's heads"):
        e3fuse.Calculator(models["mace-heads"], head="hse")
    with pytest.raises(ValueError, match="take head="):
        e3fuse.Calculator(models["mace-heads"], modal="pbe")
    assert not list(cache_dir.glob("*.e3f"))  # failed conversions leave nothing
    pbe = e3fuse.Calculator(models["mace-heads"], head="pbe")
    r2scan = e3fuse.Calculator(models["mace-heads"], head="r2scan")
    assert pbe.model_path != r2scan.model_path
    assert "-pbe-" in Path(pbe.model_path).name and "-r2scan-" in Path(r2scan.model_path).name
    atoms = _atoms()
    assert _energy_forces(pbe, atoms)[0] != _energy_forces(r2scan, atoms)[0]
    for head, calc in (("pbe", pbe), ("r2scan", r2scan)):
        expected = reference.evaluate_mace(
            reference.mace_calculator(str(models["mace-heads"]), "float64", head), atoms
        )
        assert abs(_energy_forces(calc, atoms)[0] - float(expected["energy"])) < 1e-10
    # an .e3f holds one head: asking it for another is an error
    e3fuse.Calculator(pbe.model_path, head="pbe")
    with pytest.raises(ValueError, match="was converted for head 'pbe', not 'r2scan'"):
        e3fuse.Calculator(pbe.model_path, head="r2scan")


def test_sevenn_checkpoint_and_name_with_modality(
    models: dict[str, Path],
    cache_dir: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A multi-fidelity SevenNet checkpoint, by path and by a pretrained name (sevenn's
    resolution of names patched to know it): converted once per modality; another modality
    is another cache file; the name is remembered (sevenn not asked again); no modality, or
    an unknown one, is an error listing the available ones (before the model is built)."""
    import sevenn.util

    checkpoint = models["sevenn-mf"]
    with pytest.raises(ValueError, match="choose a modality.*one of: low, high"):
        e3fuse.Calculator(checkpoint)
    with pytest.raises(ValueError, match="unknown modality 'mid'.*available: low, high"):
        e3fuse.Calculator(checkpoint, modal="mid")
    with pytest.raises(ValueError, match="take modal="):
        e3fuse.Calculator(checkpoint, head="low")
    assert not list(cache_dir.glob("*.e3f"))

    calc = e3fuse.Calculator(checkpoint, modal="low")
    err = capfd.readouterr().err
    assert f"converting SevenNet checkpoint {str(checkpoint)!r}, modality 'low'" in err
    assert re.search(r"converted and verified against sevenn in \d+\.\d s", err), err
    assert modelfile.read_architecture(calc.model_path)["source"]["modal"] == "low"
    assert "-low-" in Path(calc.model_path).name
    energy, forces = _energy_forces(calc, _atoms())
    assert np.isfinite(energy) and np.abs(forces).max() > 1e-3

    # from here on, a conversion is recorded instead of done
    conversions: list[tuple[str, Any, Path, Any]] = []

    def record(family: str, source: Any, output: Path, modal: Any = None, **kwargs: Any) -> None:
        conversions.append((family, source, Path(output), modal))
        raise Recorded  # stop there: the key, not the conversion, is under test

    monkeypatch.setattr(conversion, "convert_to_file", record)
    with pytest.raises(Recorded):
        e3fuse.Calculator(checkpoint, modal="high")
    assert len(conversions) == 1 and conversions[0][3] == "high"
    assert conversions[0][2] != Path(calc.model_path) and conversions[0][2].parent == cache_dir

    def pretrained_name_to_path(name: str) -> str:
        if name.lower() != "7net-tiny-mf":
            raise ValueError("Not a valid pretrained model name")
        return str(checkpoint)

    monkeypatch.setattr(sevenn.util, "pretrained_name_to_path", pretrained_name_to_path)
    by_name = e3fuse.Calculator("7net-tiny-mf", modal="low")  # same checkpoint: same file
    assert by_name.model_path == calc.model_path and by_name.source == "7net-tiny-mf"
    monkeypatch.setattr(sevenn.util, "pretrained_name_to_path", None)  # remembered now
    assert e3fuse.Calculator("7net-tiny-mf", modal="low").model_path == calc.model_path
    assert len(conversions) == 1
    monkeypatch.setattr(sevenn.util, "pretrained_name_to_path", pretrained_name_to_path)
    with pytest.raises(FileNotFoundError, match="not a file, nor a pretrained model name"):
        e3fuse.Calculator("7net-no-such-model")


def test_cache_key() -> None:
    """The key changes with the source's bytes, the modality / head and the format version,
    and nothing else."""
    sha = "ab" * 32
    key = cache.cache_key(sha, "sevennet", "PBE")
    assert key == cache.cache_key(sha, "sevennet", "PBE")
    assert key != cache.cache_key(sha, "sevennet", "R2SCAN")
    assert key != cache.cache_key(sha, "sevennet", None)
    assert key != cache.cache_key("cd" * 32, "sevennet", "PBE")
    import e3fuse.cache as cache_module

    original = cache_module.FORMAT_VERSION
    try:
        cache_module.FORMAT_VERSION = original + 1
        assert key != cache.cache_key(sha, "sevennet", "PBE")
    finally:
        cache_module.FORMAT_VERSION = original


def test_cache_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("E3FUSE_CACHE", str(tmp_path / "mine"))
    assert cache.cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("E3FUSE_CACHE")
    if cache.sys.platform.startswith("linux"):
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        assert cache.cache_dir() == tmp_path / "xdg" / "e3fuse"
        monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # ignored, as the XDG spec says
        assert cache.cache_dir() == Path.home() / ".cache" / "e3fuse"


def test_failed_verification_leaves_no_file(
    models: dict[str, Path], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def wrong(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("conversion does NOT reproduce the source model (test)")

    import os
    import time

    monkeypatch.setattr(conversion, "verify", wrong)
    # temporaries of killed conversions: removed once a day old, young ones are left alone
    cache_dir.mkdir()
    old, young = cache_dir / ".tiny-x.e3f.abc.tmp", cache_dir / ".tiny-x.e3f.def.tmp"
    for temporary in (old, young):
        temporary.write_bytes(b"partial")
    two_days_ago = time.time() - 2 * 86400
    os.utime(old, (two_days_ago, two_days_ago))
    with pytest.raises(RuntimeError, match="does NOT reproduce"):
        e3fuse.Calculator(models["mace"])
    assert _cache_files(cache_dir) == [young.name]


@pytest.mark.slow
def test_sevenn_pretrained_name(cache_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """'7net-0' from the sevenn wheel: converted once (10-30 s on a CPU: slow); sevenn's
    aliases of it and the checkpoint's path reuse the same file."""
    calc = e3fuse.Calculator("7net-0")
    err = capfd.readouterr().err
    assert "converting SevenNet pretrained model '7net-0'" in err
    architecture = modelfile.read_architecture(calc.model_path)
    assert architecture["source"]["name"] == "7net-0"
    from e3fuse.convert.sevennet import resolve_checkpoint

    for alias in ("SevenNet-0", "7net-0_11Jul2024", str(resolve_checkpoint("7net-0"))):
        assert e3fuse.Calculator(alias).model_path == calc.model_path
    assert "converting" not in capfd.readouterr().err
    assert len(list(cache_dir.glob("*.e3f"))) == 1


# --------------------------------------------------------------------------------------
# e3fuse convert: the lines that use the file
# --------------------------------------------------------------------------------------


def test_cli_convert_prints_how_to_use_the_file(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "tiny.e3f"
    assert cli.main(["convert", "mace", str(models["mace"]), "-o", str(output)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {output}" in out
    lines = [line.strip() for line in out.splitlines()]
    assert "pair_style e3fuse device cpu precision float64" in lines[lines.index("") + 2]
    assert f"pair_coeff * * {output} O Ni Cu" in lines  # the model's elements, its order
    assert f"atoms.calc = Calculator({str(output)!r}, device=" in out
    assert [p.name for p in tmp_path.iterdir()] == ["tiny.e3f"]
    # the printed lines work
    calc = e3fuse.Calculator(str(output), device="cpu", dtype="float64")
    assert np.isfinite(_energy_forces(calc, _atoms())[0])


def test_usage_lines_of_a_many_element_model() -> None:
    lines = cli.usage_lines("omat.e3f", list(range(1, 90)))
    text = "\n".join(lines)
    assert "pair_coeff * * omat.e3f Cu Ni O" in text
    assert "the model's 89 elements:" in text
    assert "H He Li" in text and text.rstrip().endswith('# GPU: device="cuda", dtype="float32"')


@pytest.mark.slow
def test_two_processes_converting_at_once(models: dict[str, Path], cache_dir: Path) -> None:
    """Two processes converting the same model into the same cache at the same time: each
    writes its own temporary file and renames it over the target, so both end with a whole,
    loadable file and no temporary is left."""
    import os
    import subprocess
    import sys

    code = f"import e3fuse; print(e3fuse.Calculator({str(models['mace'])!r}).model_path)"
    env = {**os.environ, "E3FUSE_CACHE": str(cache_dir)}
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        for _ in range(2)
    ]
    outputs = [run.communicate() for run in runs]
    assert all(run.returncode == 0 for run in runs), [err.decode() for _, err in outputs]
    paths = {out.decode().strip() for out, _ in outputs}
    assert len(paths) == 1
    assert _cache_files(cache_dir) == [Path(paths.pop()).name]
    assert np.isfinite(_energy_forces(e3fuse.Calculator(models["mace"]), _atoms())[0])
