"""The ASE front end: neighbor-list reuse within the skin, results that follow
the atoms (moves, changed elements, changed atom count), a short NVE run,
determinism, repr, the model file as a plain safetensors file with its
architecture and provenance, and `e3fuse info`."""

from __future__ import annotations

import gc
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ase import Atoms, units
from ase.build import bulk
from conftest import (
    DEVICES,
    STRUCTURES,
    TOLERANCES,
    assert_abs,
    assert_rel,
    calculator,
    evaluate,
)

import e3fuse
from e3fuse import _core, cli, modelfile

TOL = TOLERANCES["float64"]


def _assert_same_results(
    ours: dict[str, np.ndarray], fresh: dict[str, np.ndarray], what: str
) -> None:
    """Same structure through a reused and a freshly built neighbor list: only the
    order of the sums over edges may differ."""
    assert_rel(ours["energy"], fresh["energy"], TOL.rel, f"{what}: energy")
    assert_rel(ours["energies"], fresh["energies"], TOL.rel, f"{what}: per-atom energies")
    assert_rel(ours["forces"], fresh["forces"], TOL.grad_rel, f"{what}: forces")
    if "stress" in fresh:
        assert_rel(ours["stress"], fresh["stress"], TOL.grad_rel, f"{what}: stress")


@pytest.fixture
def cu32() -> Atoms:
    return STRUCTURES["cu_bulk"]()


def test_neighbor_list_reuse(sevennet0_path: Path, cu32: Atoms) -> None:
    calc = calculator(sevennet0_path, skin=0.5)
    atoms = cu32.copy()
    atoms.calc = calc
    first = {"energy": atoms.get_potential_energy(), "forces": atoms.get_forces().copy()}
    assert calc.neighbors.num_builds == 1
    assert calc.neighbors.skin == 0.5

    # small moves (< skin / 2) reuse the list, and the results follow the atoms
    rng = np.random.default_rng(0)
    for step in range(3):  # at most 0.12 + 3 * 0.02 * sqrt(3) = 0.22 A from the start
        atoms.positions += 0.02 * rng.uniform(-1, 1, size=atoms.positions.shape)
        if step == 0:
            atoms.positions[5] += [0.12, 0.0, 0.0]
        ours = evaluate(calc, atoms)
        assert calc.neighbors.num_builds == 1, f"rebuilt after a small move (step {step})"
        _assert_same_results(
            ours, evaluate(calculator(sevennet0_path), atoms), f"reused list, step {step}"
        )
    assert abs(ours["energy"] - first["energy"]) > 1e-4
    assert np.abs(ours["forces"] - first["forces"]).max() > 1e-3

    # one atom moving further than skin / 2 since the last build triggers a rebuild
    atoms.positions[7] += [0.3, 0.0, 0.0]
    ours = evaluate(calc, atoms)
    assert calc.neighbors.num_builds == 2
    _assert_same_results(ours, evaluate(calculator(sevennet0_path), atoms), "after rebuild")

    # so does a change of the cell, even a small one
    atoms.set_cell(atoms.cell.array * 1.001, scale_atoms=True)
    ours = evaluate(calc, atoms)
    assert calc.neighbors.num_builds == 3
    _assert_same_results(ours, evaluate(calculator(sevennet0_path), atoms), "after cell change")

    # and a change of periodicity
    atoms.pbc = (True, True, False)
    ours = evaluate(calc, atoms)
    assert calc.neighbors.num_builds == 4
    _assert_same_results(ours, evaluate(calculator(sevennet0_path), atoms), "after pbc change")


def test_skin_zero_rebuilds_every_step(sevennet0_path: Path, cu32: Atoms) -> None:
    calc = calculator(sevennet0_path, skin=0.0)
    atoms = cu32.copy()
    for k in range(3):
        atoms.positions[0] += [0.01, 0.0, 0.0]
        evaluate(calc, atoms)
        assert calc.neighbors.num_builds == k + 1


def test_edges_inside_the_skin_do_not_count(sevennet0_path: Path) -> None:
    """A pair between cutoff and cutoff + skin is in the list but contributes
    nothing; once it moves inside the cutoff it does (without a rebuild)."""
    calc = calculator(sevennet0_path, skin=1.0)
    atoms = Atoms("CuNi", positions=[[0, 0, 0], [5.3, 0, 0]])
    outside = evaluate(calc, atoms)
    assert calc.neighbors.num_edges == 2
    assert np.all(outside["forces"] == 0.0)
    atoms.positions[1, 0] = 4.9
    inside = evaluate(calc, atoms)
    assert calc.neighbors.num_builds == 1
    assert np.abs(inside["forces"]).max() > 1e-3
    _assert_same_results(
        inside, evaluate(calculator(sevennet0_path, skin=0.0), atoms), "pair moved into the cutoff"
    )


def test_changing_atoms(sevennet0_path: Path, cu32: Atoms) -> None:
    calc = calculator(sevennet0_path)
    atoms = cu32.copy()
    evaluate(calc, atoms)
    # fewer atoms
    del atoms[[3, 17]]
    _assert_same_results(
        evaluate(calc, atoms), evaluate(calculator(sevennet0_path), atoms), "after deleting atoms"
    )
    # more atoms
    atoms += Atoms("Ni", positions=[[1.0, 1.1, 0.9]])
    _assert_same_results(
        evaluate(calc, atoms), evaluate(calculator(sevennet0_path), atoms), "after adding an atom"
    )
    # same positions, other elements
    before = evaluate(calc, atoms)
    atoms.numbers[:4] = 28
    after = evaluate(calc, atoms)
    assert abs(after["energy"] - before["energy"]) > 1e-3
    _assert_same_results(
        after, evaluate(calculator(sevennet0_path), atoms), "after changing elements"
    )
    # a different structure altogether
    other = STRUCTURES["ethanol"]()
    _assert_same_results(
        evaluate(calc, other),
        evaluate(calculator(sevennet0_path), other),
        "a molecule after a crystal",
    )


def test_results_and_properties(sevennet0_path: Path, cu32: Atoms) -> None:
    atoms = cu32.copy()
    atoms.calc = calculator(sevennet0_path)
    forces = atoms.get_forces()
    energy = atoms.get_potential_energy()
    assert atoms.calc.get_property("free_energy", atoms) == energy
    assert isinstance(energy, float)
    assert forces.shape == (len(atoms), 3) and forces.dtype == np.float64
    assert atoms.get_stress().shape == (6,)
    assert atoms.get_potential_energies().shape == (len(atoms),)
    for name in ("energy", "free_energy", "energies", "forces", "stress", "stresses"):
        assert name in e3fuse.Calculator.implemented_properties


def test_energy_only_matches_full_evaluation(sevennet0_path: Path, cu32: Atoms) -> None:
    """Energy without gradients (the cheaper path) equals the energy of a full call."""
    atoms = cu32.copy()
    atoms.calc = calculator(sevennet0_path)
    energy_only = atoms.get_potential_energy()
    full = evaluate(calculator(sevennet0_path), atoms)
    assert energy_only == full["energy"]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_deterministic(sevennet0_path: Path, dtype: str) -> None:
    """The backward pass gathers instead of scattering (no atomics): results are
    bitwise reproducible, from call to call and for any number of threads."""
    atoms = STRUCTURES["cunio_alloy"]()
    one = evaluate(calculator(sevennet0_path, dtype, num_threads=1), atoms)
    two = evaluate(calculator(sevennet0_path, dtype, num_threads=2), atoms)
    again = evaluate(calculator(sevennet0_path, dtype, num_threads=2), atoms)
    for key in one:
        np.testing.assert_array_equal(two[key], again[key], err_msg=key)
        np.testing.assert_array_equal(one[key], two[key], err_msg=key)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cuda_deterministic(sevennet0_path: Path, dtype: str) -> None:
    """On the GPU each message's force reaches its receiver through integer (fixed-point)
    atomics, whose sums do not depend on the order the atomics land in: results, per-atom
    virials included, are bitwise the same from call to call and calculator to calculator."""
    if not _core.cuda_available():
        pytest.skip("e3fuse built without CUDA or no GPU")
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((5, 5, 5))
    atoms.rattle(stdev=0.05, seed=3)
    runs = []
    for _ in range(2):
        calc = calculator(sevennet0_path, dtype, "cuda")
        for _ in range(2):
            calc.reset()  # evaluate anew, not from the last call's results
            out = evaluate(calc, atoms)
            # per-atom virials split each edge's term between its atoms, which rounds the
            # stress differently (by ~1e-15 relative): a call of its own, compared alike
            calc.reset()
            probe = atoms.copy()
            probe.calc = calc
            out["stresses"] = probe.get_stresses()
            out["stress with stresses"] = probe.get_stress()
            runs.append(out)
    for other in runs[1:]:
        for key in runs[0]:
            np.testing.assert_array_equal(other[key], runs[0][key], err_msg=key)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cuda_recomputed_layer_inputs_are_bitwise_equal(
    sevennet0_path: Path, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large systems keep one convolution input instead of one per layer and recompute it in
    the backward pass (from E3FUSE_RECOMPUTE_FROM_NODES nodes, read at every call): the
    results are bitwise those of the stored path, with less device memory held."""
    if not _core.cuda_available():
        pytest.skip("e3fuse built without CUDA or no GPU")
    atoms = STRUCTURES["cunio_alloy"]()
    results, held = {}, {}
    for mode, threshold in (("stored", "1000000000"), ("recomputed", "0")):
        monkeypatch.setenv("E3FUSE_RECOMPUTE_FROM_NODES", threshold)
        # engines of earlier tests still waiting in reference cycles would be freed during
        # the measurement and count as negative memory held
        gc.collect()
        before = _core.Engine.device_bytes_in_use()
        calc = calculator(sevennet0_path, dtype, "cuda")
        results[mode] = evaluate(calc, atoms)
        held[mode] = _core.Engine.device_bytes_in_use() - before
        del calc
    for key in results["stored"]:
        np.testing.assert_array_equal(results["recomputed"][key], results["stored"][key], key)
    # per-layer inputs of 128, 480, 480, 480 and 480 values per atom become one of 480
    itemsize = 4 if dtype == "float32" else 8
    assert held["stored"] - held["recomputed"] >= (128 + 3 * 480) * len(atoms) * itemsize


def test_md_conserves_energy(sevennet0_path: Path, cu32: Atoms) -> None:
    """10 steps of velocity Verlet (1 fs) on 32 Cu atoms at ~300 K."""
    from ase.md.verlet import VelocityVerlet

    atoms = cu32.copy()
    calc = calculator(sevennet0_path)
    atoms.calc = calc
    masses = atoms.get_masses()[:, None]
    momenta = np.sqrt(masses * units.kB * 300.0) * np.random.default_rng(4).standard_normal(
        (len(atoms), 3)
    )
    momenta -= masses * momenta.sum(axis=0) / masses.sum()  # no net momentum
    atoms.set_momenta(momenta)
    totals = []

    def record() -> None:
        totals.append(atoms.get_potential_energy() + atoms.get_kinetic_energy())

    dyn = VelocityVerlet(atoms, timestep=1.0 * units.fs)
    dyn.attach(record, interval=1)
    dyn.run(10)
    totals = np.array(totals)
    assert len(totals) == 11
    assert atoms.get_kinetic_energy() > 0
    drift = np.abs(totals - totals[0]).max() / len(atoms)
    assert drift < 2e-4, f"total energy moved by {drift:.2e} eV/atom in 10 steps"
    assert calc.neighbors.num_builds <= 2  # atoms move ~0.05 A: the list is reused
    assert np.abs(atoms.get_momenta().sum(axis=0)).max() < 1e-10


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_repr(sevennet0_path: Path, dtype: str, device: str) -> None:
    calc = calculator(sevennet0_path, dtype, device)
    text = repr(calc)
    assert str(sevennet0_path) in text
    assert f"device {device}" in text
    assert f"precision {dtype}" in text
    assert calc.engine.device == device and calc.engine.precision == dtype


# --------------------------------------------------------------------------------------
# Model file and CLI
# --------------------------------------------------------------------------------------


def test_model_file_is_safetensors(model_name: str, model_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.numpy import load_file

    from e3fuse.convert.sevennet import resolve_checkpoint

    tensors = load_file(str(model_path))
    assert tensors["radial.coeffs"].dtype == np.float64
    assert tensors["scale"].shape == tensors["shift"].shape == (89,)
    with safe_open(str(model_path), framework="np") as f:
        metadata = f.metadata()
    architecture = json.loads(metadata[modelfile.METADATA_KEY])
    assert architecture == modelfile.read_architecture(model_path)
    assert architecture["format_version"] == modelfile.FORMAT_VERSION == _core.FORMAT_VERSION
    assert architecture["family"] == "sevennet"
    assert architecture["cutoff"] == 5.0
    assert len(architecture["layers"]) == 5
    checkpoint = resolve_checkpoint(model_name)
    source = architecture["source"]
    assert source["name"] == model_name and source["file"] == checkpoint.name
    assert source["sha256"] == hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    # every tensor the architecture names is in the file
    named = set(_tensor_names(architecture))
    assert named and named <= set(tensors)
    # the model's species follow the checkpoint's type map
    model = _core.Model.load(str(model_path))
    assert model.atomic_numbers == architecture["atomic_numbers"]
    assert model.format_version == architecture["format_version"]
    assert model.num_layers == len(architecture["layers"])
    assert json.loads(model.architecture_json) == architecture


def _tensor_names(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [
            name
            for key, value in node.items()
            for name in (
                [value]
                if key in ("weight", "coeffs", "exponents", "cg") and isinstance(value, str)
                else _tensor_names(value)
            )
        ]
    if isinstance(node, list):
        return [name for value in node for name in _tensor_names(value)]
    return []


def test_cli_info(sevennet0_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["info", str(sevennet0_path)]) == 0
    out = capsys.readouterr().out
    lines = {
        line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip()
        for line in out.splitlines()
        if ":" in line
    }
    assert lines["family"] == "sevennet"
    assert lines["layers"] == "5"
    assert lines["cutoff"].split()[0] in ("5", "5.0")
    assert "sha256=" in lines["source"] and "7net-0" in lines["source"]
    assert lines["elements"].startswith("89")


def test_model_loaded_once_shared(sevennet0_path: Path) -> None:
    """Engines share one immutable model; two precisions side by side agree."""
    model = _core.Model.load(str(sevennet0_path))
    e64 = _core.Engine(model, "cpu", "float64")
    e32 = _core.Engine(model, "cpu", "float32")
    positions = np.array([[0.0, 0.0, 0.0], [2.4, 0.3, 0.0], [0.2, 2.2, 0.4]])
    species = np.array([model.species_of(z) for z in (29, 28, 8)], dtype=np.int32)
    rows = np.array([0, 2, 4, 6], dtype=np.int64)
    nbrs = np.array([1, 2, 0, 2, 0, 1], dtype=np.int32)
    a = e64.compute_graph(positions, species, rows, nbrs)
    b = e32.compute_graph(positions, species, rows, nbrs)
    assert_abs(b["forces"], a["forces"], TOLERANCES["float32"].forces, "float32 vs float64")
    assert_abs(a["energies"].sum(), a["energy"], 1e-12, "energy sum")


def test_cli_convert(
    sevennet0_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`e3fuse convert` writes the file only after re-evaluating a structure with
    sevenn and e3fuse; converting twice gives the same model (up to the last bit
    of the spherical-harmonic coefficients, which are fitted by least squares)."""
    from safetensors.numpy import load_file

    output = tmp_path / "sub" / "7net-0.e3f"
    assert cli.main(["convert", "sevennet", "7net-0", "-o", str(output)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"verification on \d+ atoms .*max \|d forces\| = \S+", out), out
    assert f"wrote {output}" in out
    assert modelfile.read_architecture(output) == modelfile.read_architecture(sevennet0_path)
    ours, session = load_file(str(output)), load_file(str(sevennet0_path))
    assert ours.keys() == session.keys()
    for name in session:
        if name.startswith("sh."):
            np.testing.assert_allclose(ours[name], session[name], rtol=0, atol=1e-14, err_msg=name)
        else:
            np.testing.assert_array_equal(ours[name], session[name], err_msg=name)
    assert [p.name for p in output.parent.iterdir()] == ["7net-0.e3f"]  # no temporary left


def test_verify_detects_a_wrong_model(sevennet0_path: Path, tmp_path: Path) -> None:
    """The converter's check fails loudly when the file does not reproduce sevenn
    (here: one readout weight changed by one part in a million)."""
    from safetensors.numpy import load_file

    tensors = load_file(str(sevennet0_path))
    tensors["readout.1.path.0"] = tensors["readout.1.path.0"] * (1.0 + 1e-6)
    store = modelfile.TensorStore()
    for name, array in tensors.items():
        store.add(name, array, dtype=str(array.dtype))
    wrong = tmp_path / "wrong.e3f"
    modelfile.write_model_file(wrong, modelfile.read_architecture(sevennet0_path), store)
    with pytest.raises(RuntimeError, match="does NOT reproduce the source model"):
        cli.verify("sevennet", "7net-0", str(wrong), quiet=True)
