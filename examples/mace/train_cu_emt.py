"""Train a small MACE for copper on EMT data with mace-torch, convert it with e3fuse.

Everything is offline and seeded: the training set is generated here with ASE's EMT
calculator (rattled and strained fcc Cu supercells of 8-32 atoms, vacancies, (111) and
(100) slabs), E0 for Cu is EMT's isolated-atom energy, the model is a mace-torch
ScaleShiftMACE (32x0e, max_ell 2, correlation 3, 2 interactions, r_max 5 A)
trained with a plain Adam loop on energy/atom, forces and stress. The trained model
is saved with torch.save(model) and converted with `e3fuse convert mace`, which checks
the .e3f against mace-torch in float64 before writing it.

Usage (from the repository root, a few minutes on 2 CPU cores):
    PYTHONPATH=python python examples/mace/train_cu_emt.py \
        [--out examples/models/mace-cu-emt.e3f] [--epochs 40]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from ase import Atoms
from ase.build import bulk, fcc100, fcc111
from ase.calculators.emt import EMT

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent / "models" / "mace-cu-emt.e3f"
A_CU = 3.59  # EMT's lattice constant for Cu is ~3.59 A


# ------------------------------------------------------------------ data (EMT)


def _label(atoms: Atoms) -> Atoms:
    atoms.calc = EMT()
    e, f, s = atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress()
    atoms.calc = None
    atoms.info["REF_energy"] = float(e)
    atoms.info["REF_stress"] = np.asarray(s)
    atoms.arrays["REF_forces"] = np.asarray(f)
    return atoms


def _strained(atoms: Atoms, rng: np.random.Generator, strain: float) -> Atoms:
    eps = strain * rng.standard_normal((3, 3))
    atoms.set_cell(atoms.cell.array @ (np.eye(3) + 0.5 * (eps + eps.T)), scale_atoms=True)
    return atoms


def make_dataset(num: int, seed: int) -> list[Atoms]:
    """`num` labelled configurations: ~80 % rattled/strained bulk (8, 27 or 32 atoms,
    scaled lattice 0.96-1.05), ~10 % vacancies, ~10 % slabs with vacuum."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(num):
        kind = rng.random()
        if kind < 0.8:
            which = rng.integers(3)
            a = A_CU * rng.uniform(0.96, 1.05)
            if which == 0:
                atoms = bulk("Cu", "fcc", a=a).repeat((2, 2, 2))  # 8 atoms
            elif which == 1:
                atoms = bulk("Cu", "fcc", a=a).repeat((3, 3, 3))  # 27 atoms
            else:
                atoms = bulk("Cu", "fcc", a=a, cubic=True).repeat((2, 2, 2))  # 32 atoms
            atoms = _strained(atoms, rng, 0.02)
            rattle = rng.uniform(0.02, 0.15)
        elif kind < 0.9:
            a = A_CU * rng.uniform(0.98, 1.02)
            atoms = bulk("Cu", "fcc", a=a, cubic=True).repeat((2, 2, 2))
            del atoms[int(rng.integers(len(atoms)))]
            atoms = _strained(atoms, rng, 0.01)
            rattle = rng.uniform(0.02, 0.12)
        else:
            if rng.random() < 0.5:
                atoms = fcc111("Cu", size=(2, 2, 4), a=A_CU, vacuum=5.0, periodic=True)
            else:
                atoms = fcc100("Cu", size=(2, 2, 4), a=A_CU, vacuum=5.0, periodic=True)
            rattle = rng.uniform(0.02, 0.12)
        atoms.positions += rattle * rng.standard_normal(atoms.positions.shape)
        atoms.wrap()
        atoms.info["config_type"] = "Default"
        out.append(_label(atoms))
    return out


def isolated_atom_energy() -> float:
    atom = Atoms("Cu", positions=[[0.0, 0.0, 0.0]], cell=[20.0, 20.0, 20.0], pbc=False)
    atom.calc = EMT()
    return float(atom.get_potential_energy())


# ------------------------------------------------------------------ model and training


def to_loader(
    configs: list[Atoms], z_table, r_max: float, batch_size: int, shuffle: bool, seed: int
):
    from mace import data
    from mace.tools.torch_geometric.dataloader import DataLoader

    keys = data.KeySpecification(
        info_keys={"energy": "REF_energy", "stress": "REF_stress"},
        arrays_keys={"forces": "REF_forces"},
    )
    items = [
        data.AtomicData.from_config(
            data.config_from_atoms(a, key_specification=keys), z_table=z_table, cutoff=r_max
        )
        for a in configs
    ]
    gen = torch.Generator().manual_seed(seed)
    return DataLoader(items, batch_size=batch_size, shuffle=shuffle, drop_last=False, generator=gen)


def build_model(e0: float, train: list[Atoms], avg_num_neighbors: float, args):
    from e3nn import o3
    from mace import modules

    # Shift/scale as mace's "MeanStdAtomicEnergies"-style defaults: mean interaction
    # energy per atom and the RMS force component of the training set.
    inter = [(a.info["REF_energy"] - e0 * len(a)) / len(a) for a in train]
    forces = np.concatenate([a.arrays["REF_forces"].ravel() for a in train])
    shift, scale = float(np.mean(inter)), float(np.sqrt(np.mean(forces**2)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = modules.ScaleShiftMACE(
            r_max=args.r_max,
            num_bessel=8,
            num_polynomial_cutoff=5,
            max_ell=args.max_ell,
            interaction_cls=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
            interaction_cls_first=modules.interaction_classes["RealAgnosticInteractionBlock"],
            num_interactions=2,
            num_elements=1,
            hidden_irreps=o3.Irreps(args.hidden),
            MLP_irreps=o3.Irreps("16x0e"),
            atomic_energies=np.array([e0]),
            avg_num_neighbors=avg_num_neighbors,
            atomic_numbers=[29],
            correlation=args.correlation,
            gate=torch.nn.functional.silu,
            radial_MLP=[32, 32, 32],
            atomic_inter_scale=scale,
            atomic_inter_shift=shift,
        )
    return model, shift, scale


def predict(model, batch, training: bool):
    return model(batch.to_dict(), training=training, compute_force=True, compute_stress=True)


def loss_fn(out, batch, w_e: float, w_f: float, w_s: float):
    natoms = (batch.ptr[1:] - batch.ptr[:-1]).to(out["energy"].dtype)
    le = torch.mean(((out["energy"] - batch.energy) / natoms) ** 2)
    lf = torch.mean((out["forces"] - batch.forces) ** 2)
    ls = torch.mean((out["stress"] - batch.stress) ** 2)
    return w_e * le + w_f * lf + w_s * ls


def errors(model, loader) -> dict[str, float]:
    """RMSE of energy per atom (meV/atom), force components (meV/A), stress (meV/A^3)."""
    de, df, ds = [], [], []
    model.eval()
    for batch in loader:
        out = predict(model, batch, training=False)
        natoms = (batch.ptr[1:] - batch.ptr[:-1]).to(out["energy"].dtype)
        de.append(((out["energy"] - batch.energy) / natoms).detach())
        df.append((out["forces"] - batch.forces).detach().ravel())
        ds.append((out["stress"] - batch.stress).detach().ravel())
    rms = lambda xs: 1e3 * float(torch.sqrt(torch.mean(torch.cat(xs) ** 2)))  # noqa: E731
    return {"energy": rms(de), "forces": rms(df), "stress": rms(ds)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--train", type=int, default=100, help="training configurations")
    p.add_argument("--valid", type=int, default=25, help="validation configurations")
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument(
        "--energy-weight",
        type=float,
        default=100.0,
        help="loss weight of (energy/atom)^2; forces 10, stress 100 (eV, A units)",
    )
    p.add_argument("--hidden", default="32x0e")
    p.add_argument("--max-ell", type=int, default=2)
    p.add_argument("--correlation", type=int, default=3)
    p.add_argument("--r-max", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--dtype",
        default="float64",
        choices=["float32", "float64"],
        help="training dtype (the converter works in float64 either way)",
    )
    p.add_argument(
        "--keep-model",
        type=Path,
        default=None,
        help="also keep the mace-torch model file (torch.save(model))",
    )
    args = p.parse_args()

    from mace import tools
    from mace.modules.utils import compute_avg_num_neighbors

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.set_default_dtype(getattr(torch, args.dtype))

    t0 = time.perf_counter()
    configs = make_dataset(args.train + args.valid, seed=args.seed)
    train, valid = configs[: args.train], configs[args.train :]
    e0 = isolated_atom_energy()
    sizes = [len(a) for a in configs]
    print(
        f"EMT data: {len(train)} training + {len(valid)} validation configurations, "
        f"{min(sizes)}-{max(sizes)} atoms; E0(Cu) = {e0:.4f} eV "
        f"({time.perf_counter() - t0:.1f} s)",
        flush=True,
    )

    z_table = tools.get_atomic_number_table_from_zs([29])
    train_loader = to_loader(train, z_table, args.r_max, args.batch_size, True, args.seed)
    train_eval = to_loader(train, z_table, args.r_max, 16, False, args.seed)
    valid_loader = to_loader(valid, z_table, args.r_max, 16, False, args.seed)
    avg_nn = float(compute_avg_num_neighbors(train_eval))
    model, shift, scale = build_model(e0, train, avg_nn, args)
    nparams = sum(p.numel() for p in model.parameters())
    print(
        f"model: ScaleShiftMACE {args.hidden}, max_ell {args.max_ell}, correlation "
        f"{args.correlation}, 2 interactions, r_max {args.r_max}; {nparams} parameters; "
        f"avg_num_neighbors {avg_nn:.2f}, shift {shift:.4f} eV, scale {scale:.4f} eV/A",
        flush=True,
    )

    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, amsgrad=True)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=args.epochs, eta_min=args.lr * 0.02
    )
    w_e, w_f, w_s = args.energy_weight, 10.0, 100.0
    for epoch in range(1, args.epochs + 1):
        model.train()
        total = 0.0
        for batch in train_loader:
            optimizer.zero_grad()
            loss = loss_fn(predict(model, batch, training=True), batch, w_e, w_f, w_s)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            optimizer.step()
            total += float(loss.detach()) * batch.num_graphs
        schedule.step()
        if epoch % 5 == 0 or epoch == 1 or epoch == args.epochs:
            v = errors(model, valid_loader)
            print(
                f"epoch {epoch:4d}  loss {total / len(train):.3e}  valid RMSE: E "
                f"{v['energy']:.2f} meV/atom, F {v['forces']:.1f} meV/A, "
                f"stress {v['stress']:.2f} meV/A^3  ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )

    model.eval()
    tr, va = errors(model, train_eval), errors(model, valid_loader)
    print("final RMSE vs EMT (mace-torch, float64):")
    for name, r in (("train", tr), ("valid", va)):
        print(
            f"  {name:5s}: energy {r['energy']:.2f} meV/atom, forces {r['forces']:.1f} meV/A, "
            f"stress {r['stress']:.2f} meV/A^3"
        )

    from e3fuse import cli

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(args.keep_model) if args.keep_model else Path(tmp) / "mace-cu-emt.model"
        torch.save(model, source)
        rc = cli.main(["convert", "mace", str(source), "-o", str(args.out)])
        if rc != 0:
            raise SystemExit(rc)

    # The converted model against EMT on the validation set, through the ASE calculator.
    from e3fuse import Calculator

    for dtype in ("float64", "float32"):
        calc = Calculator(str(args.out), device="cpu", dtype=dtype)
        de, df = [], []
        for a in valid:
            b = a.copy()
            b.calc = calc
            de.append((b.get_potential_energy() - a.info["REF_energy"]) / len(b))
            df.append((b.get_forces() - a.arrays["REF_forces"]).ravel())
        print(
            f"e3fuse {dtype} on the validation set: energy RMSE "
            f"{1e3 * np.sqrt(np.mean(np.square(de))):.2f} meV/atom, forces RMSE "
            f"{1e3 * np.sqrt(np.mean(np.concatenate(df) ** 2)):.1f} meV/A"
        )
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
