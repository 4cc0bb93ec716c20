"""CUDA graphs of a step (StepGraph, kernels/src/cuda/engine_cuda.cu): a call that makes
exactly the launches of the call before replays them as one graph. A replay must give what
direct launches give, bitwise, while the atoms move within the skin, the elements change and the
kind of call changes (energy only, forces and stress, per-atom stresses); calls whose launches
differ run directly. The reference runs with the stage profiler on (E3FUSE_PROFILE), which
never captures a step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ase.calculators.calculator import all_changes
from conftest import STRUCTURES, calculator
from helpers_mace import converted_once

from e3fuse import _core

pytestmark = pytest.mark.skipif(
    not _core.cuda_available(), reason="e3fuse built without CUDA or no GPU"
)

FULL = ["energy", "energies", "forces", "stress"]
# (what changes before the step, the properties asked for)
STEPS: list[tuple[str, list[str]]] = [
    ("start", FULL),
    ("same", FULL),
    ("same", FULL),  # the third call with these launches: captured
    ("move", FULL),  # replayed from here on
    ("move", FULL),
    ("move", FULL),
    ("swap elements", FULL),
    ("move", FULL),
    *[("move", ["energy", "energies"])] * 4,  # other launches: directly, then captured
    *[("move", FULL + ["stresses"])] * 4,
    ("move", FULL),
]
# Replays at least: the 5 calls after the first capture, and 1 of each later run of 4 (its
# first call may allocate, which makes the second one's launches new as well)
MIN_REPLAYS = 7
_MACE: dict[str, tuple[Any, Path]] = {}


def run_steps(calc: Any, dtype: str) -> list[dict[str, np.ndarray]]:
    """The results of STEPS on one calculator: Cu/Ni/O moving by 0.02 A a step (well inside
    the skin: the neighbor list stays), two atoms swapping elements once."""
    atoms = STRUCTURES["cunio_alloy"]()
    rng = np.random.default_rng(11)
    results = []
    for change, properties in STEPS:
        if change == "move":
            atoms.positions += rng.uniform(-0.01, 0.01, atoms.positions.shape)
        elif change == "swap elements":
            numbers = atoms.numbers.copy()
            first, other = 0, int(np.nonzero(numbers != numbers[0])[0][0])
            numbers[[first, other]] = numbers[[other, first]]
            atoms.numbers = numbers
        calc.calculate(atoms, properties, all_changes)
        results.append({k: np.array(v, copy=True) for k, v in calc.results.items()})
    return results


def check_replays(path: Path, dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E3FUSE_PROFILE", "1")
    direct = calculator(path, dtype, "cuda")
    monkeypatch.delenv("E3FUSE_PROFILE")
    graphed = calculator(path, dtype, "cuda")
    expected = run_steps(direct, dtype)
    got = run_steps(graphed, dtype)
    for step, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert want.keys() == have.keys()
        for key in want:
            np.testing.assert_array_equal(have[key], want[key], err_msg=f"step {step}: {key}")
    assert direct.engine.num_step_replays == 0
    assert graphed.engine.num_step_replays >= MIN_REPLAYS
    assert graphed.engine.num_neighbor_builds == 1


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sevennet_replays_equal_direct_launches(
    model_path: Path, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_replays(model_path, dtype, monkeypatch)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_mace_replays_equal_direct_launches(
    dtype: str, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    workdir = tmp_path_factory.mktemp("step_graph")
    _, path = converted_once(_MACE, "graph", workdir, hidden="16x0e+16x1o", max_ell=2)
    check_replays(path, dtype, monkeypatch)
