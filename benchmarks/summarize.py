"""Markdown tables from bench_cpu.py's JSON files.

python benchmarks/summarize.py [results/cpu_*.json ...] [--out results/cpu_summary.md]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _ms(x: float | None) -> str:
    return "–" if x is None else (f"{x * 1e3:,.0f}" if x >= 1 else f"{x * 1e3:.1f}")


def _num(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def _mb(x: int | None) -> str:
    return "–" if x is None else f"{x / 2**20:,.0f}"


def _get(d: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def merge(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One document per model family, model and commit: rows of several runs (e.g. one per
    size) together, each row keeping the command that measured it."""
    merged: dict[tuple[str, str, str], dict[str, Any]] = {}
    for doc in docs:
        key = (doc.get("family", "sevennet"), doc["model"], doc["meta"]["git"]["commit"])
        for r in doc["results"]:
            r["command"] = doc["meta"]["command"]
        if key not in merged:
            merged[key] = {**doc, "results": list(doc["results"]), "commands": [], "notes": []}
        else:
            merged[key]["results"] += doc["results"]
        merged[key]["commands"].append(doc["meta"]["command"])
        if doc.get("notes"):
            merged[key]["notes"].append(doc["notes"])
    for doc in merged.values():
        doc["results"].sort(key=lambda r: (r["num_atoms"], r["dtype"]))
    return list(merged.values())


def table(doc: dict[str, Any]) -> list[str]:
    meta = doc["meta"]
    m, g, v = meta["machine"], meta["git"], meta["versions"]
    ref = doc.get("reference_engine", "sevenn")  # the reference's key in each row
    name = "sevenn" if ref == "sevenn" else "mace-torch"
    torch_threads = next(
        (r[ref]["torch_threads"] for r in doc["results"] if "torch_threads" in r.get(ref, {})),
        "–",
    )
    work = doc.get("work")
    if work:
        work_text = (
            f"Model work per call (forward + adjoint, cases.py): "
            f"{work['mlp_per_edge'] / 1e3:.0f} k (radial MLP) + "
            f"{work['tp_per_edge'] / 1e3:.0f} k (tensor product) MAC per edge, "
            f"{work['linear_per_node'] / 1e3:.0f} k MAC per atom, forward."
        )
    else:
        work_text = "No flop count for this family (cases.py counts SevenNet's work only)."
    ref_version = v.get(name, "–")
    source = (
        f" (reference model `{Path(doc['reference_source']).name}`)"
        if doc.get("reference_source")
        else ""
    )
    lines = [
        f"### {doc['model']} ({doc.get('family', 'sevennet')}) — {m['cpu']}, {m['nproc']} cores "
        f"({meta['date'][:16]})",
        "",
        f"commit `{g['commit'][:12]}`{' (dirty)' if g['dirty'] else ''}, e3fuse {v['e3fuse']}, "
        f"torch {v['torch']}, {name} {ref_version}{source}; e3fuse threads "
        f"{doc['settings']['threads'][0]}, torch threads "
        f"{torch_threads}; "
        f"loadavg at start {' '.join(f'{x:.1f}' for x in m['loadavg_start'])}. " + work_text,
        "",
        f"| case | dtype | edges | e3fuse ms (median / min) | {name} ms (median / min) | speedup "
        f"| e3fuse GFLOP/s | {name} GFLOP/s | CPU s/call e3fuse / {name} | e3fuse µs/atom "
        f"| peak MB e3fuse / {name} | max abs ΔF (eV/Å) | other load (cores) e3fuse / {name} |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["results"]:
        e, s = r.get("e3fuse", {}), r.get(ref, {})
        s_cell = (
            f"{_ms(_get(s, 'timed', 'median_s'))} / {_ms(_get(s, 'timed', 'min_s'))} "
            f"(n={_get(s, 'timed', 'repeats')})"
            if "timed" in s
            else ("skipped" if "skipped" in s else ("error" if "error" in s else "–"))
        )
        lines.append(
            "| "
            + " | ".join(
                [
                    r["case"],
                    r["dtype"],
                    f"{r['work']['num_edges']:,}",
                    f"{_ms(_get(e, 'rebuild', 'median_s'))} / {_ms(_get(e, 'rebuild', 'min_s'))}",
                    s_cell,
                    _num(r.get("speedup"), ".1f"),
                    _num(r.get("e3fuse_gflops"), ".1f"),
                    _num(r.get(f"{ref}_gflops"), ".2f"),
                    f"{_num(_get(e, 'rebuild', 'cpu_median_s'), '.2f')} / "
                    f"{_num(_get(s, 'timed', 'cpu_median_s'), '.2f')}",
                    _num(r.get("e3fuse_us_per_atom"), ",.0f"),
                    f"{_mb(e.get('peak_rss_growth_bytes'))} / "
                    f"{_mb(s.get('peak_rss_growth_bytes'))}",
                    _num(r.get("max_abs_dF"), ".1e"),
                    f"{_num(_get(e, 'rebuild', 'other_cores'), '.1f')} / "
                    f"{_num(_get(s, 'timed', 'other_cores'), '.1f')}",
                ]
            )
            + " |"
        )
    skipped = [
        f"{r['case']} {r['dtype']}: {r[ref]['skipped']}"
        for r in doc["results"]
        if "skipped" in r.get(ref, {})
    ]
    errors = [
        f"{r['case']} {r['dtype']} {k}: {r[k]['error']}"
        for r in doc["results"]
        for k in ("e3fuse", ref)
        if "error" in r.get(k, {})
    ]
    if skipped or errors:
        lines += [""] + [f"- {name} skipped, {x}" for x in skipped] + [f"- {x}" for x in errors]

    # e3fuse details: CPU time, neighbor-list reuse, thread scaling.
    lines += [
        "",
        "e3fuse detail: CPU seconds per call (all threads); model GFLOP per CPU-second (a rate "
        f"that contention from other processes barely affects; {name}'s in parentheses); "
        "time with the neighbor list reused (MD steady state); thread scaling (median ms at "
        "each thread count); executed GFLOP/s (with e3fuse's recomputation, cases.py).",
        "",
        f"| case | dtype | wall ms | CPU s | GFLOP per CPU-s ({name}) | reuse-list ms "
        "| threads: ms | executed GFLOP/s |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for r in doc["results"]:
        e = r.get("e3fuse", {})
        if "rebuild" not in e:
            continue
        scaling = ", ".join(
            f"{k}: {_ms(v['median_s'])}"
            for k, v in sorted(e.get("thread_scaling", {}).items(), key=lambda kv: int(kv[0]))
        )
        s_cpu = _get(r, ref, "timed", "cpu_median_s")
        if r["work"].get("model_flops"):
            flops = r["work"]["model_flops"] / 1e9
            rate = f"{flops / e['rebuild']['cpu_median_s']:.1f}" + (
                f" ({flops / s_cpu:.1f})" if s_cpu else ""
            )
        else:
            rate = "–"
        lines.append(
            f"| {r['case']} | {r['dtype']} | {_ms(e['rebuild']['median_s'])} | "
            f"{e['rebuild']['cpu_median_s']:.2f} | {rate} | {_ms(_get(e, 'reuse', 'median_s'))} | "
            f"{scaling} | {_num(r.get('e3fuse_executed_gflops'), '.1f')} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", type=Path)
    p.add_argument("--out", type=Path, default=HERE / "results" / "cpu_summary.md")
    args = p.parse_args(argv)
    files = args.files or sorted((HERE / "results").glob("cpu_*.json"))
    docs = merge([json.loads(f.read_text()) for f in files])
    lines = [
        "# CPU benchmark summary",
        "",
        "Generated by `benchmarks/summarize.py` from "
        + ", ".join(f"`{f.name}`" for f in files)
        + ". Time per energy+forces+stress call; e3fuse rebuilds its neighbor list in every "
        "timed call, as sevenn's calculator does. GFLOP/s = model flops (cases.py: forward + "
        "adjoint, no recompute) / median time, the same count for both engines. "
        "'other load' = cores kept busy by other processes during the timed calls "
        "(the machine is shared; > 0 inflates wall times).",
        "",
    ]
    for doc in docs:
        lines += table(doc) + ["", "Commands:", ""]
        lines += [f"    {c}" for c in doc["commands"]] + [""]
        lines += [f"- {n}" for n in doc["notes"]] + ([""] if doc["notes"] else [])
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
