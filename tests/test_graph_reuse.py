"""GraphView::same_edges_as_last, what LAMMPS's comm exchange promises between
reneighborings: the graph (every pair within cutoff + skin) is the one of the engine's last
call and only the positions moved. The engine then neither checks the edges again nor, on
the GPU, copies them again; it must give what a fresh engine gives on the same arrays, and
take the promise only where the node and edge counts are those of its last graph."""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

import numpy as np
import pytest
from conftest import DEVICES

from e3fuse import _core
from e3fuse._core import E3fuseError


def cluster(seed: int, n: int = 40) -> np.ndarray:
    """n atoms on a jittered simple-cubic grid of 2.4 A (a cluster: the graph is open)."""
    rng = np.random.default_rng(seed)
    side = int(np.ceil(n ** (1 / 3)))
    grid = np.stack(np.meshgrid(*[np.arange(side)] * 3, indexing="ij"), -1).reshape(-1, 3)
    return grid[:n] * 2.4 + rng.uniform(-0.2, 0.2, (n, 3))


def pairs_within(positions: np.ndarray, reach: float) -> np.ndarray:
    """Which pairs are closer than `reach` (a symmetric boolean matrix)."""
    d = np.linalg.norm(positions[:, None] - positions[None], axis=-1)
    np.fill_diagonal(d, np.inf)
    return d < reach


def csr(adjacent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Receiver-sorted CSR rows of a symmetric adjacency matrix."""
    receivers, senders = np.nonzero(adjacent)
    rows = np.zeros(len(adjacent) + 1, dtype=np.int64)
    np.add.at(rows, receivers + 1, 1)
    return np.cumsum(rows), senders.astype(np.int32)


def engine_for(path: Path, device: str, dtype: str) -> tuple[object, np.ndarray]:
    model = _core.Model.load(str(path))
    species = np.array([model.species_of(z) for z in (29, 28, 8)] * 14, dtype=np.int32)[:40]
    return _core.Engine(model, device, dtype), species


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("device", DEVICES)
def test_kept_graph_equals_fresh_engine(sevennet0_path: Path, device: str, dtype: str) -> None:
    """Five steps on one graph built with a 1 A skin, atoms moving up to 0.3 A from where
    it was built: each hinted call equals a fresh engine's call on the same arrays."""
    kept, species = engine_for(sevennet0_path, device, dtype)
    start = cluster(seed=5)
    cutoff = _core.Model.load(str(sevennet0_path)).cutoff
    rows, neighbors = csr(pairs_within(start, cutoff + 1.0))
    skin_edges = int(pairs_within(start, cutoff + 1.0).sum() - pairs_within(start, cutoff).sum())
    assert skin_edges > 0
    kept.compute_graph(start, species, rows, neighbors, atom_virials=True)
    rng = np.random.default_rng(7)
    for step in range(5):
        positions = start + rng.uniform(-0.3, 0.3, start.shape)
        got = kept.compute_graph(
            positions, species, rows, neighbors, atom_virials=True, same_edges_as_last=True
        )
        fresh, _ = engine_for(sevennet0_path, device, dtype)
        want = fresh.compute_graph(positions, species, rows, neighbors, atom_virials=True)
        for key in ("energy", "energies", "forces", "virial", "atom_virials"):
            assert np.array_equal(got[key], want[key]), (step, key)


@pytest.mark.parametrize("device", DEVICES)
def test_promise_taken_only_for_the_last_graph(sevennet0_path: Path, device: str) -> None:
    """A hinted graph with other counts than the engine's last one is checked and copied as
    new (its out-of-range neighbor is found), and after a compute_system (the engine's own
    list) no earlier graph counts as the last one."""
    engine, species = engine_for(sevennet0_path, device, "float64")
    positions = cluster(seed=3)
    cutoff = _core.Model.load(str(sevennet0_path)).cutoff
    adjacent = pairs_within(positions, cutoff + 0.5)
    rows, neighbors = csr(adjacent)
    engine.compute_graph(positions, species, rows, neighbors)
    fewer_rows, fewer = csr(pairs_within(positions, cutoff))
    broken = fewer.copy()
    broken[0] = 40
    with pytest.raises(E3fuseError, match="out of range"):
        engine.compute_graph(positions, species, fewer_rows, broken, same_edges_as_last=True)

    engine.compute_graph(positions, species, rows, neighbors)
    engine.compute_system(positions, species, np.eye(3) * 50.0, [False] * 3)
    # same node and edge counts as the first graph, other edges: the pair (0, a) replaced by
    # (1, b), b not a neighbor of 1
    a = int(np.nonzero(adjacent[0])[0][0])
    b = int(next(j for j in range(2, 40) if not adjacent[1, j]))
    changed = adjacent.copy()
    changed[0, a] = changed[a, 0] = False
    changed[1, b] = changed[b, 1] = True
    other_rows, other = csr(changed)
    assert len(other) == len(neighbors)
    got = engine.compute_graph(positions, species, other_rows, other, same_edges_as_last=True)
    fresh, _ = engine_for(sevennet0_path, device, "float64")
    want = fresh.compute_graph(positions, species, other_rows, other)
    assert np.array_equal(got["forces"], want["forces"])
    first = fresh.compute_graph(positions, species, rows, neighbors)
    assert not np.array_equal(first["forces"], want["forces"])  # the graphs differ


# --------------------------------------------------------------------------------------
# Engine::compute(NodesView): the engine finds the edges of owned nodes and ghosts itself
# (pair_style e3fuse comm exchange) and keeps them while the caller promises the same nodes
# --------------------------------------------------------------------------------------

OWNED = 25  # of the 40 cluster atoms; the others are ghosts
SKIN = 1.0


def owned_pairs_within(positions: np.ndarray, reach: float, owned: int) -> np.ndarray:
    """pairs_within without the ghost-ghost pairs (nodes past `owned` are ghosts)."""
    adjacent = pairs_within(positions, reach)
    adjacent[owned:, owned:] = False
    return adjacent


def node_engine(path: Path, device: str, dtype: str) -> tuple[object, np.ndarray]:
    engine, species = engine_for(path, device, dtype)
    engine.set_neighbor_skin(SKIN)
    return engine, species


@pytest.mark.parametrize("owned", [OWNED, 40, 0])
@pytest.mark.parametrize("device", DEVICES)
def test_node_graph_edges(sevennet0_path: Path, device: str, owned: int) -> None:
    """The edges found are the pairs closer than cutoff + skin with an owned node at one end
    (no ghost-ghost pairs), in symmetric CSR rows; on the CPU each row sorted by sender."""
    engine, species = node_engine(sevennet0_path, device, "float64")
    positions = cluster(seed=11)
    cutoff = _core.Model.load(str(sevennet0_path)).cutoff
    engine.compute_nodes(positions, species, num_owned=owned)
    rows, neighbors = engine.node_graph()
    assert engine.num_neighbor_edges == len(neighbors)
    found = np.zeros((40, 40), dtype=bool)
    for i in range(40):
        row = neighbors[rows[i] : rows[i + 1]]
        assert len(set(row.tolist())) == len(row)
        if device == "cpu":
            assert np.all(np.diff(row) > 0)
        found[i, row] = True
    assert np.array_equal(found, owned_pairs_within(positions, cutoff + SKIN, owned))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("device", DEVICES)
def test_node_graph_equals_explicit_graph(sevennet0_path: Path, device: str, dtype: str) -> None:
    """compute_nodes on 25 owned nodes and 15 ghosts, then four steps with the nodes promised
    the same and atoms moving up to 0.43 A (below skin / 2): the edges are found once, and
    every step equals a fresh engine's compute_graph on the graph they form, bitwise (the
    CPU rows are the numpy CSR's, sorted by sender). A step without the promise, and one
    that moves an atom past skin / 2 with it, find them again."""
    kept, species = node_engine(sevennet0_path, device, dtype)
    start = cluster(seed=5)
    rng = np.random.default_rng(9)
    for step in range(5):
        positions = start + (rng.uniform(-0.25, 0.25, start.shape) if step else 0.0)
        got = kept.compute_nodes(
            positions, species, num_owned=OWNED, atom_virials=True, same_nodes_as_last=step > 0
        )
        assert kept.num_neighbor_builds == 1, step
        rows, neighbors = kept.node_graph()
        if device == "cpu":
            cutoff = _core.Model.load(str(sevennet0_path)).cutoff
            want_rows, want_neighbors = csr(owned_pairs_within(start, cutoff + SKIN, OWNED))
            assert np.array_equal(rows, want_rows) and np.array_equal(neighbors, want_neighbors)
        fresh, _ = engine_for(sevennet0_path, device, dtype)
        want = fresh.compute_graph(
            positions, species, rows, neighbors, num_energy_nodes=OWNED, atom_virials=True
        )
        for key in ("energy", "energies", "forces", "virial", "atom_virials"):
            assert np.array_equal(got[key], want[key]), (step, key)
    kept.compute_nodes(positions, species, num_owned=OWNED)
    assert kept.num_neighbor_builds == 2
    moved = positions.copy()
    moved[3] += [0.6, 0.0, 0.0]
    kept.compute_nodes(moved, species, num_owned=OWNED, same_nodes_as_last=True)
    assert kept.num_neighbor_builds == 3
    # other counts than the last call's: the promise is not taken
    kept.compute_nodes(positions, species, num_owned=OWNED - 1, same_nodes_as_last=True)
    assert kept.num_neighbor_builds == 4


@pytest.mark.parametrize("device", DEVICES)
def test_nodes_all_owned_equal_the_open_system(sevennet0_path: Path, device: str) -> None:
    """Every node owned: the open cluster, as compute_system evaluates it with its own list."""
    engine, species = node_engine(sevennet0_path, device, "float64")
    positions = cluster(seed=2)
    got = engine.compute_nodes(positions, species, atom_virials=True)
    system, _ = node_engine(sevennet0_path, device, "float64")
    want = system.compute_system(
        positions, species, np.eye(3) * 50.0, [False] * 3, atom_virials=True
    )
    for key in ("energies", "forces", "virial", "atom_virials"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-12, atol=1e-12, err_msg=key)
    assert abs(got["energy"] - want["energy"]) < 1e-10


def test_nodes_bad_counts(sevennet0_path: Path) -> None:
    engine, species = node_engine(sevennet0_path, "cpu", "float64")
    with pytest.raises(E3fuseError, match="num_owned"):
        engine.compute_nodes(cluster(seed=1), species, num_owned=41)


def periodic_nodes(positions: np.ndarray, length: float, reach: float) -> tuple[np.ndarray, ...]:
    """The atoms of a cubic periodic cell as owned nodes and, as ghosts, their images
    closer than `reach` to the box around them (what comm exchange gives one rank that
    owns the whole cell): (owners of the ghosts, their image shifts)."""
    lo, hi = positions.min(0), positions.max(0)
    owners, shifts = [], []
    for shift in itertools.product((-1, 0, 1), repeat=3):
        if shift == (0, 0, 0):
            continue
        image = positions + np.array(shift) * length
        away = np.maximum(np.maximum(lo - image, 0.0), image - hi)
        near = np.nonzero((away**2).sum(1) < reach**2)[0]
        owners.append(near)
        shifts.append(np.tile(np.array(shift) * length, (len(near), 1)))
    return np.concatenate(owners).astype(np.int32), np.concatenate(shifts)


PERIODIC_LENGTH = 9.6  # A: the cubic cell of the periodic-node tests


def periodic_cell(path: Path, device: str) -> tuple[object, np.ndarray, np.ndarray, np.ndarray]:
    """A 40-atom cubic cell of PERIODIC_LENGTH that one rank owns whole: an engine that
    evaluates it as a periodic system (float64), the positions, and periodic_nodes' ghosts
    within cutoff + skin (owners, shifts)."""
    system, _ = node_engine(path, device, "float64")
    positions = cluster(seed=4)
    cutoff = _core.Model.load(str(path)).cutoff
    owners, shifts = periodic_nodes(positions, PERIODIC_LENGTH, cutoff + SKIN)
    return system, positions, owners, shifts


def periodic_reference(system: object, positions: np.ndarray, species: np.ndarray) -> dict:
    """compute_system of the periodic cell, per-atom virials included."""
    cell = np.eye(3) * PERIODIC_LENGTH
    return system.compute_system(positions, species, cell, [True] * 3, atom_virials=True)


def fold(values: np.ndarray, owners: np.ndarray, n: int) -> np.ndarray:
    """Per-node values of owned nodes plus those of their ghosts (reverse communication)."""
    folded = values[:n].copy()
    np.add.at(folded, owners, values[n:])
    return folded


@pytest.mark.parametrize("device", DEVICES)
def test_nodes_with_halo_equal_the_periodic_system(sevennet0_path: Path, device: str) -> None:
    """One rank owning a whole periodic cell (40 atoms, 9.6 A) with its periodic images as
    ghosts and a halo exchange in the process: compute_nodes gives compute_system's
    energies, forces, virial and per-atom virials once the ghosts' forces and virials are
    added to their owners, to float64 rounding; over three steps with the nodes promised
    the same (edges found once), each equal, bitwise, to compute_graph with the same
    halo on the graph the engine found."""
    engine, species = node_engine(sevennet0_path, device, "float64")
    system, start, owners, shifts = periodic_cell(sevennet0_path, device)
    n = len(start)
    all_species = np.concatenate([species, species[owners]])
    rng = np.random.default_rng(1)
    for step in range(3):
        positions = start + (rng.uniform(-0.25, 0.25, start.shape) if step else 0.0)
        nodes = np.concatenate([positions, positions[owners] + shifts])
        got = engine.compute_nodes(
            nodes,
            all_species,
            num_owned=n,
            atom_virials=True,
            same_nodes_as_last=step > 0,
            ghost_owners=owners,
        )
        assert engine.num_neighbor_builds == 1
        want = periodic_reference(system, positions, species)
        assert abs(got["energy"] - want["energy"]) < 1e-10
        np.testing.assert_allclose(got["energies"][:n], want["energies"], atol=1e-12)
        assert np.all(got["energies"][n:] == 0.0)
        np.testing.assert_allclose(fold(got["forces"], owners, n), want["forces"], atol=1e-11)
        np.testing.assert_allclose(got["virial"], want["virial"], atol=1e-10)
        np.testing.assert_allclose(
            fold(got["atom_virials"], owners, n), want["atom_virials"], atol=1e-11
        )
        rows, neighbors = engine.node_graph()
        fresh, _ = engine_for(sevennet0_path, device, "float64")
        explicit = fresh.compute_graph(
            nodes,
            all_species,
            rows,
            neighbors,
            num_energy_nodes=n,
            atom_virials=True,
            ghost_owners=owners,
        )
        for key in ("energy", "energies", "forces", "virial", "atom_virials"):
            assert np.array_equal(got[key], explicit[key]), (step, key)


def split_self_images(owners: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The ghosts of periodic_nodes reordered as pair_style e3fuse comm exchange orders them,
    [exchanged | self images]: owners of even index stand for another rank's atoms, their
    first image exchanged and the further ones self images of that ghost; owners of odd
    index are this rank's, every image a self image of the owned node. Returns the ghost
    order (indices into owners), the halo's ghost_owners (owned node, or for a self image
    its source node) and the number of self images."""
    exchanged, images, sources = [], [], []
    first_ghost: dict[int, int] = {}
    for g, owner in enumerate(owners):
        if owner % 2 == 0 and owner not in first_ghost:
            first_ghost[int(owner)] = len(exchanged)
            exchanged.append(g)
    for g, owner in enumerate(owners):
        if owner % 2 == 1:
            images.append(g)
            sources.append(int(owner))
        elif exchanged[first_ghost[int(owner)]] != g:
            images.append(g)
            sources.append(n + first_ghost[int(owner)])
    order = np.array(exchanged + images)
    halo_owners = np.concatenate([owners[exchanged], sources]).astype(np.int32)
    return order, halo_owners, len(images)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("device", DEVICES)
def test_nodes_with_self_images(sevennet0_path: Path, device: str, dtype: str) -> None:
    """The halo's self images (HaloExchange::self_image_sources: ghosts the engine copies
    from an owned node or from an exchanged ghost, and whose adjoints it sums back) give
    what the same ghosts give through the exchange: compute_system's results after
    folding the ghosts' forces and per-atom virials into their owners (float64 rounding;
    float32: float32's). And bitwise the same on a second call (a fixed order of sums)."""
    engine, species = node_engine(sevennet0_path, device, dtype)
    system, positions, owners, shifts = periodic_cell(sevennet0_path, device)
    n = len(positions)
    order, halo_owners, num_images = split_self_images(owners, n)
    assert 0 < num_images < len(owners)
    assert (halo_owners[len(owners) - num_images :] >= n).any()  # sources among the ghosts
    owners, shifts = owners[order], shifts[order]
    nodes = np.concatenate([positions, positions[owners] + shifts])
    all_species = np.concatenate([species, species[owners]])
    want = periodic_reference(system, positions, species)
    atol = 1e-11 if dtype == "float64" else 3e-5
    runs = []
    for _ in range(2):
        got = engine.compute_nodes(
            nodes,
            all_species,
            num_owned=n,
            atom_virials=True,
            ghost_owners=halo_owners,
            self_images=num_images,
        )
        runs.append(got)
        assert abs(got["energy"] - want["energy"]) / n < (1e-12 if dtype == "float64" else 1e-5)
        np.testing.assert_allclose(got["energies"][:n], want["energies"], atol=atol)
        np.testing.assert_allclose(fold(got["forces"], owners, n), want["forces"], atol=atol)
        np.testing.assert_allclose(got["virial"] / n, want["virial"] / n, atol=atol)
        np.testing.assert_allclose(
            fold(got["atom_virials"], owners, n), want["atom_virials"], atol=atol
        )
    for key in ("energy", "energies", "forces", "virial", "atom_virials"):
        assert np.array_equal(runs[0][key], runs[1][key]), key


def test_self_images_bad_sources(sevennet0_path: Path) -> None:
    engine, species = node_engine(sevennet0_path, "cpu", "float64")
    positions = cluster(seed=4)
    nodes = np.concatenate([positions, positions[:2] + 30.0])
    all_species = np.concatenate([species, species[:2]])
    cases = [
        # the last ghost a copy of itself: not an owned node or an exchanged ghost
        ("self image", [0, 41], 1),
        # more self images than ghosts
        ("self_images", [0, 1], 3),
    ]
    for message, owners, images in cases:
        with pytest.raises(E3fuseError, match=message):
            engine.compute_nodes(
                nodes,
                all_species,
                num_owned=40,
                ghost_owners=np.array(owners, dtype=np.int32),
                self_images=images,
            )


# The CUDA engine overlaps each layer's halo exchange with the convolution of the receivers
# that need no exchanged ghost row (cuda/halo.cuh, DeviceHalo); the CPU engine exchanges each
# layer's rows in one piece before its convolution: the reference here.
OVERLAP_LENGTH = 19.2  # A: cluster(n=512)'s grid of 8 x 2.4 A as a periodic cell


def overlap_case(path: Path, elements: tuple[int, ...]) -> dict:
    """A 512-atom periodic cell owned by one rank, its images within cutoff + skin as ghosts
    ordered as comm exchange orders them (split_self_images: exchanged ghosts, self images of
    owned nodes and of exchanged ghosts): compute_nodes' arguments for three steps, the
    second with the nodes promised the same (the split of the rows kept), the third with
    atoms moved past skin / 2 (edges and split found again). Some owned atoms are farther
    than cutoff + skin from every face: interior rows."""
    model = _core.Model.load(str(path))
    positions = cluster(seed=6, n=512)
    n = len(positions)
    species = np.array([model.species_of(z) for z in elements] * n, dtype=np.int32)[:n]
    owners, shifts = periodic_nodes(positions, OVERLAP_LENGTH, model.cutoff + SKIN)
    order, halo_owners, num_images = split_self_images(owners, n)
    owners, shifts = owners[order], shifts[order]
    rng = np.random.default_rng(3)
    steps = [positions, positions + rng.uniform(-0.2, 0.2, positions.shape)]
    steps.append(steps[1].copy())
    steps[2][100] += [0.6, 0.0, 0.0]
    return {
        "model": model,
        "nodes": [np.concatenate([moved, moved[owners] + shifts]) for moved in steps],
        "species": np.concatenate([species, species[owners]]),
        "num_owned": n,
        "ghost_owners": halo_owners,
        "self_images": num_images,
    }


def overlap_steps(
    path: Path, device: str, precision: str, elements: tuple[int, ...], radial: str
) -> list[dict]:
    """overlap_case's three compute_nodes calls on one engine."""
    case = overlap_case(path, elements)
    engine = _core.Engine(case["model"], device, precision, radial=radial)
    engine.set_neighbor_skin(SKIN)
    results = [
        engine.compute_nodes(
            nodes,
            case["species"],
            num_owned=case["num_owned"],
            atom_virials=True,
            same_nodes_as_last=step > 0,
            ghost_owners=case["ghost_owners"],
            self_images=case["self_images"],
        )
        for step, nodes in enumerate(case["nodes"])
    ]
    assert engine.num_neighbor_builds == 2, device
    return results


@functools.cache
def overlap_reference(path: Path, elements: tuple[int, ...], radial: str) -> list[dict]:
    """overlap_steps on the CPU in float64, computed once per case (both dtypes' tests compare
    against it; read only)."""
    return overlap_steps(path, "cpu", "float64", elements, radial)


def overlap_runs(
    path: Path, dtype: str, elements: tuple[int, ...], radial: str = "auto"
) -> dict[str, list[dict]]:
    """overlap_case on CUDA in `dtype` (the overlapped exchange) and on the CPU in float64."""
    return {
        "cuda": overlap_steps(path, "cuda", dtype, elements, radial),
        "cpu": overlap_reference(path, elements, radial),
    }


def assert_overlap_matches(runs: dict[str, list[dict]], dtype: str) -> None:
    """CUDA (overlapped exchange) against the CPU in float64: to float64 rounding (1e-12 of
    each quantity's largest value), or float32's reach (forces and per-atom virials within
    3e-5, energies within 1e-5 eV per atom)."""
    for step, (got, want) in enumerate(zip(runs["cuda"], runs["cpu"], strict=True)):
        n = len(np.asarray(want["energies"]))
        for key in ("energy", "energies", "forces", "virial", "atom_virials"):
            g, w = np.asarray(got[key], dtype=float), np.asarray(want[key], dtype=float)
            if dtype == "float64":
                tol = 1e-12 * max(float(np.abs(w).max()), 1.0)
            else:
                tol = {"energy": 1e-5 * n, "energies": 1e-5, "virial": 3e-5 * n}.get(key, 3e-5)
            assert float(np.abs(g - w).max()) <= tol, (step, key, float(np.abs(g - w).max()))


@pytest.mark.skipif(not _core.cuda_available(), reason="e3fuse built without CUDA or no GPU")
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cuda_halo_overlap_sevennet(sevennet0_path: Path, dtype: str) -> None:
    """SevenNet-0: the overlapped halo exchange on CUDA against the CPU engine."""
    assert_overlap_matches(overlap_runs(sevennet0_path, dtype, (29, 28, 8)), dtype)


@pytest.mark.skipif(not _core.cuda_available(), reason="e3fuse built without CUDA or no GPU")
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cuda_halo_overlap_mace(dtype: str) -> None:
    """The shipped MACE model (Cu): the overlapped halo exchange on CUDA against the CPU
    engine."""
    path = Path(__file__).resolve().parents[1] / "examples" / "models" / "mace-cu-emt.e3f"
    assert_overlap_matches(overlap_runs(path, dtype, (29,)), dtype)
