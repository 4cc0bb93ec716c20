"""Time of a total-charge switch with MACE-OMOL-0's architecture (random weights), CPU.

Builds tests/test_mace_omol_mh.py's OMOL-0 at a chosen width (1024 channels: the released
model; embeddings of the same size, edge irreps of 128) and number of elements, converts it,
and times on a 32-atom H/C/N/O molecule:
  step     one more evaluation at the same charge (engine, tables and neighbor list kept);
  rebuild  the switch as the Calculator made it before Engine.set_system_inputs:
           Model.with_system_inputs (a plan copy) + a new Engine + its first evaluation
           (which builds the radial tables of the species pairs it meets);
  switch   Engine.set_system_inputs + the evaluation (and set_system_inputs alone).
Usage: python benchmarks/system_inputs_switch.py [--channels 1024] [--elements 83]
       [--dtype float32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", type=int, default=1024)
    parser.add_argument("--elements", type=int, default=83, help="elements 1 .. N (>= 8)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()

    import test_mace_omol_mh as omol
    from e3nn import o3

    from e3fuse import _core
    from e3fuse.convert import mace as mace_convert

    c = args.channels
    options = dict(omol.ARCHS["omol0"])
    options.update(
        hidden=f"{c}x0e+{c}x1o+{c}x2e",
        edge_irreps=o3.Irreps("128x0e+128x1o+128x2e"),
        elements=tuple(range(1, args.elements + 1)),
        embedding_specs={name: dict(spec, emb_dim=c) for name, spec in omol.OMOL_SPECS.items()},
    )
    start = time.perf_counter()
    model = omol.build_mace(**options)
    with omol.torch.no_grad():
        for inter in model.interactions:
            inter.conv_tp_weights.net[-1].weight.mul_(omol.RADIAL_SCALE["omol0"])
            inter.conv_tp_weights.net[-1].bias.mul_(omol.RADIAL_SCALE["omol0"])
        for table in model.joint_embedding.embedders.values():
            table.weight.mul_(omol.EMBEDDING_SCALE)
    path = Path(tempfile.mkdtemp()) / "omol0.e3f"
    mace_convert.convert(model, path)
    del model
    built = time.perf_counter() - start

    atoms = omol.molecule(seed=5)
    file_model = _core.Model.load(str(path))
    zs = [int(z) for z in atoms.numbers]
    species = np.array([file_model.species_of(z) for z in zs], dtype=np.int32)
    positions = np.ascontiguousarray(atoms.positions)
    cell = np.zeros((3, 3))
    pbc = [False] * 3
    # OMOL-0's inputs in model order: spin, charge
    values = [[1.0, 0.0], [2.0, 1.0]]

    def evaluate(engine: object) -> float:
        return float(engine.compute_system(positions, species, cell, pbc)["energy"])

    def timed(fn) -> tuple[float, object]:
        t = time.perf_counter()
        out = fn()
        return time.perf_counter() - t, out

    def make_engine(v: list[float]) -> object:
        return _core.Engine(file_model.with_system_inputs(v), "cpu", args.dtype, args.threads)

    engine = make_engine(values[0])
    evaluate(engine)
    steps, rebuilds, switches, alone = [], [], [], []
    energies_rebuilt, energies_switched = [], []
    for r in range(args.repeats):
        steps.append(timed(lambda: evaluate(engine))[0])
        v = values[(r + 1) % 2]
        seconds, energy = timed(lambda v=v: evaluate(make_engine(v)))
        rebuilds.append(seconds)
        energies_rebuilt.append(energy)
        seconds, energy = timed(lambda v=v: (engine.set_system_inputs(v), evaluate(engine))[1])
        switches.append(seconds)
        # the switch alone, there and back
        alone.append(timed(lambda r=r: engine.set_system_inputs(values[r % 2]))[0])
        engine.set_system_inputs(v)
        energies_switched.append(energy)
    assert energies_rebuilt == energies_switched, (energies_rebuilt, energies_switched)
    result = {
        "channels": c,
        "elements": args.elements,
        "dtype": args.dtype,
        "atoms": len(atoms),
        "threads": args.threads,
        "build_and_convert_s": round(built, 1),
        "step_s": [round(s, 3) for s in steps],
        "rebuild_switch_s": [round(s, 3) for s in rebuilds],
        "set_system_inputs_switch_s": [round(s, 3) for s in switches],
        "set_system_inputs_alone_s": [round(s, 5) for s in alone],
        "engine": engine.describe(),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
