"""Tests of the cell-list neighbor search (e3fuse._core.NeighborList).

The reference is ase.neighborlist.primitive_neighbor_list, which uses the same
convention: vector = positions[j] - positions[i] + S . cell for receiver i,
sender j and integer cell shift S.
"""

import numpy as np
import pytest

_core = pytest.importorskip("e3fuse._core")
ase_build = pytest.importorskip("ase.build")
from ase.neighborlist import primitive_neighbor_list  # noqa: E402

CUTOFF = 5.0


def edge_set(nl, positions, cutoff):
    """The (i, j, S) of the current list whose distance is below cutoff."""
    e = nl.edges(np.ascontiguousarray(positions, dtype=np.float64))
    keep = e["distances"] < cutoff
    return {
        (int(i), int(j), tuple(int(s) for s in S))
        for i, j, S in zip(e["receivers"][keep], e["senders"][keep], e["shifts"][keep])
    }


def reference_set(positions, cell, pbc, cutoff):
    i, j, S = primitive_neighbor_list(
        "ijS", pbc, np.asarray(cell, dtype=np.float64), positions, cutoff, self_interaction=False
    )
    return {(int(a), int(b), tuple(int(s) for s in sh)) for a, b, sh in zip(i, j, S)}


def check_against_ase(positions, cell, pbc, cutoff=CUTOFF, skin=0.5, ase_cell=None):
    positions = np.ascontiguousarray(positions, dtype=np.float64)
    cell = np.ascontiguousarray(cell, dtype=np.float64)
    nl = _core.NeighborList(cutoff, skin)
    assert nl.update(positions, cell, list(pbc)) is True
    got = edge_set(nl, positions, cutoff)
    ref = reference_set(positions, cell if ase_cell is None else ase_cell, pbc, cutoff)
    assert got == ref, (
        f"{len(got - ref)} extra and {len(ref - got)} missing edges; "
        f"extra {sorted(got - ref)[:5]}, missing {sorted(ref - got)[:5]}"
    )
    check_list_structure(nl, positions, cutoff + skin)
    return nl


def check_list_structure(nl, positions, radius):
    """Vectors consistent with shifts, rows sorted by (sender, shift), radius respected."""
    e = nl.edges(positions)
    cell_free = e["vectors"] - (positions[e["senders"]] - positions[e["receivers"]])
    assert e["receivers"].shape == (nl.num_edges,)
    assert np.all(np.diff(e["receivers"]) >= 0)
    assert np.all(e["distances"] < radius)
    assert not np.any((e["receivers"] == e["senders"]) & ~e["shifts"].any(axis=1))
    rows = list(
        zip(e["receivers"].tolist(), e["senders"].tolist(), map(tuple, e["shifts"].tolist()))
    )
    assert rows == sorted(rows)
    assert len(set(rows)) == len(rows)
    # The Cartesian shift depends on the integer shift only.
    by_shift = {}
    for s, v in zip(map(tuple, e["shifts"].tolist()), cell_free):
        by_shift.setdefault(s, v)
        np.testing.assert_allclose(v, by_shift[s], atol=1e-9)


def rattled(atoms, stdev=0.05, seed=1):
    atoms = atoms.copy()
    atoms.rattle(stdev=stdev, seed=seed)
    return atoms


def test_fcc_cubic_supercell():
    atoms = rattled(ase_build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat((3, 3, 3)))
    nl = check_against_ase(atoms.positions, atoms.cell.array, [True] * 3)
    assert nl.num_edges > 0


def test_triclinic_primitive_supercell():
    atoms = rattled(ase_build.bulk("Cu", "fcc", a=3.61).repeat((3, 2, 4)), seed=2)
    check_against_ase(atoms.positions, atoms.cell.array, [True] * 3)


def test_strongly_skewed_cell():
    rng = np.random.default_rng(3)
    cell = np.array([[6.0, 0.0, 0.0], [4.5, 5.0, 0.0], [-3.0, 2.5, 5.5]])
    positions = rng.uniform(0.0, 1.0, size=(30, 3)) @ cell
    check_against_ase(positions, cell, [True] * 3, cutoff=4.0)


def test_one_atom_cell_smaller_than_cutoff():
    atoms = ase_build.bulk("Cu", "fcc", a=3.61)  # 1 atom, plane spacing ~2.08 A
    nl = check_against_ase(atoms.positions, atoms.cell.array, [True] * 3)
    e = nl.edges(atoms.positions)
    assert np.abs(e["shifts"]).max() >= 2  # images beyond the nearest cells
    assert np.abs(e["shifts"]).sum(axis=1).max() >= 3
    # fcc shells within 5 A: 12 + 6 + 24
    assert int(np.sum(e["distances"] < CUTOFF)) == 42


def test_large_cutoff_on_small_cell():
    atoms = ase_build.bulk("Cu", "fcc", a=3.61)
    nl = check_against_ase(atoms.positions, atoms.cell.array, [True] * 3, cutoff=10.0, skin=0.0)
    assert nl.num_edges > 300  # long rows, many images of the one atom


def test_positions_outside_the_cell():
    atoms = rattled(ase_build.bulk("Cu", "fcc", a=3.61).repeat((2, 2, 2)), seed=4)
    positions = atoms.positions.copy()
    rng = np.random.default_rng(4)
    positions += rng.integers(-3, 4, size=(len(atoms), 3)) @ atoms.cell.array
    check_against_ase(positions, atoms.cell.array, [True] * 3)


def test_positions_far_outside_the_cell():
    atoms = rattled(ase_build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2)), seed=10)
    positions = atoms.positions.copy()
    rng = np.random.default_rng(10)
    positions += rng.integers(-2000, 2001, size=(len(atoms), 3)) @ atoms.cell.array
    check_against_ase(positions, atoms.cell.array, [True] * 3)


@pytest.mark.parametrize("c_vector", [[0.0, 0.0, 25.0], [0.0, 0.0, 0.0], [1.0, -2.0, 0.5]])
def test_slab_periodic_in_x_and_y(c_vector):
    a = 2.6
    cell = np.array([[a, 0.0, 0.0], [a / 2, a * np.sqrt(3) / 2, 0.0], c_vector])
    positions = np.array([[0.0, 0.0, 10.0], [a / 2, a / (2 * np.sqrt(3)), 12.1]])
    # ASE needs no particular non-periodic vector either; give it the same cell.
    check_against_ase(positions, cell, [True, True, False])


def test_molecule_without_cell():
    molecule = ase_build.molecule("C6H6")
    positions = molecule.positions
    check_against_ase(positions, np.zeros((3, 3)), [False] * 3, cutoff=3.0)


def test_periodic_in_x_only():
    rng = np.random.default_rng(5)
    cell = np.array([[3.0, 0.5, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    positions = rng.uniform(-4.0, 4.0, size=(12, 3))
    check_against_ase(positions, cell, [True, False, False])


def test_sparse_system_with_huge_extent():
    rng = np.random.default_rng(6)
    cluster = rng.uniform(0.0, 8.0, size=(40, 3))
    far = cluster[:5] + np.array([1.0e5, -2.0e5, 3.0e5])
    positions = np.vstack([cluster, far])
    check_against_ase(positions, np.zeros((3, 3)), [False] * 3, cutoff=3.0)


def test_empty_system():
    nl = _core.NeighborList(CUTOFF, 0.5)
    assert nl.update(np.zeros((0, 3)), np.eye(3) * 10.0, [True] * 3) is True
    assert nl.num_edges == 0
    e = nl.edges(np.zeros((0, 3)))
    assert e["receivers"].shape == (0,)
    assert e["shifts"].shape == (0, 3)


def test_symmetric_with_exactly_negated_vectors():
    atoms = rattled(ase_build.bulk("Cu", "fcc", a=3.61).repeat((2, 3, 2)), seed=7)
    positions = atoms.positions + 3.7  # partly outside the cell
    nl = _core.NeighborList(CUTOFF, 1.0)
    nl.update(positions, atoms.cell.array, [True] * 3)
    e = nl.edges(positions)
    index = {
        (i, j, s): k
        for k, (i, j, s) in enumerate(
            zip(e["receivers"].tolist(), e["senders"].tolist(), map(tuple, e["shifts"].tolist()))
        )
    }
    for (i, j, s), k in index.items():
        back = index[(j, i, tuple(-x for x in s))]
        assert np.array_equal(e["vectors"][back], -e["vectors"][k])  # exact, not approximate


def test_skin_reuse_and_rebuild():
    atoms = rattled(ase_build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2)), seed=8)
    cell = atoms.cell.array
    positions = atoms.positions.copy()
    cutoff, skin = 4.0, 1.0
    nl = _core.NeighborList(cutoff, skin)
    assert nl.update(positions, cell, [True] * 3) is True
    assert nl.num_builds == 1

    # Every atom moves by 0.3 < skin / 2: the list is reused and still complete.
    rng = np.random.default_rng(8)
    step = rng.normal(size=positions.shape)
    step *= 0.3 / np.linalg.norm(step, axis=1, keepdims=True)
    moved = positions + step
    assert nl.update(moved, cell, [True] * 3) is False
    assert nl.num_builds == 1
    assert edge_set(nl, moved, cutoff) == reference_set(moved, cell, [True] * 3, cutoff)

    # One atom 0.6 > skin / 2 away from where the list was built: rebuild.
    moved2 = moved.copy()
    moved2[3] = positions[3] + np.array([0.6, 0.0, 0.0])
    assert nl.update(moved2, cell, [True] * 3) is True
    assert nl.num_builds == 2
    assert edge_set(nl, moved2, cutoff) == reference_set(moved2, cell, [True] * 3, cutoff)

    # Same positions again: no rebuild; a changed cell or periodicity: rebuild.
    assert nl.update(moved2, cell, [True] * 3) is False
    assert nl.update(moved2, cell * 1.001, [True] * 3) is True
    assert nl.update(moved2, cell * 1.001, [True, True, False]) is True
    assert nl.num_builds == 4
    assert nl.update(moved2[:-1], cell * 1.001, [True, True, False]) is True
    assert nl.num_builds == 5


def test_zero_skin_rebuilds_on_any_motion():
    atoms = rattled(ase_build.bulk("Cu", "fcc", a=3.61).repeat((2, 2, 2)), seed=9)
    positions = atoms.positions.copy()
    nl = _core.NeighborList(CUTOFF, 0.0)
    assert nl.update(positions, atoms.cell.array, [True] * 3) is True
    assert nl.update(positions.copy(), atoms.cell.array, [True] * 3) is False
    positions[0, 0] += 1e-9
    assert nl.update(positions, atoms.cell.array, [True] * 3) is True
    assert nl.num_builds == 2


def test_nan_position_is_rejected():
    atoms = ase_build.bulk("Cu", "fcc", a=3.61).repeat((2, 2, 2))
    positions = atoms.positions.copy()
    positions[5, 1] = np.nan
    nl = _core.NeighborList(CUTOFF, 0.5)
    with pytest.raises(Exception, match=r"(?i)nan|finite"):
        nl.update(positions, atoms.cell.array, [True] * 3)
    # Also when the list would otherwise be reused.
    nl.update(atoms.positions, atoms.cell.array, [True] * 3)
    with pytest.raises(Exception, match=r"(?i)nan|finite"):
        nl.update(positions, atoms.cell.array, [True] * 3)


@pytest.mark.parametrize(
    "cell, pbc",
    [
        (np.zeros((3, 3)), [True, True, True]),
        (np.array([[3.0, 0.0, 0.0], [6.0, 0.0, 0.0], [0.0, 0.0, 3.0]]), [True, True, True]),
        (np.array([[3.0, 0.0, 0.0], [6.0, 0.0, 0.0], [0.0, 0.0, 0.0]]), [True, True, False]),
        (np.zeros((3, 3)), [True, False, False]),
    ],
)
def test_degenerate_periodic_cell_is_rejected(cell, pbc):
    nl = _core.NeighborList(CUTOFF, 0.5)
    with pytest.raises(Exception, match=r"(?i)zero volume|degenerate|linearly dependent"):
        nl.update(np.array([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]), cell, pbc)


def test_atoms_on_top_of_each_other_are_rejected():
    positions = np.array([[0.0, 0.0, 0.0], [1.5, 0.0, 0.0], [1.5, 0.0, 0.0]])
    nl = _core.NeighborList(CUTOFF, 0.5)
    with pytest.raises(Exception, match=r"atoms 1 and 2 .*closer than"):
        nl.update(positions, np.zeros((3, 3)), [False] * 3)
    nl = _core.NeighborList(CUTOFF, 0.5)
    nl.set_min_distance(0.5)
    with pytest.raises(Exception, match=r"closer than"):
        nl.update(np.array([[0.0, 0.0, 0.0], [0.3, 0.0, 0.0]]), np.zeros((3, 3)), [False] * 3)


def test_bad_cutoff_is_rejected():
    with pytest.raises(Exception, match=r"(?i)cutoff"):
        _core.NeighborList(0.0, 0.5)
    with pytest.raises(Exception, match=r"(?i)cutoff"):
        _core.NeighborList(-1.0, 0.5)


# ---------------------------------------------------------------------------------
# The GPU neighbor list (neighbors/neighbor_list.cu) against the CPU list.
# ---------------------------------------------------------------------------------

requires_gpu = pytest.mark.skipif(
    not _core.cuda_available(), reason="needs a CUDA device and an e3fuse built with CUDA"
)


def cpu_full_set(positions, cell, pbc, cutoff, skin):
    """Every edge of the CPU list (skin included) as (i, j, n0, n1, n2)."""
    nl = _core.NeighborList(cutoff, skin)
    nl.update(positions, cell, list(pbc))
    e = nl.edges(positions)
    return {
        (int(i), int(j), *(int(s) for s in S))
        for i, j, S in zip(e["receivers"], e["senders"], e["shifts"])
    }


def gpu_edges_as_set(row_offsets, neighbors, images):
    n = len(row_offsets) - 1
    assert row_offsets[0] == 0 and np.all(np.diff(row_offsets) >= 0)
    assert row_offsets[-1] == len(neighbors) == len(images)
    receivers = np.repeat(np.arange(n), np.diff(row_offsets))
    rows = [
        (int(i), int(j), int(a), int(b), int(c))
        for i, j, (a, b, c) in zip(receivers, neighbors, images.tolist())
    ]
    assert len(set(rows)) == len(rows), "duplicate edges"
    assert not any(i == j and a == b == c == 0 for i, j, a, b, c in rows), "self edge"
    return set(rows)


def gpu_catalog():
    """(name, positions, cell, pbc, cutoff, skin): the structures of the CPU tests above."""
    cases = []
    atoms = rattled(ase_build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat((3, 3, 3)))
    cases.append(("fcc_cubic", atoms.positions, atoms.cell.array, [True] * 3, CUTOFF, 0.5))
    atoms = rattled(ase_build.bulk("Cu", "fcc", a=3.61).repeat((3, 2, 4)), seed=2)
    cases.append(("triclinic", atoms.positions, atoms.cell.array, [True] * 3, CUTOFF, 0.5))
    rng = np.random.default_rng(3)
    cell = np.array([[6.0, 0.0, 0.0], [4.5, 5.0, 0.0], [-3.0, 2.5, 5.5]])
    cases.append(("skewed", rng.uniform(0.0, 1.0, size=(30, 3)) @ cell, cell, [True] * 3, 4.0, 0.5))
    atoms = ase_build.bulk("Cu", "fcc", a=3.61)
    cases.append(("one_atom", atoms.positions, atoms.cell.array, [True] * 3, CUTOFF, 0.5))
    cases.append(("one_atom_r10", atoms.positions, atoms.cell.array, [True] * 3, 10.0, 0.0))
    atoms = rattled(ase_build.bulk("Cu", "fcc", a=3.61).repeat((2, 2, 2)), seed=4)
    rng = np.random.default_rng(4)
    outside = atoms.positions + rng.integers(-3, 4, size=(len(atoms), 3)) @ atoms.cell.array
    cases.append(("outside_cell", outside, atoms.cell.array, [True] * 3, CUTOFF, 0.5))
    atoms = rattled(ase_build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2)), seed=10)
    rng = np.random.default_rng(10)
    far = atoms.positions + rng.integers(-20, 21, size=(len(atoms), 3)) @ atoms.cell.array
    cases.append(("far_outside_cell", far, atoms.cell.array, [True] * 3, CUTOFF, 0.5))
    a = 2.6
    slab = np.array([[0.0, 0.0, 10.0], [a / 2, a / (2 * np.sqrt(3)), 12.1]])
    for k, c in enumerate([[0.0, 0.0, 25.0], [0.0, 0.0, 0.0], [1.0, -2.0, 0.5]]):
        cell = np.array([[a, 0.0, 0.0], [a / 2, a * np.sqrt(3) / 2, 0.0], c])
        cases.append((f"slab{k}", slab, cell, [True, True, False], CUTOFF, 0.5))
    benzene = ase_build.molecule("C6H6").positions
    cases.append(("benzene", benzene, np.zeros((3, 3)), [False] * 3, 3.0, 0.5))
    rng = np.random.default_rng(5)
    cell = np.array([[3.0, 0.5, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    wire = rng.uniform(-4.0, 4.0, size=(12, 3))
    cases.append(("periodic_x", wire, cell, [True, False, False], CUTOFF, 0.5))
    rng = np.random.default_rng(6)
    cluster = rng.uniform(0.0, 8.0, size=(40, 3))
    sparse = np.vstack([cluster, cluster[:5] + np.array([1.0e5, -2.0e5, 3.0e5])])
    cases.append(("sparse_huge_extent", sparse, np.zeros((3, 3)), [False] * 3, 3.0, 0.5))
    # Random triclinic cells, every periodicity, positions partly outside the cell.
    rng = np.random.default_rng(11)
    for k in range(8):
        cell = np.diag(rng.uniform(4.0, 14.0, size=3)) + rng.uniform(-2.5, 2.5, size=(3, 3))
        pbc = [bool(b) for b in ((k >> 2) & 1, (k >> 1) & 1, k & 1)]
        positions = rng.uniform(-0.2, 1.2, size=(int(rng.integers(1, 60)), 3)) @ cell
        cases.append((f"random{k}", positions, cell, pbc, float(rng.uniform(2.0, 6.0)), 0.3))
    # A larger bulk system: many bins per direction.
    atoms = rattled(ase_build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat((8, 8, 8)), seed=12)
    cases.append(("fcc_2048", atoms.positions, atoms.cell.array, [True] * 3, CUTOFF, 1.0))
    return cases


GPU_CATALOG = gpu_catalog()


@requires_gpu
@pytest.mark.parametrize("case", GPU_CATALOG, ids=[c[0] for c in GPU_CATALOG])
def test_gpu_neighbor_list_matches_cpu(case):
    _, positions, cell, pbc, cutoff, skin = case
    positions = np.ascontiguousarray(positions, dtype=np.float64)
    cell = np.ascontiguousarray(cell, dtype=np.float64)
    row_offsets, neighbors, images = _core.gpu_neighbor_edges(positions, cell, pbc, cutoff, skin)
    assert row_offsets.shape == (len(positions) + 1,)
    assert images.shape == (len(neighbors), 3)
    got = gpu_edges_as_set(row_offsets, neighbors, images)
    ref = cpu_full_set(positions, cell, pbc, cutoff, skin)
    assert got == ref, (
        f"{len(got - ref)} extra and {len(ref - got)} missing edges; "
        f"extra {sorted(got - ref)[:5]}, missing {sorted(ref - got)[:5]}"
    )
    # Symmetric: i <- j (n) implies j <- i (-n).
    assert all((j, i, -a, -b, -c) in got for i, j, a, b, c in got)


@requires_gpu
def test_gpu_neighbor_list_is_deterministic():
    atoms = rattled(ase_build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat((6, 6, 6)), seed=13)
    positions, cell = atoms.positions, atoms.cell.array
    first = _core.gpu_neighbor_edges(positions, cell, [True] * 3, CUTOFF, 1.0)
    second = _core.gpu_neighbor_edges(positions, cell, [True] * 3, CUTOFF, 1.0)
    for a, b in zip(first, second):
        assert np.array_equal(a, b)


@requires_gpu
def test_gpu_empty_system():
    row_offsets, neighbors, images = _core.gpu_neighbor_edges(
        np.zeros((0, 3)), np.eye(3) * 10.0, [True] * 3, CUTOFF, 0.5
    )
    assert row_offsets.tolist() == [0]
    assert neighbors.shape == (0,) and images.shape == (0, 3)


@requires_gpu
def test_gpu_skin_reuse_and_rebuild():
    atoms = rattled(ase_build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2)), seed=8)
    cell = atoms.cell.array
    positions = atoms.positions.copy()
    cutoff, skin = 4.0, 1.0
    rng = np.random.default_rng(8)
    step = rng.normal(size=positions.shape)
    step *= 0.3 / np.linalg.norm(step, axis=1, keepdims=True)
    moved = positions + step  # every atom 0.3 < skin / 2: reuse
    moved2 = moved.copy()
    moved2[3] = positions[3] + np.array([0.6, 0.0, 0.0])  # 0.6 > skin / 2: rebuild

    flags, *edges = _core.gpu_neighbor_frames(
        np.stack([positions, moved]), cell, [True] * 3, cutoff, skin
    )
    assert flags == [True, False]
    # The list built at `positions` still holds every pair of `moved` within the cutoff.
    got = gpu_edges_as_set(*edges)
    assert got == cpu_full_set(positions, cell, [True] * 3, cutoff, skin)
    ref = reference_set(moved, cell, [True] * 3, cutoff)
    assert {(i, j, (a, b, c)) for i, j, a, b, c in got} >= ref

    flags, *edges = _core.gpu_neighbor_frames(
        np.stack([positions, moved, moved2, moved2]), cell, [True] * 3, cutoff, skin
    )
    assert flags == [True, False, True, False]
    assert gpu_edges_as_set(*edges) == cpu_full_set(moved2, cell, [True] * 3, cutoff, skin)

    # Zero skin: any motion rebuilds.
    nudged = positions.copy()
    nudged[0, 0] += 1e-9
    flags, *_ = _core.gpu_neighbor_frames(
        np.stack([positions, positions, nudged]), cell, [True] * 3, CUTOFF, 0.0
    )
    assert flags == [True, False, True]


@requires_gpu
def test_gpu_nan_position_is_rejected():
    atoms = ase_build.bulk("Cu", "fcc", a=3.61).repeat((2, 2, 2))
    positions = atoms.positions.copy()
    positions[5, 1] = np.nan
    with pytest.raises(Exception, match=r"(?i)atom 5 .*(nan|finite)"):
        _core.gpu_neighbor_edges(positions, atoms.cell.array, [True] * 3, CUTOFF, 0.5)
    # Also when the list would otherwise be reused.
    with pytest.raises(Exception, match=r"(?i)atom 5 .*(nan|finite)"):
        _core.gpu_neighbor_frames(
            np.stack([atoms.positions, positions]), atoms.cell.array, [True] * 3, CUTOFF, 0.5
        )


@requires_gpu
def test_gpu_atoms_too_close_are_rejected():
    positions = np.array([[0.0, 0.0, 0.0], [1.5, 0.0, 0.0], [1.5, 0.0, 0.0]])
    with pytest.raises(Exception, match=r"atoms 1 and 2 .*closer than"):
        _core.gpu_neighbor_edges(positions, np.zeros((3, 3)), [False] * 3, CUTOFF, 0.5)
    close = np.array([[0.0, 0.0, 0.0], [0.3, 0.0, 0.0]])
    with pytest.raises(Exception, match=r"closer than"):
        _core.gpu_neighbor_edges(close, np.zeros((3, 3)), [False] * 3, CUTOFF, 0.5, 0.5)
    # On a reused list, and through a periodic image.
    cell = np.eye(3) * 6.0
    apart = np.array([[0.1, 3.0, 3.0], [3.0, 3.0, 3.0]])
    squeezed = np.array([[0.1, 3.0, 3.0], [5.95, 3.0, 3.0]])  # 0.15 apart through the image
    with pytest.raises(Exception, match=r"atoms 0 and 1 .*closer than.*periodic image"):
        _core.gpu_neighbor_frames(np.stack([apart, squeezed]), cell, [True] * 3, CUTOFF, 6.0, 0.5)


@requires_gpu
def test_gpu_degenerate_cell_and_bad_cutoff_are_rejected():
    with pytest.raises(Exception, match=r"(?i)zero volume"):
        _core.gpu_neighbor_edges(
            np.array([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]), np.zeros((3, 3)), [True] * 3, CUTOFF
        )
    with pytest.raises(Exception, match=r"(?i)cutoff"):
        _core.gpu_neighbor_edges(np.zeros((1, 3)), np.eye(3), [True] * 3, 0.0)
