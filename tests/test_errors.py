"""Bad input gives a clear Python exception naming the problem, never a crash:
unknown elements, non-finite or coincident positions, empty systems, degenerate
cells, missing / truncated / corrupt / too-new model files, bad arguments to the
core's API, and the CLI's exit status and message."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk
from ase.calculators.calculator import PropertyNotImplementedError
from conftest import DEVICES, calculator, evaluate

import e3fuse
from e3fuse import E3fuseError, _core, cli, modelfile


def _energy(calc: Any, atoms: Atoms) -> float:
    atoms.calc = calc
    return float(atoms.get_potential_energy())


def _forces(calc: Any, atoms: Atoms) -> np.ndarray:
    atoms.calc = calc
    return atoms.get_forces()


def test_error_type() -> None:
    assert issubclass(E3fuseError, ValueError)
    assert e3fuse.E3fuseError is _core.E3fuseError


def test_import_leaves_the_core_and_torch_unloaded() -> None:
    """`import e3fuse` (and the CLI module) load neither the compiled core nor torch, so that
    `e3fuse convert` can import torch before the core: the other order crashed in `import
    torch` on the GPU machines."""
    code = (
        "import sys, e3fuse, e3fuse.cli; "
        "print(sorted(m for m in ('e3fuse._core', 'torch', 'ase') if m in sys.modules)); "
        "print(e3fuse.E3fuseError.__module__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[0] == "[]"
    assert out[1] == "e3fuse._core"


# --------------------------------------------------------------------------------------
# Bad systems
# --------------------------------------------------------------------------------------


def test_element_not_in_model(sevennet0_path: Path) -> None:
    model = _core.Model.load(str(sevennet0_path))
    missing = next(z for z in range(1, 119) if z not in model.atomic_numbers)  # Po (84)
    assert model.species_of(missing) == -1
    assert model.species_of(29) >= 0
    from ase.data import chemical_symbols

    symbol = chemical_symbols[missing]
    atoms = Atoms(["Cu", symbol, "Cu"], positions=[[0, 0, 0], [2.2, 0, 0], [0, 2.2, 0]])
    with pytest.raises(E3fuseError, match=f"element\\(s\\) {symbol} not in the model"):
        _energy(calculator(sevennet0_path), atoms)
    for numbers, name in (([29, 118], "Og"), ([29, 0], "X")):
        atoms = Atoms(numbers=numbers, positions=[[0, 0, 0], [2.2, 0, 0]])
        with pytest.raises(E3fuseError, match=name):
            _energy(calculator(sevennet0_path), atoms)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("pbc", [False, True])
def test_non_finite_positions(sevennet0_path: Path, bad: float, pbc: bool) -> None:
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.pbc = pbc
    atoms.positions[2, 1] = bad
    with pytest.raises(E3fuseError, match="atom 2 is not finite"):
        _forces(calculator(sevennet0_path), atoms)


def test_coincident_atoms(sevennet0_path: Path) -> None:
    atoms = Atoms("Cu3", positions=[[0, 0, 0], [2.0, 0, 0], [2.0, 0, 0]])
    with pytest.raises(E3fuseError, match="atoms 1 and 2 are 0 Å apart"):
        _forces(calculator(sevennet0_path), atoms)
    # with the distance check switched off, the core still refuses r = 0
    with pytest.raises(E3fuseError, match="same position"):
        _forces(calculator(sevennet0_path, min_distance=0.0), atoms)


def test_atoms_closer_than_min_distance(sevennet0_path: Path) -> None:
    atoms = Atoms("CuNi", positions=[[0, 0, 0], [0.05, 0, 0]])
    with pytest.raises(E3fuseError, match="closer than the minimum 0.1"):
        _energy(calculator(sevennet0_path), atoms)
    # a periodic image of the atom itself, through a tiny cell vector
    atoms = Atoms("Cu", positions=[[0, 0, 0]], cell=[0.05, 3.0, 3.0], pbc=True)
    with pytest.raises(E3fuseError, match="periodic image"):
        _energy(calculator(sevennet0_path), atoms)
    # a user-chosen limit is honoured
    atoms = Atoms("CuNi", positions=[[0, 0, 0], [1.0, 0, 0]])
    with pytest.raises(E3fuseError, match="closer than the minimum 1.5"):
        _energy(calculator(sevennet0_path, min_distance=1.5), atoms)
    assert np.isfinite(_energy(calculator(sevennet0_path), atoms))


@pytest.mark.parametrize("device", DEVICES)
def test_atoms_come_closer_while_the_list_stays(sevennet0_path: Path, device: str) -> None:
    """Atoms that approach each other by less than half the skin keep the neighbor
    list; the minimum distance is still checked on it (on the GPU after the step, with
    its results), and the calculator works again once they are apart."""
    calc = calculator(sevennet0_path, device=device, skin=0.5, min_distance=0.2)
    atoms = Atoms("Cu3", positions=[[0, 0, 0], [0.3, 0, 0], [3.0, 0, 0]])
    atoms.calc = calc
    first = atoms.get_potential_energy()
    builds = calc.neighbors.num_builds
    atoms.positions[1, 0] = 0.15  # 0.15 A from atom 0, moved 0.15 < skin / 2
    with pytest.raises(E3fuseError, match="atoms 0 and 1 are 0.15 Å apart, closer"):
        atoms.get_potential_energy()
    assert calc.neighbors.num_builds == builds  # the list was kept
    atoms.positions[1, 0] = 0.3
    assert atoms.get_potential_energy() == pytest.approx(first, rel=1e-12)


@pytest.mark.parametrize("pbc", [False, True])
def test_empty_atoms(sevennet0_path: Path, pbc: bool) -> None:
    atoms = Atoms(cell=[5.0, 5.0, 5.0], pbc=pbc)
    with pytest.raises(E3fuseError, match="empty"):
        _energy(calculator(sevennet0_path), atoms)


@pytest.mark.parametrize(
    "cell",
    [
        [[3.0, 0, 0], [0, 3.0, 0], [0, 0, 0]],  # a zero vector
        [[3.0, 0, 0], [0, 3.0, 0], [3.0, 3.0, 0]],  # coplanar vectors
    ],
)
def test_zero_volume_periodic_cell(sevennet0_path: Path, cell: list[list[float]]) -> None:
    atoms = Atoms("Cu", positions=[[0, 0, 0]], cell=cell, pbc=True)
    with pytest.raises(E3fuseError, match="zero volume"):
        _energy(calculator(sevennet0_path), atoms)


def test_zero_cell_vector_along_open_direction_is_fine(sevennet0_path: Path) -> None:
    """Only the periodic directions' vectors matter: a slab with c = 0 is valid."""
    atoms = Atoms(
        "Cu2",
        positions=[[0, 0, 0], [1.8, 1.8, 0.5]],
        cell=[[3.6, 0, 0], [0, 3.6, 0], [0, 0, 0]],
        pbc=[True, True, False],
    )
    reference = atoms.copy()
    reference.cell[2] = [0, 0, 30.0]
    assert _energy(calculator(sevennet0_path), atoms) == pytest.approx(
        _energy(calculator(sevennet0_path), reference), rel=1e-13
    )


@pytest.mark.parametrize("pbc", [False, (True, True, False)])
def test_stress_of_non_periodic_system(sevennet0_path: Path, pbc: Any) -> None:
    atoms = Atoms("Cu2", positions=[[0, 0, 0], [2.3, 0, 0]], cell=[4.0, 4.0, 10.0], pbc=pbc)
    atoms.calc = calculator(sevennet0_path)
    with pytest.raises(PropertyNotImplementedError):
        atoms.get_stress()
    assert np.isfinite(atoms.get_potential_energy())


def test_calculator_recovers_after_an_error(sevennet0_path: Path) -> None:
    """A refused input leaves the calculator (and its neighbor list) usable."""
    calc = calculator(sevennet0_path)
    good = bulk("Cu", "fcc", a=3.6, cubic=True)
    good.rattle(0.05, seed=3)
    expected = evaluate(calculator(sevennet0_path), good)
    bad = good.copy()
    bad.positions[1] = np.nan
    with pytest.raises(E3fuseError):
        _forces(calc, bad)
    bad = good.copy()
    bad.positions[1] = bad.positions[0]
    with pytest.raises(E3fuseError):
        _forces(calc, bad)
    np.testing.assert_array_equal(evaluate(calc, good)["forces"], expected["forces"])


def test_bad_calculator_arguments(sevennet0_path: Path) -> None:
    with pytest.raises(E3fuseError, match="unknown precision 'float16'"):
        calculator(sevennet0_path, dtype="float16")
    with pytest.raises(E3fuseError, match="unknown device 'tpu'"):
        calculator(sevennet0_path, device="tpu")
    for bad in ("cuda:", "cuda:x", "cuda:-1", "cudaa"):
        with pytest.raises(E3fuseError, match="unknown device"):
            calculator(sevennet0_path, device=bad)
    if not _core.cuda_available():
        assert _core.cuda_device_count() == 0
        for device in ("cuda", "cuda:0"):
            with pytest.raises(E3fuseError, match="without CUDA|no CUDA device"):
                calculator(sevennet0_path, device=device)
    else:
        count = _core.cuda_device_count()
        with pytest.raises(E3fuseError, match=f"GPU {count} requested"):
            calculator(sevennet0_path, device=f"cuda:{count}")


# --------------------------------------------------------------------------------------
# The core's API with inconsistent arrays
# --------------------------------------------------------------------------------------


def test_core_api_rejects_inconsistent_input(sevennet0_path: Path) -> None:
    model = _core.Model.load(str(sevennet0_path))
    engine = _core.Engine(model, "cpu", "float64")
    positions = np.array([[0.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
    species = np.array([0, 0], dtype=np.int32)
    rows = np.array([0, 1, 2], dtype=np.int64)
    nbrs = np.array([1, 0], dtype=np.int32)
    assert np.isfinite(engine.compute_graph(positions, species, rows, nbrs)["energy"])
    cases = [
        ((positions, np.array([0, 500], dtype=np.int32), rows, nbrs), "species index 500"),
        ((positions, np.array([0, -1], dtype=np.int32), rows, nbrs), "species index -1"),
        ((positions, species, rows, np.array([1, 7], dtype=np.int32)), "out of range"),
        ((positions, species, np.array([0, 1, 3], dtype=np.int64), nbrs), "row_offsets"),
        ((np.zeros((2, 2)), species, rows, nbrs), "positions has the wrong shape"),
        ((np.array([[0, 0, 0], [np.nan, 0, 0]]), species, rows, nbrs), "not.*finite|non-finite"),
        ((np.zeros((2, 3)), species, rows, nbrs), "same position"),
    ]
    for args, message in cases:
        with pytest.raises(E3fuseError, match=message):
            engine.compute_graph(*args)
    neighbors = _core.NeighborList(model.cutoff, 0.5)
    with pytest.raises(E3fuseError, match="cell has the wrong shape"):
        neighbors.update(positions, np.eye(2), [False] * 3)
    with pytest.raises(E3fuseError, match="pbc must have 3 entries"):
        neighbors.update(positions, np.eye(3), [False] * 2)
    neighbors.update(positions, np.eye(3), [False] * 3)
    with pytest.raises(E3fuseError, match="different number of atoms"):
        engine.compute_neighbors(neighbors, np.zeros((3, 3)), np.zeros(3, dtype=np.int32))


# --------------------------------------------------------------------------------------
# Model files
# --------------------------------------------------------------------------------------


def test_missing_model_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.e3f"
    with pytest.raises(FileNotFoundError, match="missing.e3f"):
        e3fuse.Calculator(missing)
    with pytest.raises(IsADirectoryError, match="is a directory"):
        e3fuse.Calculator(tmp_path)
    with pytest.raises(E3fuseError, match="cannot open model file"):
        _core.Model.load(str(missing))


def _header(path: Path) -> tuple[dict[str, Any], bytes]:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + length]), data[8 + length :]


def _write_with_header(path: Path, header: dict[str, Any], body: bytes) -> Path:
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)
    return path


def _rewrite(
    source: Path,
    target: Path,
    architecture: dict[str, Any] | None = None,
    tensors: dict[str, np.ndarray] | None = None,
) -> Path:
    """Write a model file through e3fuse.modelfile from (possibly edited) parts."""
    from safetensors.numpy import load_file

    architecture = architecture if architecture is not None else modelfile.read_architecture(source)
    tensors = tensors if tensors is not None else load_file(str(source))
    store = modelfile.TensorStore()
    for name, array in tensors.items():
        store.add(name, array, dtype=str(array.dtype))
    modelfile.write_model_file(target, architecture, store)
    return target


def _expect_refused(path: Path, message: str) -> None:
    with pytest.raises(E3fuseError, match=message):
        _core.Model.load(str(path))
    with pytest.raises(E3fuseError, match=message):
        e3fuse.Calculator(path)


def test_rewritten_model_file_loads(sevennet0_path: Path, tmp_path: Path) -> None:
    """The byte surgery below starts from files that load: a control."""
    copy = _rewrite(sevennet0_path, tmp_path / "copy.e3f")
    atoms = Atoms("CuNi", positions=[[0, 0, 0], [2.4, 0.1, 0]])
    assert _energy(calculator(copy), atoms.copy()) == _energy(calculator(sevennet0_path), atoms)
    header, body = _header(sevennet0_path)
    same = _write_with_header(tmp_path / "same.e3f", header, body)
    assert _core.Model.load(str(same)).num_parameters > 0


@pytest.mark.parametrize("size", [0, 4, 8, 100, "half", "minus1"])
def test_truncated_model_file(sevennet0_path: Path, tmp_path: Path, size: Any) -> None:
    data = sevennet0_path.read_bytes()
    n = {"half": len(data) // 2, "minus1": len(data) - 1}.get(size, size)
    path = tmp_path / "truncated.e3f"
    path.write_bytes(data[:n])
    _expect_refused(path, "truncated|too short")


def test_random_bytes_model_file(tmp_path: Path) -> None:
    path = tmp_path / "random.e3f"
    path.write_bytes(np.random.default_rng(0).bytes(10_000))
    _expect_refused(path, "not a safetensors file")
    path.write_bytes(struct.pack("<Q", 16) + b"\xff" * 16 + b"\0" * 64)
    _expect_refused(path, "invalid JSON|header")


def test_header_with_wrong_shape(sevennet0_path: Path, tmp_path: Path) -> None:
    header, body = _header(sevennet0_path)
    name = "layers.1.linear_1.path.0"
    header[name]["shape"] = [3, 5]
    _expect_refused(
        _write_with_header(tmp_path / "shape.e3f", header, body), f"{name}.*shape \\[3, 5\\]"
    )


def test_tensor_with_wrong_shape(sevennet0_path: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    tensors = load_file(str(sevennet0_path))
    name = "layers.1.linear_1.path.0"
    tensors[name] = tensors[name][:-1]
    _expect_refused(
        _rewrite(sevennet0_path, tmp_path / "short.e3f", tensors=tensors),
        f"{name}' has shape \\[127, 128\\], expected \\[128, 128\\]",
    )


def test_missing_tensor(sevennet0_path: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    tensors = load_file(str(sevennet0_path))
    del tensors["layers.2.conv.mlp.w1"]
    _expect_refused(
        _rewrite(sevennet0_path, tmp_path / "missing.e3f", tensors=tensors),
        "layers.2.conv.mlp.w1.*missing",
    )


def test_header_entry_without_dtype(sevennet0_path: Path, tmp_path: Path) -> None:
    header, body = _header(sevennet0_path)
    del header["shift"]["dtype"]
    _expect_refused(_write_with_header(tmp_path / "dtype.e3f", header, body), "shift.*dtype")


def test_corrupt_metadata(sevennet0_path: Path, tmp_path: Path) -> None:
    header, body = _header(sevennet0_path)
    broken = json.loads(json.dumps(header))
    broken["__metadata__"]["e3fuse"] = broken["__metadata__"]["e3fuse"][:40]
    _expect_refused(
        _write_with_header(tmp_path / "json.e3f", broken, body), "metadata: invalid JSON"
    )
    plain = json.loads(json.dumps(header))
    del plain["__metadata__"]
    _expect_refused(_write_with_header(tmp_path / "plain.e3f", plain, body), "not an e3fuse model")


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"format_version": 99}, "format version 99, newer than this e3fuse"),
        ({"family": "allegro"}, "family 'allegro' is not supported"),
        ({"cutoff": -1.0}, "cutoff"),
        ({"cutoff": None}, "missing key 'cutoff'"),
    ],
)
def test_bad_architecture(
    sevennet0_path: Path, tmp_path: Path, edit: dict[str, Any], message: str
) -> None:
    architecture = modelfile.read_architecture(sevennet0_path)
    for key, value in edit.items():
        if value is None:
            del architecture[key]
        else:
            architecture[key] = value
    _expect_refused(_rewrite(sevennet0_path, tmp_path / "edited.e3f", architecture), message)


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


def test_cli_info_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["info", str(tmp_path / "missing.e3f")])
    captured = capsys.readouterr()
    assert rc != 0
    assert "e3fuse: error:" in captured.err and "missing.e3f" in captured.err
    assert captured.out == ""


def test_cli_info_corrupt_file(
    sevennet0_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "corrupt.e3f"
    shutil.copyfile(sevennet0_path, path)
    with open(path, "r+b") as f:
        f.truncate(1000)
    rc = cli.main(["info", str(path)])
    assert rc != 0
    assert "truncated" in capsys.readouterr().err


def test_cli_convert_unknown_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "out.e3f"
    rc = cli.main(
        ["convert", "sevennet", str(tmp_path / "no-such-checkpoint.pth"), "-o", str(output)]
    )
    assert rc != 0
    assert "neither a sevenn checkpoint" in capsys.readouterr().err
    assert not output.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind


def test_cli_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["frobnicate"])
    assert exit_info.value.code != 0
    assert "invalid choice" in capsys.readouterr().err
