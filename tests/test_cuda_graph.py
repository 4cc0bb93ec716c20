"""CUDA graphs of compute_system (cuda/engine_cuda.cu, StepGraphs): on the GPU the device work
of a call is captured once per launch configuration and replayed while it stays. A replayed
call must give bitwise what the same call gives without graphs (E3FUSE_CUDA_GRAPH=0), over an
MD-like sequence that moves atoms with and without neighbor-list rebuilds, interleaves
energy-only, force and stress calls, changes species and the atom count; and errors (atoms
too close, coincident atoms, NaN positions) are still reported by replayed calls.

On the CPU the same sequences run (no graphs: num_graph_replays stays 0), which checks the
sequences themselves."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from ase import units
from conftest import DEVICES, STRUCTURES, ModelCache, calculator

from e3fuse import _core
from e3fuse._core import E3fuseError


@dataclasses.dataclass(frozen=True)
class Step:
    positions: np.ndarray
    species: np.ndarray
    cell: np.ndarray
    pbc: tuple[bool, bool, bool]
    forces: bool = True
    virial: bool = True
    atom_virials: bool = False


@pytest.fixture(scope="module")
def mace_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A MACE model with random weights: l = 2 features, correlation 3, a non-linear readout
    and ZBL pair repulsion (every kind of MACE launch in one graph)."""
    pytest.importorskip("mace.modules")
    from helpers_mace import build_mace

    from e3fuse.convert import mace as mace_convert

    model = build_mace(
        "16x0e+16x1o", elements=(8, 28, 29), r_max=4.5, correlation=3, pair_repulsion=True, seed=4
    )
    path = tmp_path_factory.mktemp("graph_mace") / "mace.e3f"
    mace_convert.convert(model, path)
    return path


@pytest.fixture(params=["7net-0", "mace"])
def graph_model_path(request: pytest.FixtureRequest, models: ModelCache) -> Path:
    if request.param == "mace":
        return Path(request.getfixturevalue("mace_path"))
    return models.path(request.param)


def md_like_steps(model: _core.Model) -> list[Step]:
    """22 calls on the 32-atom Cu/Ni/O alloy (skin 0.5 A): repeated and moved positions
    without a rebuild, energy-only / forces / stress / per-atom virial calls interleaved, a
    move past skin / 2 (rebuild), oxygen appearing (new species pairs: MACE's float32 radial
    tables grow), one atom fewer and back."""
    atoms = STRUCTURES["cunio_alloy"]()
    numbers = atoms.numbers.copy()
    oxygen = np.nonzero(numbers == 8)[0]
    assert len(oxygen) > 0
    without_oxygen = numbers.copy()
    without_oxygen[oxygen] = 29
    species_of = np.vectorize(model.species_of)
    first = species_of(without_oxygen).astype(np.int32)
    full = species_of(numbers).astype(np.int32)
    cell = np.array(atoms.cell.array)
    pbc = (True, True, True)
    rng = np.random.default_rng(11)

    def moved(p: np.ndarray, size: float = 0.04) -> np.ndarray:
        return p + rng.uniform(-size, size, p.shape)

    p0 = atoms.positions.copy()
    p1 = moved(p0)
    p2 = moved(p1)
    p3 = p2.copy()
    p3[0] += [0.4, 0.0, 0.0]  # past skin / 2: the list is rebuilt
    p4 = moved(p3)
    p5 = moved(p4)
    p6 = moved(p5)

    def at(p: np.ndarray, species: np.ndarray = first, **outputs: bool) -> Step:
        return Step(p, species, cell, pbc, **outputs)

    energy_only = {"forces": False, "virial": False}
    steps = [
        at(p0),
        at(p0),
        at(p0),
        at(p1),
        at(p1, **energy_only),
        at(p1, **energy_only),
        at(p2),
        at(p2, **energy_only),
        at(p2, virial=False),
        at(p3),
        at(moved(p3)),
        at(p4, atom_virials=True),
        at(p4, atom_virials=True),
        at(moved(p4), atom_virials=True),
        at(p5, full),
        at(p5, full),
        at(moved(p5), full),
    ]
    fewer = Step(p6[:-1], full[:-1], cell, pbc)
    steps += [fewer, fewer, dataclasses.replace(fewer, positions=moved(p6)[:-1])]
    steps += [at(p6, full), at(moved(p6), full)]
    return steps


def run(
    path: Path,
    device: str,
    dtype: str,
    graphs: bool,
    steps: list[Step],
    monkeypatch: pytest.MonkeyPatch,
    skin: float = 0.5,
    min_distance: float = 0.1,
) -> tuple[list[dict[str, np.ndarray] | str], int]:
    """Each step's results (or its error message) on a fresh engine, with CUDA graphs on or
    off, and the engine's number of replayed calls."""
    monkeypatch.setenv("E3FUSE_CUDA_GRAPH", "1" if graphs else "0")
    engine = _core.Engine(_core.Model.load(str(path)), device, dtype)
    engine.set_neighbor_skin(skin)
    engine.set_min_distance(min_distance)
    results: list[dict[str, np.ndarray] | str] = []
    for s in steps:
        try:
            out = engine.compute_system(
                s.positions,
                s.species,
                s.cell,
                list(s.pbc),
                forces=s.forces,
                virial=s.virial,
                atom_virials=s.atom_virials,
            )
            results.append({key: np.array(value) for key, value in out.items()})
        except E3fuseError as err:
            results.append(str(err))
    return results, int(engine.num_graph_replays)


def assert_bitwise_equal(
    got: list[dict[str, np.ndarray] | str], want: list[dict[str, np.ndarray] | str]
) -> None:
    assert len(got) == len(want)
    for step, (a, b) in enumerate(zip(got, want)):
        if isinstance(b, str) or isinstance(a, str):
            assert a == b, f"step {step}"
            continue
        assert a.keys() == b.keys(), f"step {step}"
        for key in b:
            assert np.array_equal(a[key], b[key]), f"step {step}: {key} differs"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("device", DEVICES)
def test_replayed_calls_equal_calls_without_graphs(
    graph_model_path: Path, device: str, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = md_like_steps(_core.Model.load(str(graph_model_path)))
    with_graphs, replays = run(graph_model_path, device, dtype, True, steps, monkeypatch)
    without, no_replays = run(graph_model_path, device, dtype, False, steps, monkeypatch)
    assert no_replays == 0
    assert all(not isinstance(r, str) for r in without), without
    assert_bitwise_equal(with_graphs, without)
    if device == "cuda":
        # replayed: steps 3, 4, 7, 8, 11, 14 and more; captured ones run as graphs too
        assert replays >= 6, f"only {replays} of {len(steps)} calls replayed a graph"
    else:
        assert replays == 0


def cluster(seed: int, n: int = 40) -> np.ndarray:
    """n atoms on a jittered simple-cubic grid of 2.4 A (open boundaries)."""
    rng = np.random.default_rng(seed)
    side = int(np.ceil(n ** (1 / 3)))
    grid = np.stack(np.meshgrid(*[np.arange(side)] * 3, indexing="ij"), -1).reshape(-1, 3)
    return grid[:n] * 2.4 + rng.uniform(-0.2, 0.2, (n, 3))


@pytest.mark.parametrize("device", DEVICES)
def test_errors_reported_by_replayed_calls(
    sevennet0_path: Path, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a 6 A skin, atom 1 moves next to atom 0 (0.3 A, below the 0.5 A minimum) and then
    onto it without a rebuild: those calls are replays of the graph of the calls before, and
    report the close pair (neighbor list's check, launched before the graph) and the
    coincident atoms (the convolution's check, inside the graph); NaN positions are refused
    before any device work. After each error the next call is right again."""
    model = _core.Model.load(str(sevennet0_path))
    p0 = cluster(seed=5)
    species = np.array([model.species_of(z) for z in (29, 28, 8)] * 14, dtype=np.int32)[:40]
    cell, pbc = np.eye(3) * 50.0, (False, False, False)
    toward_one = (p0[1] - p0[0]) / np.linalg.norm(p0[1] - p0[0])
    close, onto, nan = p0.copy(), p0.copy(), p0.copy()
    close[1] = p0[0] + 0.3 * toward_one
    onto[1] = p0[0]
    nan[5, 1] = np.nan
    steps = [Step(p, species, cell, pbc) for p in (p0, p0, p0, close, p0, nan, p0)]
    limits = {"skin": 6.0, "min_distance": 0.5}
    results, replays = run(sevennet0_path, device, "float32", True, steps, monkeypatch, **limits)
    without, _ = run(sevennet0_path, device, "float32", False, steps, monkeypatch, **limits)
    assert_bitwise_equal(results, without)
    assert "closer than the minimum" in str(results[3]), results[3]
    assert "not finite" in str(results[5]), results[5]
    assert not any(isinstance(r, str) for r in (results[4], results[6]))
    # min_distance 0: the coincident pair is found by the convolution itself
    onto_steps = [Step(p, species, cell, pbc) for p in (p0, p0, p0, onto, p0)]
    onto_results, onto_replays = run(
        sevennet0_path, device, "float32", True, onto_steps, monkeypatch, skin=6.0, min_distance=0
    )
    assert "same position" in str(onto_results[3]), onto_results[3]
    assert not isinstance(onto_results[4], str)
    assert np.array_equal(onto_results[4]["forces"], onto_results[2]["forces"])
    if device == "cuda":
        # calls 3, 4 and 6 (and the failing 4th of the first run) replay the graph of call 2
        assert replays >= 4, replays
        assert onto_replays >= 3, onto_replays


@pytest.mark.parametrize("device", DEVICES)
def test_md_trajectory_with_and_without_graphs(
    sevennet0_path: Path, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 steps of velocity Verlet through the ASE calculator with a 0.2 A skin (the list is
    rebuilt every few steps): bitwise the same trajectory with graphs as without."""
    from ase.md.verlet import VelocityVerlet

    trajectories, replays = {}, {}
    for graphs in (True, False):
        monkeypatch.setenv("E3FUSE_CUDA_GRAPH", "1" if graphs else "0")
        atoms = STRUCTURES["cu_bulk"]()
        # ~600 K: sqrt(kT / m) of Cu is 0.03 sqrt(eV / amu)
        atoms.set_velocities(np.random.default_rng(2).normal(0.0, 0.03, atoms.positions.shape))
        calc = calculator(sevennet0_path, "float32", device, skin=0.2)
        atoms.calc = calc
        frames = []
        dyn = VelocityVerlet(atoms, timestep=2.0 * units.fs)
        for _ in range(20):
            dyn.run(1)
            frames.append((atoms.positions.copy(), atoms.get_forces().copy()))
        trajectories[graphs] = frames
        replays[graphs] = int(calc.engine.num_graph_replays)
        builds = calc.neighbors.num_builds
    assert builds > 2, f"the list was rebuilt only {builds} times"
    for step, (a, b) in enumerate(zip(trajectories[True], trajectories[False])):
        assert np.array_equal(a[0], b[0]), f"step {step}: positions"
        assert np.array_equal(a[1], b[1]), f"step {step}: forces"
    assert replays[False] == 0
    if device == "cuda":
        assert replays[True] >= 10, replays[True]


def test_no_graphs_on_the_cpu(sevennet0_path: Path) -> None:
    calc = calculator(sevennet0_path, "float64", "cpu")
    atoms = STRUCTURES["cu_bulk"]()
    atoms.calc = calc
    for _ in range(3):
        calc.reset()
        atoms.get_forces()
    assert calc.engine.num_graph_replays == 0


@pytest.mark.parametrize("device", DEVICES)
def test_graphs_survive_calls_on_explicit_graphs(
    sevennet0_path: Path, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """compute_graph calls (LAMMPS's path: never a CUDA graph) on as many atoms between
    compute_system calls use the same device arrays; the compute_system calls after them
    still replay and still give what they give without graphs."""
    model = _core.Model.load(str(sevennet0_path))
    p0 = cluster(seed=8)
    species = np.array([model.species_of(z) for z in (29, 28, 8)] * 14, dtype=np.int32)[:40]
    distances = np.linalg.norm(p0[:, None] - p0[None], axis=-1)
    np.fill_diagonal(distances, np.inf)
    receivers, senders = np.nonzero(distances < model.cutoff)
    rows = np.concatenate([[0], np.cumsum(np.bincount(receivers, minlength=40))]).astype(np.int64)
    senders = senders.astype(np.int32)
    rng = np.random.default_rng(4)
    outcomes = {}
    for graphs in (True, False):
        monkeypatch.setenv("E3FUSE_CUDA_GRAPH", "1" if graphs else "0")
        engine = _core.Engine(model, device, "float32")
        results = []
        for step in range(8):
            positions = p0 + rng.uniform(-0.02, 0.02, p0.shape) if step % 2 else p0
            if step in (3, 6):
                results.append(engine.compute_graph(positions, species, rows, senders))
            results.append(engine.compute_system(positions, species, np.eye(3) * 50.0, [False] * 3))
        outcomes[graphs] = (results, int(engine.num_graph_replays))
        rng = np.random.default_rng(4)
    got, replays = outcomes[True]
    want, _ = outcomes[False]
    for step, (a, b) in enumerate(zip(got, want)):
        for key in b:
            assert np.array_equal(np.array(a[key]), np.array(b[key])), f"call {step}: {key}"
    if device == "cuda":
        assert replays >= 4, replays


@pytest.mark.parametrize("device", DEVICES)
def test_no_graphs_while_profiling(
    sevennet0_path: Path, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E3FUSE_PROFILE=1 times the stages with events between them: those calls run
    without graphs."""
    monkeypatch.setenv("E3FUSE_PROFILE", "1")
    model = _core.Model.load(str(sevennet0_path))
    engine = _core.Engine(model, device, "float32")
    positions = cluster(seed=2)
    species = np.full(40, model.species_of(29), dtype=np.int32)
    for _ in range(3):
        engine.compute_system(positions, species, np.eye(3) * 50.0, [False] * 3)
    assert engine.num_graph_replays == 0
    del engine
