"""The frame micro's cost model per task and edge (make_frame's `cost` and `overhead`) for an
input block of degree l1 whose task holds all of the block's paths, from e3nn's Wigner 3j
symbols: compare with the instructions of task_probe.cu's compiled tasks (README.md)."""

import torch
from e3nn import o3


def path_cost(l1: int, l2: int, l3: int) -> int:
    """d3^2 + 2 x the in-frame entries (b = l2 - 1, l2, l2 + 1) + 3 d1 + 24."""
    w = o3.wigner_3j(l1, l2, l3)
    slices = range(max(0, l2 - 1), min(2 * l2, l2 + 1) + 1)
    entries = sum(int((w[:, b, :].abs() > 1e-12).sum()) for b in slices)
    return (2 * l3 + 1) ** 2 + 2 * entries + 3 * (2 * l1 + 1) + 24


if __name__ == "__main__":
    torch.set_default_dtype(torch.float64)
    for l1 in (3, 2):
        paths = [(l2, l3) for l3 in range(4) for l2 in range(4) if abs(l1 - l2) <= l3 <= l1 + l2]
        bodies = sum(path_cost(l1, l2, l3) for l2, l3 in paths)
        overhead = 2 * (2 * l1 + 1) ** 2 + 40
        print(f"l1 = {l1}: {len(paths)} paths, {bodies} + {overhead} = {bodies + overhead}")
