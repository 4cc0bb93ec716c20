"""Every op of the core (float64, through e3fuse._core.OpsProbe) against the
float64 sevenn model's own e3nn/sevenn modules on random inputs: spherical
harmonics and their Jacobian, radial basis x envelope and its derivative,
linear layers and their transposes, gates and their adjoints, the convolution
(radial MLP + channelwise tensor product + neighbor sum) with its backward pass
to node features and positions, and the species embedding.

Module names of sevenn's AtomGraphSequential:
  edge_embedding                 -> probe.spherical_harmonics, probe.edge_embedding
  onehot_to_feature_x            -> probe.embedding
  {t}_self_connection_intro      -> "layers.{t}.self_connection"
  {t}_self_interaction_1 / _2    -> "layers.{t}.linear_1" / "layers.{t}.linear_2"
  {t}_convolution                -> probe.conv(t, ...)
  {t}_equivariant_gate           -> probe.gate(t, ...)
  reduce_input_to_hidden / reduce_hidden_to_energy -> "readout.0" / "readout.1"
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pytest
import torch
from conftest import DEVICES, TOLERANCES, ModelCache, assert_rel, assert_rel_blocks

TOL = TOLERANCES["float64"]  # the probes run the core's float64 kernels
LAYERS = range(5)  # both models have 5 interaction layers (checked below)


@pytest.fixture
def probe(models: ModelCache, model_name: str) -> Any:
    return models.probe(model_name)


@pytest.fixture
def sevenn_model(models: ModelCache, model_name: str) -> Any:
    return models.sevenn_model(model_name)


def _t(a: np.ndarray, grad: bool = False) -> torch.Tensor:
    return torch.tensor(a, dtype=torch.float64, requires_grad=grad)


def _vjp(f: Any, x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """(d f / d x)^T g by autograd."""
    xt = _t(x, grad=True)
    (grad,) = torch.autograd.grad(f(xt), xt, _t(g))
    return grad.numpy()


def test_both_models_have_five_layers(models: ModelCache, model_name: str) -> None:
    from e3fuse import _core

    model = _core.Model.load(str(models.path(model_name)))
    assert model.num_layers == len(LAYERS)
    assert model.family == "sevennet"
    assert model.cutoff == pytest.approx(5.0)


# --------------------------------------------------------------------------------------
# Spherical harmonics
# --------------------------------------------------------------------------------------


def _random_vectors(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, 3)) * rng.uniform(0.3, 5.0, size=(n, 1))
    # axis-aligned and near-axis directions, where polynomial forms are most fragile
    special = np.array(
        [
            [1.0, 0, 0],
            [0, -2.0, 0],
            [0, 0, 3.0],
            [0, 0, -0.7],
            [1e-7, 0, 1.0],
            [1, 1, 1],
            [-1, 2, -3],
        ]
    )
    return np.concatenate([vectors, special])


def test_spherical_harmonics(probe: Any, sevenn_model: Any) -> None:
    sph = sevenn_model._modules["edge_embedding"].spherical
    vectors = _random_vectors(64, seed=11)
    Y, J = probe.spherical_harmonics(vectors)
    vt = _t(vectors, grad=True)
    Y_ref = sph(vt)
    assert Y.shape == tuple(Y_ref.shape)
    assert_rel(Y, Y_ref.detach().numpy(), TOL.rel, "Y")
    # J[e, m, :] = dY_m / dv; rows are independent, so grad of sum_e Y[e, m] gives J[:, m, :].
    J_ref = np.stack(
        [
            torch.autograd.grad(Y_ref[:, m].sum(), vt, retain_graph=True)[0].numpy()
            for m in range(Y_ref.shape[1])
        ],
        axis=1,
    )
    assert J.shape == J_ref.shape
    assert_rel(J, J_ref, TOL.grad_rel, "dY/dv")
    # per irrep, so that a wrong high-l block is not hidden by the l = 0 block
    start = 0
    for degree in range(int(np.sqrt(Y.shape[1]))):
        block = slice(start, start + 2 * degree + 1)
        assert_rel(Y[:, block], Y_ref.detach().numpy()[:, block], TOL.rel, f"Y, l = {degree}")
        if degree > 0:
            assert_rel(J[:, block], J_ref[:, block], TOL.grad_rel, f"dY/dv, l = {degree}")
        start += 2 * degree + 1


# --------------------------------------------------------------------------------------
# Radial basis x envelope
# --------------------------------------------------------------------------------------


def _radii(edge: Any) -> np.ndarray:
    cutoff = 5.0
    r = [np.linspace(0.05, cutoff - 1e-6, 301)]
    envelope = edge.cutoff_function
    if type(envelope).__name__ == "XPLORCutoff":  # both sides of the switching radius
        r_on = float(envelope.r_on)
        r.append(r_on + np.array([-1e-3, -1e-7, 1e-7, 1e-3, 0.1, 0.3]))
    r.append(cutoff - np.array([1e-2, 1e-3]))
    return np.concatenate(r)


def _sevenn_embedding(edge: Any, r: torch.Tensor) -> torch.Tensor:
    return edge.basis_function(r) * edge.cutoff_function(r).unsqueeze(-1)


def test_edge_embedding(probe: Any, sevenn_model: Any) -> None:
    edge = sevenn_model._modules["edge_embedding"]
    r = _radii(edge)
    emb, demb = probe.edge_embedding(r)
    rt = _t(r, grad=True)
    ref = _sevenn_embedding(edge, rt)
    assert emb.shape == tuple(ref.shape)
    assert_rel(emb, ref.detach().numpy(), TOL.rel, "radial basis x envelope")
    dref = np.stack(
        [
            torch.autograd.grad(ref[:, n].sum(), rt, retain_graph=True)[0].numpy()
            for n in range(ref.shape[1])
        ],
        axis=1,
    )
    assert_rel(demb, dref, TOL.grad_rel, "d(radial basis x envelope)/dr")


def test_envelope_regions(probe: Any, sevenn_model: Any) -> None:
    """The envelope alone, region by region (the global norm above is dominated
    by small r): emb / basis is the envelope value wherever the basis is not zero."""
    edge = sevenn_model._modules["edge_embedding"]
    envelope = edge.cutoff_function
    if type(envelope).__name__ == "XPLORCutoff":
        r_on = float(envelope.r_on)
        regions = {
            "inner (r < r_on)": np.linspace(0.5, r_on - 1e-6, 40),
            "switching (r_on <= r < r_cut)": np.linspace(r_on + 1e-6, 4.999, 40),
        }
    else:
        regions = {"inner": np.linspace(0.5, 3.5, 40), "outer": np.linspace(3.5, 4.999, 40)}
    for label, r in regions.items():
        emb, demb = probe.edge_embedding(r)
        rt = _t(r, grad=True)
        ref = _sevenn_embedding(edge, rt)
        assert_rel(emb, ref.detach().numpy(), TOL.rel, f"embedding, {label}")
        dref = torch.autograd.grad(ref.sum(), rt)[0].numpy()
        assert_rel(demb.sum(axis=1), dref, TOL.grad_rel, f"d embedding / dr, {label}")


# --------------------------------------------------------------------------------------
# Linear layers
# --------------------------------------------------------------------------------------

LINEARS = ["layers.{t}.self_connection", "layers.{t}.linear_1", "layers.{t}.linear_2"]
SEVENN_LINEARS = {
    "self_connection": "{t}_self_connection_intro",
    "linear_1": "{t}_self_interaction_1",
    "linear_2": "{t}_self_interaction_2",
}


def _linear_module(model: Any, name: str) -> Any:
    if name == "readout.0":
        return model._modules["reduce_input_to_hidden"].linear
    if name == "readout.1":
        return model._modules["reduce_hidden_to_energy"].linear
    _, t, which = name.split(".")
    return model._modules[SEVENN_LINEARS[which].format(t=t)].linear


LINEAR_NAMES = [n.format(t=t) for t in LAYERS for n in LINEARS] + ["readout.0", "readout.1"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", LINEAR_NAMES)
def test_linear(probe: Any, sevenn_model: Any, name: str, device: str) -> None:
    module = _linear_module(sevenn_model, name)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    x = rng.standard_normal((9, module.irreps_in.dim))
    out = probe.linear(name, x, device=device)
    with torch.no_grad():
        ref = module(_t(x)).numpy()
    assert out.shape == ref.shape
    assert_rel(out, ref, TOL.rel, f"{name} forward")
    # per output irrep: each block has its own weights, path weight and (scalars) bias
    assert_rel_blocks(out, ref, module.irreps_out, TOL.rel, name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", LINEAR_NAMES)
def test_linear_transpose(probe: Any, sevenn_model: Any, name: str, device: str) -> None:
    module = _linear_module(sevenn_model, name)
    rng = np.random.default_rng(1 + zlib.crc32(name.encode()))
    x = rng.standard_normal((9, module.irreps_in.dim))
    g = rng.standard_normal((9, module.irreps_out.dim))
    out = probe.linear_transpose(name, g, device=device)
    assert_rel(out, _vjp(module, x, g), TOL.grad_rel, f"{name} transpose")


@pytest.mark.parametrize("name", LINEAR_NAMES)
def test_linear_many_nodes_cuda_matches_cpu(probe: Any, sevenn_model: Any, name: str) -> None:
    """Many node tiles, the last one partial: the CUDA matrix-product kernels against the
    CPU rows, forward and transpose."""
    from e3fuse import _core

    if not _core.cuda_available():
        pytest.skip("e3fuse built without CUDA or no GPU")
    lin = _linear_module(sevenn_model, name)
    rng = np.random.default_rng(2 + zlib.crc32(name.encode()))
    x = rng.standard_normal((301, lin.irreps_in.dim))
    g = rng.standard_normal((301, lin.irreps_out.dim))
    for ours, ref in (
        (probe.linear(name, x, device="cuda"), probe.linear(name, x)),
        (probe.linear_transpose(name, g, device="cuda"), probe.linear_transpose(name, g)),
    ):
        assert np.abs(ours - ref).max() < 1e-12 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", LINEAR_NAMES)
def test_linear_float32(probe: Any, sevenn_model: Any, name: str, device: str) -> None:
    """The float32 kernels against the float64 layer on 301 rows (several node tiles, the
    last one partial), forward and transpose: float32 accuracy (TF32 products, with their
    10-bit mantissa, would miss it by ~100x)."""
    lin = _linear_module(sevenn_model, name)
    rng = np.random.default_rng(3 + zlib.crc32(name.encode()))
    x = rng.standard_normal((301, lin.irreps_in.dim))
    g = rng.standard_normal((301, lin.irreps_out.dim))
    for ours, ref in (
        (probe.linear(name, x, device=device, dtype="float32"), probe.linear(name, x)),
        (
            probe.linear_transpose(name, g, device=device, dtype="float32"),
            probe.linear_transpose(name, g),
        ),
    ):
        assert ours.dtype == np.float32 and ours.shape == ref.shape
        assert np.abs(ours - ref).max() < 2e-6 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize(
    "name", ["layers.1.self_connection", "layers.1.linear_1", "layers.1.linear_2"]
)
def test_linear_float32_large_tiles_cuda(probe: Any, sevenn_model: Any, name: str) -> None:
    """The float32 kernels on 5,000 rows, forward and transpose, to float32 accuracy and
    bitwise the same on a second run: with these layers' 7 or more column tiles that is
    over 2 blocks of 128 nodes per SM on a 132-SM GPU, so the large-system tiles run. The
    first 301 rows alone run the small-system tiles, which sum in the same order: the
    same bits."""
    from e3fuse import _core

    if not _core.cuda_available():
        pytest.skip("e3fuse built without CUDA or no GPU")
    lin = _linear_module(sevenn_model, name)
    rng = np.random.default_rng(4 + zlib.crc32(name.encode()))
    x = rng.standard_normal((5000, lin.irreps_in.dim))
    g = rng.standard_normal((5000, lin.irreps_out.dim))
    for run, rows, ref in (
        (
            lambda rows: probe.linear(name, rows, device="cuda", dtype="float32"),
            x,
            probe.linear(name, x),
        ),
        (
            lambda rows: probe.linear_transpose(name, rows, device="cuda", dtype="float32"),
            g,
            probe.linear_transpose(name, g),
        ),
    ):
        ours = run(rows)
        assert ours.dtype == np.float32 and ours.shape == ref.shape
        assert np.abs(ours - ref).max() < 2e-6 * max(1.0, np.abs(ref).max())
        assert np.array_equal(ours, run(rows))
        assert np.array_equal(ours[:301], run(rows[:301]))


def test_linear_unknown_name(probe: Any) -> None:
    from e3fuse import E3fuseError

    with pytest.raises(E3fuseError, match="unknown linear"):
        probe.linear("layers.0.linear_3", np.zeros((1, 128)))
    with pytest.raises(E3fuseError, match="wrong shape"):
        probe.linear("layers.0.linear_1", np.zeros((1, 127)))


# --------------------------------------------------------------------------------------
# Gate
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layer", LAYERS)
def test_gate(probe: Any, sevenn_model: Any, layer: int, device: str) -> None:
    gate = sevenn_model._modules[f"{layer}_equivariant_gate"].gate
    rng = np.random.default_rng(100 + layer)
    x = 1.5 * rng.standard_normal((11, gate.irreps_in.dim))
    out = probe.gate(layer, x, device=device)
    with torch.no_grad():
        ref = gate(_t(x)).numpy()
    assert out.shape == ref.shape
    assert_rel(out, ref, TOL.rel, f"gate {layer}")
    assert_rel_blocks(out, ref, gate.irreps_out, TOL.rel, f"gate {layer}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layer", LAYERS)
def test_gate_transpose(probe: Any, sevenn_model: Any, layer: int, device: str) -> None:
    gate = sevenn_model._modules[f"{layer}_equivariant_gate"].gate
    rng = np.random.default_rng(200 + layer)
    x = 1.5 * rng.standard_normal((11, gate.irreps_in.dim))
    g = rng.standard_normal((11, gate.irreps_out.dim))
    out = probe.gate_transpose(layer, x, g, device=device)
    ref = _vjp(gate, x, g)
    assert_rel(out, ref, TOL.grad_rel, f"gate {layer} adjoint")
    assert_rel_blocks(out, ref, gate.irreps_in, TOL.grad_rel, f"gate {layer} adjoint")


# --------------------------------------------------------------------------------------
# Convolution
# --------------------------------------------------------------------------------------


class OpenGraph:
    """~12 atoms at random in an elongated box, every ordered pair i != j in a receiver-sorted
    CSR list (the core skips pairs at r >= cutoff itself; sevenn gets only the
    pairs inside the cutoff, as its own graph builder would produce)."""

    def __init__(
        self,
        n: int,
        box: tuple[float, float, float],
        seed: int,
        cutoff: float = 5.0,
        min_distance: float = 1.2,
    ) -> None:
        rng = np.random.default_rng(seed)
        positions: list[np.ndarray] = []
        while len(positions) < n:
            p = rng.uniform(0.0, np.array(box))
            if all(np.linalg.norm(p - q) >= min_distance for q in positions):
                positions.append(p)
        self.positions = np.array(positions)
        self.row_offsets = np.arange(0, n * (n - 1) + 1, n - 1, dtype=np.int64)
        self.neighbors = np.array([j for i in range(n) for j in range(n) if j != i], dtype=np.int32)
        receivers = np.repeat(np.arange(n), n - 1)
        distances = np.linalg.norm(
            self.positions[self.neighbors] - self.positions[receivers], axis=1
        )
        inside = distances < cutoff
        self.edge_index = np.stack([receivers[inside], self.neighbors[inside]]).astype(np.int64)
        self.distances = distances


@pytest.fixture(scope="module")
def graph() -> OpenGraph:
    g = OpenGraph(n=12, box=(8.0, 3.4, 3.0), seed=5)
    # the graph exercises the cutoff: pairs beyond it, and pairs in the XPLOR switching region
    assert (g.distances >= 5.0).sum() >= 4
    assert ((g.distances > 4.5) & (g.distances < 5.0)).sum() >= 4
    return g


def _sevenn_conv(
    model: Any, layer: int, graph: OpenGraph, x: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """sevenn's IrrepsConvolution on the graph: edge vector = pos[sender] - pos[receiver],
    edge_index = [receiver (dst), sender (src)]."""
    edge = model._modules["edge_embedding"]
    index = torch.from_numpy(graph.edge_index)
    vectors = positions[index[1]] - positions[index[0]]
    r = torch.linalg.norm(vectors, dim=-1)
    data = {
        "x": x,
        "edge_attr": edge.spherical(vectors),
        "edge_embedding": _sevenn_embedding(edge, r),
        "edge_index": index,
    }
    return model._modules[f"{layer}_convolution"](data)["x"]


@pytest.mark.parametrize("layer", LAYERS)
def test_conv(probe: Any, sevenn_model: Any, graph: OpenGraph, layer: int) -> None:
    conv = sevenn_model._modules[f"{layer}_convolution"].convolution
    rng = np.random.default_rng(300 + layer)
    x = rng.standard_normal((len(graph.positions), conv.irreps_in1.dim))
    y = probe.conv(layer, graph.positions, graph.row_offsets, graph.neighbors, x)
    with torch.no_grad():
        ref = _sevenn_conv(sevenn_model, layer, graph, _t(x), _t(graph.positions)).numpy()
    assert y.shape == ref.shape
    assert_rel(y, ref, TOL.rel, f"conv {layer}")
    assert_rel_blocks(y, ref, conv.irreps_out, TOL.rel, f"conv {layer}")


@pytest.mark.parametrize("layer", LAYERS)
def test_conv_backward(probe: Any, sevenn_model: Any, graph: OpenGraph, layer: int) -> None:
    """grad_x = d(sum y * grad_y)/dx and forces = -d(sum y * grad_y)/d positions."""
    conv = sevenn_model._modules[f"{layer}_convolution"].convolution
    rng = np.random.default_rng(400 + layer)
    x = rng.standard_normal((len(graph.positions), conv.irreps_in1.dim))
    grad_y = rng.standard_normal((len(graph.positions), conv.irreps_out.dim))
    grad_x, forces = probe.conv_backward(
        layer, graph.positions, graph.row_offsets, graph.neighbors, x, grad_y
    )
    xt, pt = _t(x, grad=True), _t(graph.positions, grad=True)
    y = _sevenn_conv(sevenn_model, layer, graph, xt, pt)
    gx_ref, gp_ref = torch.autograd.grad((y * _t(grad_y)).sum(), [xt, pt])
    assert_rel(grad_x, gx_ref.numpy(), TOL.grad_rel, f"conv {layer} grad_x")
    assert_rel(forces, -gp_ref.numpy(), TOL.grad_rel, f"conv {layer} forces")


def test_conv_isolated_nodes(probe: Any) -> None:
    """Nodes without neighbors inside the cutoff get zero output and zero gradients."""
    positions = np.array([[0.0, 0.0, 0.0], [2.5, 0.0, 0.0], [20.0, 0.0, 0.0]])
    row_offsets = np.array([0, 2, 4, 6], dtype=np.int64)
    neighbors = np.array([1, 2, 0, 2, 0, 1], dtype=np.int32)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 128))
    y = probe.conv(0, positions, row_offsets, neighbors, x)
    assert np.all(y[2] == 0.0)
    assert np.abs(y[:2]).max() > 0
    grad_x, forces = probe.conv_backward(
        0, positions, row_offsets, neighbors, x, rng.standard_normal(y.shape)
    )
    assert np.all(grad_x[2] == 0.0) and np.all(forces[2] == 0.0)
    # the pair forces are equal and opposite
    np.testing.assert_allclose(forces[0], -forces[1], rtol=1e-13, atol=0)


# --------------------------------------------------------------------------------------
# Species embedding
# --------------------------------------------------------------------------------------


def test_embedding(probe: Any, sevenn_model: Any) -> None:
    module = sevenn_model._modules["onehot_to_feature_x"].linear
    num_species = module.irreps_in.dim
    rng = np.random.default_rng(9)
    species = np.concatenate([np.arange(num_species), rng.integers(0, num_species, 20)])
    out = probe.embedding(species.astype(np.int32))
    onehot = torch.nn.functional.one_hot(torch.from_numpy(species), num_species)
    with torch.no_grad():
        ref = module(onehot.to(torch.float64)).numpy()
    assert out.shape == ref.shape
    assert_rel(out, ref, TOL.rel, "embedding")


def test_embedding_out_of_range(probe: Any, sevenn_model: Any) -> None:
    from e3fuse import E3fuseError

    num_species = sevenn_model._modules["onehot_to_feature_x"].linear.irreps_in.dim
    for bad in (-1, num_species):
        with pytest.raises(E3fuseError, match="out of range"):
            probe.embedding(np.array([0, bad], dtype=np.int32))
