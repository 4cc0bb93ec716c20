"""Basic blocks of one kernel from ncu's source page (--page source --csv --print-source sass).

    python blocks.py 7net-l3i5_backward_sass.csv [--top 40]

Splits the SASS at branch targets and after branches, and prints per block: its executed warp
instructions (share of the kernel), stall samples, length, how often it ran, and its mix
(FFMA, shared loads, global loads, shuffles, integer and control instructions), the hottest
blocks first; then the kernel's totals by kind.
"""

from __future__ import annotations

import argparse
import csv
import re
from collections import Counter
from pathlib import Path

KINDS = {
    "ffma": ("FFMA", "FMUL", "FADD", "FSEL", "FMNMX"),
    "lds": ("LDS",),
    "sts": ("STS", "ATOMS"),
    "ldg": ("LDG", "LD", "LDL", "STL", "STG", "RED", "ATOM"),
    "shfl": ("SHFL",),
    "ctrl": ("BRA", "BSSY", "BSYNC", "BAR", "EXIT", "CALL", "RET", "WARPSYNC", "BRX", "JMP"),
}


def kind(op: str) -> str:
    for k, ops in KINDS.items():
        if op in ops:
            return k
    return "int" if op[0] in "ILSUPM" or op in ("MOV", "SEL", "LEA", "LOP3", "SHF") else "other"


def opcode(text: str) -> str:
    text = re.sub(r"^@!?U?P\w+\s+", "", text.strip())
    return text.split()[0].split(".")[0] if text else "?"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", type=Path)
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    rows = list(csv.reader(args.csv.open()))
    head = rows[1]
    col = {h: i for i, h in enumerate(head)}

    def num(r: list[str], k: str) -> float:
        try:
            return float(r[col[k]].replace(",", ""))
        except (KeyError, ValueError):
            return 0.0

    ins = []
    for r in rows[2:]:
        addr = int(r[col["Address"]], 16)
        text = r[col["Source"]].strip()
        executed = num(r, "Instructions Executed")
        ins.append((addr, text, executed, num(r, "Warp Stall Sampling (All Samples)")))
    base = ins[0][0]
    targets = set()
    for _, text, _, _ in ins:
        m = re.search(r"\b(?:BRA|BSSY|CALL\.REL(?:\.NOINC)?|JMP)\b.*?(0x[0-9a-f]+)", text)
        if m:
            targets.add(int(m.group(1), 16))
    starts = {0}
    for i, (addr, text, _, _) in enumerate(ins):
        if addr in targets or addr - base in targets:
            starts.add(i)
        if opcode(text) in ("BRA", "EXIT", "RET", "CALL", "BRX", "JMP") and i + 1 < len(ins):
            starts.add(i + 1)
    order = sorted(starts) + [len(ins)]
    total = sum(x[2] for x in ins)
    samples = sum(x[3] for x in ins)
    blocks = []
    for a, b in zip(order, order[1:]):
        mix = Counter()
        for _, text, n, _ in ins[a:b]:
            mix[kind(opcode(text))] += n
        execd = sum(x[2] for x in ins[a:b])
        blocks.append((execd, sum(x[3] for x in ins[a:b]), ins[a][0] - base, b - a, ins[a][2], mix))
    print(
        f"{args.csv.name}: {len(ins)} instructions, {total:.4g} warp instructions executed, "
        f"{samples:.4g} stall samples, {len(blocks)} blocks"
    )
    print(f"{'offset':>8} {'inst%':>6} {'samp%':>6} {'len':>5} {'runs':>10}  mix (% of the block)")
    for execd, samp, off, length, runs, mix in sorted(blocks, key=lambda b: -b[0])[: args.top]:
        share = " ".join(f"{k} {100 * v / execd:.0f}" for k, v in mix.most_common() if v and execd)
        print(
            f"{off:8x} {100 * execd / total:6.2f} {100 * samp / samples:6.2f} {length:5d} "
            f"{runs:10.4g}  {share}"
        )
    mix = Counter()
    for b in blocks:
        mix.update(b[5])
    print("kernel: " + " ".join(f"{k} {100 * v / total:.1f}%" for k, v in mix.most_common()))


if __name__ == "__main__":
    main()
