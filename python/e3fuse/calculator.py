"""ASE calculator over the e3fuse core.

Stress follows ASE: eV/A^3, Voigt order (xx, yy, zz, yz, xz, xy), positive under
tension, stress = -virial / volume with the engine's virial
W = -sum_edges v (x) dE/dv (LAMMPS sign). Only fully periodic systems have stress."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from ase.calculators.calculator import Calculator as AseCalculator
from ase.calculators.calculator import PropertyNotImplementedError, all_changes

# The compiled core is imported where it is used, not here: converting a model on first use
# imports torch, which must come before the core (README, Known issue).

VOIGT = [(0, 0), (1, 1), (2, 2), (1, 2), (0, 2), (0, 1)]


class NeighborInfo:
    """Read-only view of the engine's neighbor list (built on the device it runs on)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    @property
    def num_builds(self) -> int:
        return int(self._engine.num_neighbor_builds)

    @property
    def num_edges(self) -> int:
        return int(self._engine.num_neighbor_edges)

    @property
    def skin(self) -> float:
        return float(self._engine.neighbor_skin)


class Calculator(AseCalculator):
    """e3fuse as an ASE calculator.

    Parameters
    ----------
    model: an .e3f file (see ``e3fuse convert``), or a model to convert on first use: a
        SevenNet pretrained name ("7net-0", "7net-l3i5", "7net-mf-0", ... as sevenn
        resolves them) or checkpoint file, or a mace-torch model file (saved with
        torch.save(model)). The conversion (torch and sevenn / mace-torch needed, verified
        against them as ``e3fuse convert`` does) is cached (``e3fuse.cache``: $E3FUSE_CACHE,
        else the user cache directory) and reused while the source file is unchanged.
    modal: the modality of a SevenNet multi-fidelity model (sevenn's name, e.g. "PBE").
    head: the head of a mace-torch multi-head model.
    device: "cpu" or "cuda".
    dtype: "float64" or "float32".
    skin: neighbor-list skin in Angstrom; the list is rebuilt only when an atom
        has moved more than skin / 2 (or the cell, periodicity or atom count changed).
    num_threads: CPU threads (0: OpenMP's default).
    min_distance: atoms closer than this (Angstrom) are refused as unphysical.
    radial: how the radial MLPs are evaluated: "mlp" (per edge, the model's layers),
        "table" (a cubic table in r built at load, error below float32 rounding) or
        "auto" (table in float32, mlp in float64).
    region_atoms: systems larger than this are evaluated region by region, each region
        with the atoms within num_layers x cutoff of it as ghosts (their work is the
        price; the results are those of one pass up to rounding). 0 (the default):
        automatic, on a GPU as many atoms per region as its free memory holds, on the CPU
        one pass. ``calc.engine.num_regions`` tells how many the last call used.

    Models with per-system inputs (MACE embedding_specs) read them from ``atoms.info``
    under mace's keys, with mace's defaults: total charge ``"charge"`` (0) and total spin
    ``"spin"`` (1); a change of them counts as a change of the system. Changing them
    switches the calculator's engine to the new values (``Engine.set_system_inputs``),
    which recomputes only the species embedding and reference energies: the engine,
    its radial tables and its neighbor list are kept.
    """

    implemented_properties = ["energy", "free_energy", "energies", "forces", "stress", "stresses"]

    def __init__(
        self,
        model: str | Path,
        device: str = "cpu",
        dtype: str = "float64",
        skin: float = 0.5,
        num_threads: int = 0,
        min_distance: float = 0.1,
        radial: str = "auto",
        region_atoms: int = 0,
        modal: str | None = None,
        head: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        from .model_source import resolve

        resolved = resolve(model, modal=modal, head=head)
        self.source = resolved.source  # what was passed; model_path: the .e3f loaded
        self.converted = resolved.converted
        self.model_path = str(resolved.path)
        from . import _core

        try:
            self.file_model = _core.Model.load(self.model_path)
        except _core.E3fuseError as err:
            if not resolved.converted:
                raise
            raise _core.E3fuseError(
                f"{err} (a conversion of {resolved.source!r} in e3fuse's cache: delete the file "
                "to convert again)"
            ) from err
        self._engine_args = (device, dtype, num_threads, radial)
        self._engine_settings = (float(skin), float(min_distance), int(region_atoms))
        # per-system inputs (MACE embedding_specs: total charge, spin) from atoms.info, with
        # mace's keys and defaults; the engine starts at the defaults and is switched to
        # other values in place (Engine.set_system_inputs)
        self.system_inputs = list(self.file_model.system_inputs)
        self._make_engine([default for _, _, default in self.system_inputs])
        self._species_key: bytes | None = None
        self._species = np.zeros(0, dtype=np.int32)

    def _make_engine(self, input_values: list[float]) -> None:
        if self.system_inputs:
            self.model = self.file_model.with_system_inputs(input_values)
        else:
            self.model = self.file_model
        from . import _core

        self.engine = _core.Engine(self.model, *self._engine_args)
        skin, min_distance, region_atoms = self._engine_settings
        self.engine.set_neighbor_skin(skin)
        self.engine.set_min_distance(min_distance)
        self.engine.region_atoms = region_atoms
        self.neighbors = NeighborInfo(self.engine)

    def _system_input_values(self, atoms: Any) -> list[float]:
        from ._core import E3fuseError

        values = []
        for name, key, default in self.system_inputs:
            value = atoms.info.get(key, default)
            try:
                values.append(float(value))
            except (TypeError, ValueError):
                raise E3fuseError(
                    f"atoms.info[{key!r}] ({name}) must be a number, got {value!r}"
                ) from None
        return values

    def check_state(self, atoms: Any, tol: float = 1e-15) -> list[str]:
        """ASE's changes, plus 'info' when a per-system input in atoms.info changed."""
        changes = super().check_state(atoms, tol)
        if self.system_inputs and self.atoms is not None and "info" not in changes:
            old = [self.atoms.info.get(key, default) for _, key, default in self.system_inputs]
            new = [atoms.info.get(key, default) for _, key, default in self.system_inputs]
            if old != new:
                changes.append("info")
        return changes

    def __repr__(self) -> str:
        converted = f" converted from {self.source!r}" if self.converted else ""
        return f"e3fuse.Calculator({self.model_path!r}{converted}: {self.engine.describe()})"

    def _species_of(self, numbers: np.ndarray) -> np.ndarray:
        from ._core import E3fuseError

        key = numbers.tobytes()
        if key != self._species_key:
            elements, inverse = np.unique(numbers, return_inverse=True)
            of_element = np.array([self.model.species_of(int(z)) for z in elements], dtype=np.int32)
            species = of_element[inverse.reshape(-1)]
            if (species < 0).any():
                from ase.data import chemical_symbols

                missing = sorted(
                    {
                        chemical_symbols[z] if 0 <= z < len(chemical_symbols) else str(z)
                        for z in numbers[species < 0]
                    }
                )
                raise E3fuseError(
                    f"element(s) {', '.join(missing)} not in the model {self.model_path!r}"
                )
            self._species, self._species_key = species, key
        return self._species

    def calculate(
        self,
        atoms: Any = None,
        properties: list[str] | None = None,
        system_changes: list[str] = all_changes,
    ) -> None:
        from ._core import E3fuseError

        properties = properties or ["energy"]
        super().calculate(atoms, properties, system_changes)
        atoms = self.atoms
        if len(atoms) == 0:
            raise E3fuseError("cannot evaluate an empty Atoms object")
        periodic = bool(atoms.pbc.all())
        if "stress" in properties and not periodic:
            raise PropertyNotImplementedError("stress is only defined for fully periodic systems")
        if self.system_inputs:
            values = self._system_input_values(atoms)
            if values != list(self.engine.system_input_values):
                self.engine.set_system_inputs(values)
        species = self._species_of(atoms.numbers)
        positions = np.ascontiguousarray(atoms.positions, dtype=np.float64)
        cell = np.ascontiguousarray(atoms.cell.array, dtype=np.float64)
        want_grad = any(p in properties for p in ("forces", "stress", "stresses"))
        # One call: positions in, results out; the engine keeps its neighbor list
        # (cutoff + skin) and rebuilds it only when needed.
        out = self.engine.compute_system(
            positions,
            species,
            cell,
            [bool(p) for p in atoms.pbc],
            forces=want_grad,
            virial=want_grad,
            atom_virials="stresses" in properties,
        )
        energy = float(out["energy"])
        self.results = {"energy": energy, "free_energy": energy, "energies": out["energies"]}
        if want_grad:
            self.results["forces"] = out["forces"]
        if periodic and want_grad:
            volume = abs(float(np.linalg.det(cell)))  # atoms.get_volume() without its rank check
            virial = out["virial"]
            self.results["stress"] = np.array([-virial[a, b] / volume for a, b in VOIGT])
            if "atom_virials" in out:
                av = out["atom_virials"].reshape(-1, 3, 3)
                self.results["stresses"] = np.stack(
                    [-av[:, a, b] / volume for a, b in VOIGT], axis=1
                )
