"""pair_style e3fuse as a sub-style of `pair_style hybrid/overlay`, beside LAMMPS's
`dispersion/d3` (Grimme's D3, what MACE-MP and SevenNet users add) and `zbl` (a
short-range wall), and `lj/cut` (against ASE's SumCalculator).

The overlay's energy, per-atom energies (compute pe/atom), forces, virial (compute
pressure ... virial) and per-atom virials (compute stress/atom) must equal the sum of
the parts, each part computed by its own lmp run (e3fuse alone, the other style alone):
on one rank (comm images, the default there, and comm exchange) and two ranks (comm
exchange, the default there; comm shell once), on the CPU and with `device cuda`
(float64; skipped without a GPU). The e3fuse part itself equals e3fuse's Python engine.

Conventions (virial, stress, units) as in test_lammps.py. The model is a small MACE with
random weights (C, O, Ni, Cu; 2 layers, 4 A), so that every run takes a second or two.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ase import Atoms
from ase.data import atomic_numbers
from conftest import DEVICES, TOLERANCES, assert_abs, make_structure
from helpers_lammps import (
    RESULT_COMMANDS,
    lmp_binary,
    lmp_env,
    mpirun,
    parse_lmp,
    run_lmp,
    thermo_rows,
)
from test_lammps import (
    ANALYSIS,
    MACE_MODEL,
    PLUGIN,
    REPO,
    compare,
    lammps_frame,
    reference,
    structure_commands,
)

pytestmark = pytest.mark.lammps

TOL = TOLERANCES["float64"]
QUANTITIES = ("energy", "energies", "forces", "virial", "atom_virials")

# Grimme D3(BJ) with PBE parameters, as mace_mp(dispersion=True) and SevenNetD3Calculator
# use, but with short cutoffs (9 A pairs, 7 A coordination numbers) to keep the tests
# fast; the example in examples/lammps uses the packages' own cutoffs.
D3_STYLE = "dispersion/d3 bj pbe 9.0 7.0"
ZBL_STYLE = "zbl 1.8 2.6"  # switched off between 1.8 and 2.6 A: nearest neighbours feel it
LJ_STYLE = "lj/cut 6.0"


# --------------------------------------------------------------------------------------
# Model and structures
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mace.modules")
    from helpers_mace import build_mace

    from e3fuse.convert import mace as mace_convert

    mace = build_mace("8x0e+8x1o", elements=(6, 8, 28, 29), r_max=4.0, seed=23)
    path = tmp_path_factory.mktemp("hybrid") / "mace-cocuni.e3f"
    mace_convert.convert(mace, path)
    return path


def alloy() -> Atoms:
    """Cu/Ni/O in a strained triclinic cell (32 atoms, conftest's cunio_alloy), in
    LAMMPS's frame."""
    return lammps_frame(make_structure("cunio_alloy"))


def cu_bulk() -> Atoms:
    """108 rattled Cu atoms (conftest's cu_bulk_108), for the shipped Cu MACE model."""
    return lammps_frame(make_structure("cu_bulk_108"))


def alloy_with_short_pairs() -> Atoms:
    """The alloy with three pairs pulled to 1.0-1.3 A, where ZBL dominates."""
    atoms = alloy()
    direction = np.array([0.36, -0.48, 0.8])
    for i, j, r in ((0, 1, 1.0), (6, 7, 1.2), (9, 10, 1.3)):
        atoms.positions[j] = atoms.positions[i] + r * direction
    distances = atoms.get_all_distances(mic=True) + 10.0 * np.eye(len(atoms))
    assert distances.min() > 0.95
    return atoms


def slab() -> Atoms:
    """conftest's Cu(111) slab with an O adatom, periodic in x and y only."""
    return lammps_frame(make_structure("slab"))


def alloy_with_argon() -> Atoms:
    """The alloy with four Ar atoms appended (IDs 33-36), in the larger voids; Ar is
    not in the model: e3fuse maps its type to NULL, D3 covers it."""
    atoms = alloy()
    rng = np.random.default_rng(31)
    added = 0
    while added < 4:
        p = rng.uniform(0.0, 1.0, 3) @ atoms.cell.array
        probe = atoms + Atoms("Ar", positions=[p])
        if (probe.get_distances(len(atoms), range(len(atoms)), mic=True) > 1.6).all():
            atoms = probe
            added += 1
    return atoms


# --------------------------------------------------------------------------------------
# LAMMPS inputs: one helper for every combination of styles
# --------------------------------------------------------------------------------------


def types_of(atoms: Atoms) -> list[str]:
    """Element of each LAMMPS type, in order of first appearance."""
    return list(dict.fromkeys(atoms.get_chemical_symbols()))


def partner_coeffs(partner: str, elements: list[str], prefix: str) -> list[str]:
    """pair_coeff lines of dispersion/d3, zbl or lj/cut for these types; `prefix` is
    the sub-style name under hybrid/overlay, else empty."""
    name = partner.split()[0]
    if name == "dispersion/d3":
        return [f"pair_coeff * * {prefix}{' '.join(elements)}"]
    lines = []
    for i in range(1, len(elements) + 1):
        for j in range(i, len(elements) + 1):
            if name == "zbl":
                zi, zj = (atomic_numbers[elements[t - 1]] for t in (i, j))
                lines.append(f"pair_coeff {i} {j} {prefix}{zi} {zj}")
            else:  # lj/cut: weak, element-dependent parameters
                epsilon, sigma = 0.01 * (i + j), 2.0 + 0.1 * (i * j)
                lines.append(f"pair_coeff {i} {j} {prefix}{epsilon} {sigma}")
    return lines


def pair_lines(
    model: Path | None,
    partner: str | None,
    elements: list[str],
    e3fuse_elements: list[str] | None = None,
    style: str = "",
) -> list[str]:
    """e3fuse alone (partner None), the partner alone (model None), or both under
    hybrid/overlay. `style`: e3fuse's keywords (device, comm, ...)."""
    e3fuse_elements = e3fuse_elements or elements
    shift = ["pair_modify shift yes"] if partner and partner.startswith("lj/cut") else []
    if partner is None:
        assert model is not None
        return [
            f"pair_style e3fuse {style}".strip(),
            f"pair_coeff * * {model} {' '.join(e3fuse_elements)}",
        ]
    if model is None:
        return [f"pair_style {partner}", *partner_coeffs(partner, elements, ""), *shift]
    name = partner.split()[0]
    return [
        f"pair_style hybrid/overlay e3fuse {style} {partner}",
        f"pair_coeff * * e3fuse {model} {' '.join(e3fuse_elements)}",
        *partner_coeffs(partner, elements, f"{name} "),
        *(["pair_modify pair lj/cut shift yes"] if shift else []),
    ]


def input_text(atoms: Atoms, elements: list[str], pair: list[str], extra: list[str]) -> str:
    """run 0 with the analysis of test_lammps (pe/atom, stress/atom, pressure), a
    dump sorted by ID and a RESULT line."""
    lines = [
        *extra,
        *structure_commands(atoms, elements),
        f"plugin load {PLUGIN}",
        *pair,
        *ANALYSIS,
        *RESULT_COMMANDS,
    ]
    return "\n".join(lines) + "\n"


def run(
    workdir: Path,
    atoms: Atoms,
    elements: list[str],
    pair: list[str],
    ranks: int = 1,
    extra: list[str] | None = None,
) -> dict[str, np.ndarray]:
    if ranks > 1 and mpirun() is None:
        pytest.skip("no mpirun")
    proc = run_lmp(workdir, input_text(atoms, elements, pair, extra or []), ranks=ranks)
    got = parse_lmp(workdir, proc)
    got["log"] = proc.stdout  # type: ignore[assignment]
    return got


def pad(part: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
    """A part computed on the first atoms of a larger structure, zero for the rest."""
    out = dict(part)
    for key in ("energies", "forces", "atom_virials"):
        value = np.asarray(part[key])
        extra = np.zeros((n - value.shape[0], *value.shape[1:]))
        out[key] = np.concatenate([value, extra])
    return out


def assert_sum_of_parts(
    got: dict[str, np.ndarray],
    parts: list[dict[str, np.ndarray]],
    n: int,
    what: str,
    tol: Any = TOL,
) -> None:
    """float64 limits of conftest, relative to the size of each quantity where it is
    larger than 1 (ZBL forces reach ~100 eV/A): energy per atom and per-atom energies
    1e-12 eV, forces, virial per atom and per-atom virials 1e-10 eV/A (eV)."""
    limits = {
        "energy": tol.energy_per_atom * n,
        "energies": tol.energy_per_atom,
        "forces": tol.forces,
        "virial": tol.forces * n,
        "atom_virials": tol.forces,
    }
    report = []
    for key in QUANTITIES:
        expected = sum(np.asarray(p[key]) for p in parts)
        scale = max(1.0, float(np.abs(expected).max()))
        assert_abs(got[key], expected, limits[key] * scale, f"{what}: {key}")
        report.append(f"{key} {float(np.abs(got[key] - expected).max()):.1e}")
    print(f"\n{what}: overlay - sum of parts: " + ", ".join(report))


def device_style(device: str) -> str:
    return "device cuda precision float64" if device == "cuda" else ""


# --------------------------------------------------------------------------------------
# Sum of parts on 1 and 2 ranks
# --------------------------------------------------------------------------------------

CASES = {
    # name: (structure, partner style, shipped model instead of the random one)
    "d3 alloy": (alloy, D3_STYLE, False),
    "d3 slab": (slab, D3_STYLE, False),
    "zbl alloy": (alloy_with_short_pairs, ZBL_STYLE, False),
    "d3 cu bulk": (cu_bulk, D3_STYLE, True),  # the shipped Cu model, 108 atoms
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(CASES))
def test_overlay_is_sum_of_parts(model: Path, tmp_path: Path, case: str, device: str) -> None:
    """hybrid/overlay e3fuse + dispersion/d3 (a bulk alloy and a slab) and e3fuse + zbl
    (short pairs): one rank in comm images and comm exchange, two ranks in comm
    exchange: everything equals e3fuse alone + the partner alone."""
    make, partner, shipped = CASES[case]
    model = MACE_MODEL if shipped else model
    atoms = make()
    elements = types_of(atoms)
    n = len(atoms)
    style = device_style(device)
    e3fuse_pair = pair_lines(model, None, elements, style=style)
    e3fuse_part = run(tmp_path / "e3fuse", atoms, elements, e3fuse_pair)
    compare(e3fuse_part, reference(atoms, model), n, f"{case}: e3fuse part vs Python engine")
    partner_part = run(tmp_path / "partner", atoms, elements, pair_lines(None, partner, elements))
    # the partner is not negligible (D3 in the nearly perfect Cu bulk: forces ~6e-3 eV/A)
    assert np.abs(partner_part["forces"]).max() > 1e-3
    assert np.abs(partner_part["energies"]).max() > 1e-2
    for ranks, comm in ((1, ""), (1, "comm exchange"), (2, "")):
        workdir = tmp_path / f"overlay-np{ranks}-{comm.replace(' ', '-') or 'default'}"
        pair = pair_lines(model, partner, elements, style=f"{style} {comm}".strip())
        start = time.perf_counter()
        got = run(workdir, atoms, elements, pair, ranks=ranks)
        expected_mode = "comm exchange" if (ranks > 1 or comm) else "comm images"
        assert expected_mode in str(got["log"])
        label = f"{case} ({device}) np {ranks} {expected_mode}"
        print(f"\n{label}: {time.perf_counter() - start:.1f} s")
        assert_sum_of_parts(got, [e3fuse_part, partner_part], n, label)


def test_overlay_comm_buffers(tmp_path: Path) -> None:
    """Regression: hybrid copies its sub-styles' comm_forward/comm_reverse at pair_style
    time, before pair_coeff loads e3fuse's model, and LAMMPS sizes its communication
    buffers from the hybrid style's values; e3fuse's halo exchange (32 values per atom
    here) overran them and this input, a 108-atom Cu crystal with the shipped model and
    D3, ended in SIGSEGV with comm exchange on 1 rank. Now the energy and pressure
    equal those of comm images, on 1 and 2 ranks."""
    text = "\n".join(
        [
            "units metal",
            "atom_style atomic",
            "boundary p p p",
            "lattice fcc 3.615",
            "region box block 0 3 0 3 0 3",
            "create_box 1 box",
            "create_atoms 1 box",
            "mass 1 63.546",
            "displace_atoms all random 0.1 0.1 0.1 1234",
            f"plugin load {PLUGIN}",
            "pair_style hybrid/overlay e3fuse ${comm} dispersion/d3 bj pbe 9.0 7.0",
            f"pair_coeff * * e3fuse {MACE_MODEL} Cu",
            "pair_coeff * * dispersion/d3 Cu",
            "compute pe all pe/atom",
            "compute s all stress/atom NULL virial",
            "compute vir all pressure NULL virial",
            "thermo_style custom step pe press c_vir[1] c_vir[4]",
            "thermo_modify format float %.17g",
            "run 0",
            'print "RESULT $(pe:%.17g) $(c_vir[1]:%.17g) $(c_vir[4]:%.17g) $(c_vir[6]:%.17g)"',
        ]
    )
    results = {}
    for ranks, comm in ((1, "comm images"), (1, "comm exchange"), (2, "comm exchange")):
        if ranks > 1 and mpirun() is None:
            pytest.skip("no mpirun")
        command = [str(lmp_binary()), "-var", "comm", comm]
        workdir = tmp_path / f"np{ranks}-{comm.split()[1]}"
        proc = run_lmp(workdir, text + "\n", ranks=ranks, command=command, timeout=120)
        assert proc.returncode == 0, (
            f"np {ranks} {comm}: lmp exited with {proc.returncode}\n{proc.stdout[-2000:]}"
        )
        line = next(s for s in proc.stdout.splitlines() if s.startswith("RESULT "))
        results[(ranks, comm)] = np.array([float(v) for v in line.split()[1:]])
    images = results[(1, "comm images")]
    for key, values in results.items():
        assert_abs(values, images, 1e-9 * np.abs(images).max(), f"np {key[0]} {key[1]}")


def test_overlay_comm_shell_two_ranks(model: Path, tmp_path: Path) -> None:
    """comm shell (graph over locals and a 2 x 4 A ghost shell) under hybrid/overlay with
    dispersion/d3, two ranks: the sum of the parts."""
    atoms = slab()
    elements = types_of(atoms)
    e3fuse_part = run(tmp_path / "e3fuse", atoms, elements, pair_lines(model, None, elements))
    d3_part = run(tmp_path / "d3", atoms, elements, pair_lines(None, D3_STYLE, elements))
    pair = pair_lines(model, D3_STYLE, elements, style="comm shell")
    got = run(tmp_path / "overlay", atoms, elements, pair, ranks=2)
    assert "comm shell" in str(got["log"])
    assert_sum_of_parts(got, [e3fuse_part, d3_part], len(atoms), "d3 slab np 2 comm shell")


@pytest.mark.parametrize("device", DEVICES)
def test_overlay_with_null_type(model: Path, tmp_path: Path, device: str) -> None:
    """Ar is not in the model: `pair_coeff * * e3fuse model.e3f Cu Ni O NULL`, D3 on every
    type. hybrid gives e3fuse a skip list without the Ar atoms; the overlay equals
    e3fuse on the alloy without Ar (zero on Ar) + D3 on everything, on 1 and 2 ranks."""
    atoms = alloy_with_argon()
    n = len(atoms)
    base = atoms[: n - 4]
    elements = types_of(atoms)
    assert elements[-1] == "Ar"
    e3fuse_elements = [*elements[:-1], "NULL"]
    style = device_style(device)
    base_types = types_of(base)
    e3fuse_pair = pair_lines(model, None, base_types, style=style)
    e3fuse_part = run(tmp_path / "e3fuse", base, base_types, e3fuse_pair)
    compare(e3fuse_part, reference(base, model), len(base), "e3fuse part (no Ar) vs Python engine")
    d3_part = run(tmp_path / "d3", atoms, elements, pair_lines(None, D3_STYLE, elements))
    for ranks in (1, 2):
        pair = pair_lines(model, D3_STYLE, elements, e3fuse_elements, style=style)
        got = run(tmp_path / f"overlay-np{ranks}", atoms, elements, pair, ranks=ranks)
        label = f"d3 + NULL type ({device}) np {ranks}"
        assert_sum_of_parts(got, [pad(e3fuse_part, n), d3_part], n, label)


def test_radial_tabulated_under_hybrid(model: Path, tmp_path: Path) -> None:
    """`radial table` would make hybrid start a `table` sub-style at the word "table";
    `radial tabulated` is the same setting under another name."""
    atoms = alloy()
    elements = types_of(atoms)
    plain = run(
        tmp_path / "plain",
        atoms,
        elements,
        pair_lines(model, None, elements, style="precision float32 radial table"),
    )
    pair = pair_lines(model, D3_STYLE, elements, style="precision float32 radial tabulated")
    d3_part = run(tmp_path / "d3", atoms, elements, pair_lines(None, D3_STYLE, elements))
    got = run(tmp_path / "overlay", atoms, elements, pair)
    assert "radial table" in str(got["log"])  # the engine's description in the log
    # two float32 evaluations agree to float32 rounding, not bitwise
    float32 = TOLERANCES["float32"]
    assert_sum_of_parts(got, [plain, d3_part], len(atoms), "radial tabulated", float32)


# --------------------------------------------------------------------------------------
# A few MD steps: 2 ranks follow 1 rank
# --------------------------------------------------------------------------------------


def nve_rows(workdir: Path, atoms: Atoms, pair: list[str], ranks: int) -> np.ndarray:
    elements = types_of(atoms)
    lines = [
        *structure_commands(atoms, elements),
        f"plugin load {PLUGIN}",
        *pair,
        "neigh_modify every 1 delay 0 check no",
        "velocity all create 1200 4928459 mom yes rot no dist gaussian",
        "timestep 0.001",
        "fix nve all nve",
        "thermo 2",
        "thermo_style custom step temp pe ke etotal press",
        "thermo_modify format float %.15g",
        "run 10",
    ]
    if ranks > 1 and mpirun() is None:
        pytest.skip("no mpirun")
    workdir.mkdir(parents=True, exist_ok=True)
    proc = run_lmp(workdir, "\n".join(lines) + "\n", ranks=ranks, env=lmp_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return thermo_rows(proc.stdout)


def test_overlay_nve_ranks_agree(model: Path, tmp_path: Path) -> None:
    """10 NVE steps of e3fuse + D3 with neighbor lists, ghosts and send lists rebuilt at
    every step: 2 ranks (comm exchange) follow the one-rank trajectory (temperature,
    energies, pressure at every other step)."""
    atoms = alloy()
    pair = pair_lines(model, D3_STYLE, types_of(atoms))
    one = nve_rows(tmp_path / "np1", atoms, pair, 1)
    two = nve_rows(tmp_path / "np2", atoms, pair, 2)
    assert one.shape == two.shape and one[-1, 0] == 10
    difference = np.abs(two[:, 1:] - one[:, 1:]) / np.abs(one[:, 1:]).clip(1e-3)
    print(f"\nNVE e3fuse + D3, np 2 vs np 1: max relative difference {difference.max():.1e}")
    assert difference.max() < 1e-10


# --------------------------------------------------------------------------------------
# ASE's SumCalculator against LAMMPS's hybrid/overlay (the same LJ on both sides)
# --------------------------------------------------------------------------------------


def test_ase_sum_calculator_matches_overlay(model: Path, tmp_path: Path) -> None:
    """SumCalculator([e3fuse.Calculator, LennardJones]) in ASE and hybrid/overlay
    e3fuse + lj/cut (shifted to zero at the cutoff, as ASE's) in LAMMPS, on one
    element pair so that one set of LJ parameters applies: energy, per-atom energies,
    forces and stress agree."""
    from ase.calculators.lj import LennardJones
    from ase.calculators.mixing import SumCalculator

    import e3fuse

    atoms = alloy()
    atoms.numbers[:] = 29
    elements = types_of(atoms)
    epsilon, sigma = 0.02, 2.1  # the lj/cut coefficients partner_coeffs gives type 1-1
    got = run(tmp_path / "overlay", atoms, elements, pair_lines(model, LJ_STYLE, elements))
    calc = SumCalculator(
        [
            e3fuse.Calculator(model, device="cpu", dtype="float64"),
            LennardJones(epsilon=epsilon, sigma=sigma, rc=6.0, smooth=False),
        ]
    )
    atoms.calc = calc
    n = len(atoms)
    assert_abs(atoms.get_potential_energy(), got["energy"], TOL.energy_per_atom * n, "energy")
    assert_abs(atoms.get_potential_energies(), got["energies"], TOL.energy_per_atom, "energies")
    assert_abs(atoms.get_forces(), got["forces"], TOL.forces, "forces")
    w = got["virial"]  # xx yy zz xy xz yz (eV)
    stress = -np.array([w[0], w[1], w[2], w[5], w[4], w[3]]) / atoms.get_volume()
    assert_abs(atoms.get_stress(), stress, TOL.stress, "stress")


# --------------------------------------------------------------------------------------
# The examples (examples/lammps/in.graphite_d3, in.cu_zbl) run, briefly
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("example", ["in.graphite_d3", "in.cu_zbl"])
def test_examples_run(model: Path, tmp_path: Path, example: str, ranks: int) -> None:
    """Each example, 4 steps with the small random model in a small cell (the plugin
    found through LAMMPS_PLUGIN_PATH, as with an installed e3fuse): it runs, and at
    every thermo step pe = c_model + the other style's compute pair."""
    if ranks > 1 and mpirun() is None:
        pytest.skip("no mpirun")
    text = (REPO / "examples" / "lammps" / example).read_text()
    text = text.replace("thermo          10", "thermo          1")
    variables = {"model": str(model), "steps": "4", "n": "2"}
    if example == "in.graphite_d3":
        variables.update(m="1", d3_cutoff="10.0", cn_cutoff="8.0")
    command = [str(lmp_binary())]
    for name, value in variables.items():
        command += ["-var", name, value]
    env = lmp_env(LAMMPS_PLUGIN_PATH=str(PLUGIN.parent))
    proc = run_lmp(tmp_path, text, ranks=ranks, env=env, command=command)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["Step"])
    names = lines[header].split()
    rows = []
    for line in lines[header + 1 :]:
        if line.startswith("Loop"):
            break
        rows.append([float(w) for w in line.split()])
    table = dict(zip(names, np.array(rows).T))
    assert table["Step"][-1] == 4
    other = table["c_d3"] if example == "in.graphite_d3" else table["c_zbl"]
    if example == "in.graphite_d3":  # (the knock-on atom meets no neighbor in 4 steps)
        assert np.abs(other).max() > 0.0
    # thermo prints 8 significant digits
    pe = table["PotEng"]
    limit = 1e-6 * max(1.0, float(np.abs(pe).max()))
    assert_abs(pe, table["c_model"] + other, limit, "pe = c_model + the other part")
