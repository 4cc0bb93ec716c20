"""The benchmarks' own arithmetic (no GPU): the convolution microbenchmark's work model per
edge (benchmarks/micro/conv_micro.py) against hand counts and against cases.model_work, its
structure file as the executable reads it, and the LAMMPS scaling benchmark's pairing of rows
into efficiencies."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str, path: Path):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


conv_micro = _load("conv_micro", BENCH / "micro" / "conv_micro.py")
cases = _load("cases", BENCH / "cases.py")

# 4x0e + 2x1o in, Y up to l = 1, paths 0e x 0e -> 0e, 0e x 1o -> 1o, 1o x 1o -> 0e
CONV = {
    "irreps_in": [[4, 0, 1], [2, 1, -1]],
    "irreps_sh": [[1, 0, 1], [1, 1, -1]],
    "irreps_out": [[4, 0, 1], [4, 1, -1], [2, 0, 1]],
    "instructions": [
        {"in": 0, "sh": 0, "out": 0},
        {"in": 0, "sh": 1, "out": 1},
        {"in": 1, "sh": 1, "out": 2},
    ],
    "mlp": {"dims": [8, 16, 10]},
}


def test_layer_work_counts_each_path() -> None:
    w = conv_micro.layer_work(CONV)
    # (mul, d1, d2, d3): (4, 1, 1, 1), (4, 1, 3, 3), (2, 3, 3, 1)
    assert w["paths_mul_d1_d2_d3"] == [(4, 1, 1, 1), (4, 1, 3, 3), (2, 3, 3, 1)]
    assert w["weight_numel"] == 10 and w["dim_in"] == 10 and w["dim_out"] == 18
    assert w["tp_fwd_macs"] == (1 + 4 * 2) + (9 + 4 * 6) + (9 + 2 * 4)
    least = (4 + 3 + 4 * 5) + (36 + 9 + 4 * 11) + (36 + 9 + 2 * 13)
    assert w["tp_bwd_macs"] == least
    assert w["tp_bwd_e3fuse_macs"] == (4 + 4 * 6) + (36 + 4 * 14) + (36 + 2 * 18)
    assert w["mlp_fwd_macs"] == 8 * 16 + 16 * 10
    assert w["fwd_bytes"] == 16 * 10 + 4 * 10 + 32
    assert w["bwd_bytes"] == 16 * 10 + 4 * 18 + 32 + 48
    assert w["fwd_flops"] == 2 * (w["tp_fwd_macs"] + 3 * 10)


def test_layer_work_forward_matches_the_case_catalog() -> None:
    """cases.model_work (the benchmarks' GFLOP/s) counts the same forward work per edge."""
    no_linear = {"paths": [], "irreps_in": [], "irreps_out": []}
    layer = {
        "conv": CONV,
        "self_connection": no_linear,
        "linear_1": no_linear,
        "linear_2": no_linear,
    }
    counted = cases.model_work({"layers": [layer, layer]})
    w = conv_micro.layer_work(CONV)
    assert counted["tp_per_edge"] == 2 * w["tp_fwd_macs"]
    assert counted["mlp_per_edge"] == 2 * w["mlp_fwd_macs"]


def test_structure_file_layout(tmp_path: Path) -> None:
    atoms = cases.build_atoms("cu-fcc-108")
    path = tmp_path / "s.bin"
    conv_micro.write_structure(atoms, path)
    raw = np.fromfile(path, dtype="<f8")
    assert raw[0] == 108
    assert np.array_equal(raw[1:10].reshape(3, 3), np.asarray(atoms.cell))
    assert list(raw[10:13]) == [1.0, 1.0, 1.0]
    assert np.array_equal(raw[13:].reshape(-1, 3), atoms.positions)


def test_lammps_scaling_pairs_rows_of_one_run() -> None:
    """bench_lammps_scaling: a weak-scaling row is compared with the one-rank row of its own
    run, not with a faster one kept from an earlier run of the results file."""
    spec = importlib.util.spec_from_file_location(
        "bench_lammps_scaling", BENCH / "bench_lammps_scaling.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_lammps_scaling"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)

    def row(ranks: int, atoms: int, ms: float, date: str) -> dict:
        return {
            "model": "m",
            "atoms": atoms,
            "ranks": ranks,
            "comm": "images" if ranks == 1 else "exchange",
            "roles": ["weak"],
            "status": "ok",
            "ms_per_step": ms,
            "precision": "float32",
            "device": "cuda",
            "commit": date[:4],
            "date": date,
        }

    rows = [
        row(1, 1000, 50.0, "2026-01-01T00:00"),  # an earlier run, faster
        row(1, 1000, 100.0, "2026-02-01T00:00"),
        row(2, 2000, 110.0, "2026-02-01T00:00"),
    ]
    summary = module.scaling_summary(rows)
    assert len(summary) == 1
    assert abs(summary[0]["efficiency"] - 100.0 / 110.0) < 1e-12
    assert rows[2]["efficiency"] == {"weak": summary[0]["efficiency"]}
    assert summary[0]["date"] == "2026-02-01T00:00"


def test_labelled_markdown_tables_only_the_kinds_measured() -> None:
    """bench_gpu.py --kinds model-call: one table, speedups against e3fuse's own column."""
    bench_gpu = _load("bench_gpu", BENCH / "bench_gpu.py")
    meta = {"device": "cuda", "commit": "0123456789ab", "dirty": False, "date": "d", "command": "c"}
    rows = [
        {"engine": "e3fuse", "atoms": 864, "edges": 10, "status": "ok",
         "model-call": {"median_ms": 5.0}},
        {"engine": "sevenn-cueq", "atoms": 864, "edges": 10, "status": "ok",
         "model-call": {"median_ms": 60.0}},
    ]  # fmt: skip
    doc = {"meta": meta, "rows": rows, "family": "sevennet", "label": "7net-l3i5",
           "kinds": ["model-call"]}  # fmt: skip
    text = bench_gpu.labelled_markdown(doc)
    assert "## model call" in text and "## ASE MD step" not in text
    assert "| 864 | 10 | 5.00 | 60.00 | sevenn-cueq 12.0x |" in text
    for row in rows:
        row["md-step"] = {"median_ms": 2 * row["model-call"]["median_ms"]}
    doc["kinds"] = ["model-call", "md-step"]
    text = bench_gpu.labelled_markdown(doc)
    assert "## ASE MD step" in text and "| 864 | 10 | 10.00 | 120.00 | sevenn-cueq 12.0x |" in text


def test_call_timeline_names_gaps_and_host_time() -> None:
    """call_timeline.call_breakdown: overlapping GPU activity counts once as busy, the idle
    gaps between activities are named by their neighbours (largest first), and the host time
    around the CUDA runtime calls is measured from the call's range."""
    sys.path.insert(0, str(BENCH / "diag"))
    call_timeline = _load("call_timeline", BENCH / "diag" / "call_timeline.py")

    def event(ts: float, end: float, cat: str, name: str) -> dict:
        return {"ts": ts, "end": end, "cat": cat, "name": name}

    call = event(0, 100, "user_annotation", call_timeline.CALL)
    events = [
        event(4, 6, "cuda_runtime", "cudaGraphLaunch"),
        event(10, 20, "kernel", "first"),
        event(15, 25, "kernel", "overlapping"),
        event(55, 60, "kernel", "after_30us"),
        event(62, 70, "gpu_memcpy", "copy"),
        event(72, 73, "cuda_runtime", "cudaStreamSynchronize"),
        event(120, 130, "kernel", "outside the call"),
    ]
    b = call_timeline.call_breakdown(call, events)
    assert (b["kernels"], b["copies"], b["busy_us"]) == (3, 1, 28)
    assert (b["lead_us"], b["gaps_us"], b["tail_us"]) == (10, 32, 30)
    assert b["largest_gaps"] == [
        {"us": 30, "after": "overlapping", "before": "after_30us"},
        {"us": 2, "after": "after_30us", "before": "copy"},
    ]
    assert (b["host_before_runtime_us"], b["host_after_runtime_us"]) == (4, 27)
    assert b["runtime_names"] == ["cudaGraphLaunch", "cudaStreamSynchronize"]
