"""The innermost loops of one kernel in nvdisasm's output, and what each iteration issues.

    nvdisasm -gi -c conv_backward_f32.cubin > all.sass
    python hot_loops.py all.sass --kernel 'conv_backward_kernelIfLi16ELb1ELi3ELi5E' [--min-ffma 20]

Static, no GPU: splits the kernel's SASS into basic blocks (branch targets, the listed targets
of BRX jump tables, the instruction after a branch), drops the divergent fallback paths (the
targets of BRA.DIV, and what only they reach), finds the natural loops (a back edge u -> h
where h dominates u) and prints each innermost loop with enough FFMA: its instructions per
iteration by kind, the FFMA share, and the local-memory loads (spill refills) it pays every
iteration. Then every local load and store of the kernel by loop depth, with the source line
(and the lines it was inlined at) that nvdisasm -gi attributes to it.

An iteration's count adds up both sides of any branch inside the loop, so it is an upper bound
where the loop body branches; the tensor-product edge loops of conv_kernels.cuh are straight.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import networkx as nx

SECTION = re.compile(r"\s*\.section\s+\.text\.(\S+),")
LABEL = re.compile(r"^(\.L_x_\d+):")
LINE = re.compile(r'//## File "(?:[^"]*/)?([^"/]+)", line (\d+)')
INSTRUCTION = re.compile(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)(.*)")
TARGET = re.compile(r"`\((\.L_x_\d+)\)")
JUMP_TABLE = re.compile(r'BRANCH_TARGETS ([^"]+)"')
BLOCK_ENDS = ("BRA", "BRX", "JMP", "JMX", "EXIT", "RET", "BREAK", "CALL")


@dataclass
class Instruction:
    opcode: str  # with its modifiers, e.g. LDL.LU
    predicated: bool
    operands: str  # the rest of the line, nvdisasm's annotations included
    lines: list[str] = field(default_factory=list)  # file:line, then where it was inlined

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]


def read_kernel(path: Path, kernel: str) -> tuple[str, list[Instruction], dict[str, int]]:
    """The first section whose symbol contains `kernel`: its instructions and label positions."""
    name = None
    code: list[Instruction] = []
    labels: dict[str, int] = {}
    lines: list[str] = []
    fresh = True
    for text in path.read_text().splitlines():
        section = SECTION.match(text)
        if section:
            if name is not None:
                break
            if kernel in section.group(1):
                name = section.group(1)
            continue
        if name is None:
            continue
        label = LABEL.match(text)
        if label:
            labels[label.group(1)] = len(code)
            continue
        line = LINE.search(text)
        if line:
            if fresh:
                lines, fresh = [], False
            lines.append(f"{line.group(1)}:{line.group(2)}")
            continue
        op = INSTRUCTION.match(text)
        if op:
            code.append(Instruction(op.group(2), op.group(1) is not None, op.group(3), list(lines)))
            fresh = True
    if name is None:
        raise SystemExit(f"no kernel matching {kernel!r} in {path}")
    return name, code, labels


@dataclass
class Loops:
    block_of: list[int]  # instruction -> block
    depth: Counter[int]  # block -> number of loops around it
    bodies: dict[int, set[int]]  # loop header block -> the blocks of its loop(s)
    hot: set[int]  # the blocks reached without a divergent fallback


def find_loops(code: list[Instruction], labels: dict[str, int]) -> Loops:
    starts = {0, *labels.values()}
    starts |= {i + 1 for i, ins in enumerate(code) if ins.base in BLOCK_ENDS}
    starts_sorted = sorted(s for s in starts if s < len(code))
    ends = [*starts_sorted[1:], len(code)]
    block_of = [0] * len(code)
    for b, (begin, end) in enumerate(zip(starts_sorted, ends)):
        block_of[begin:end] = [b] * (end - begin)

    def block_at(label: str) -> int | None:
        return block_of[labels[label]] if label in labels else None

    graph = nx.DiGraph()
    graph.add_nodes_from(range(len(starts_sorted)))
    for b, end in enumerate(ends):
        last = code[end - 1]
        divergent_only = last.opcode == "BRA.DIV"  # the fallback of a non-uniform warp
        targets: list[int | None] = []
        if last.base == "BRA" and not divergent_only:
            target = TARGET.search(last.operands)
            targets.append(block_at(target.group(1)) if target else None)
        elif last.base == "BRX":
            table = JUMP_TABLE.search(last.operands)
            targets += [block_at(t.strip()) for t in table.group(1).split(",")] if table else []
        graph.add_edges_from((b, t) for t in targets if t is not None)
        falls_through = last.base not in ("BRA", "BRX", "EXIT", "RET") or last.predicated
        if (falls_through or divergent_only) and b + 1 < len(starts_sorted):
            graph.add_edge(b, b + 1)
    hot = nx.descendants(graph, 0) | {0}
    graph = graph.subgraph(hot).copy()
    idom = nx.immediate_dominators(graph, 0)

    def dominates(a: int, b: int) -> bool:
        while a != b:
            if idom.get(b, b) == b:
                return False
            b = idom[b]
        return True

    bodies: dict[int, set[int]] = {}
    for u, h in graph.edges():
        if not dominates(h, u):
            continue
        body, stack = {h, u}, [u]
        while stack:
            n = stack.pop()
            if n == h:
                continue
            for p in graph.predecessors(n):
                if p not in body:
                    body.add(p)
                    stack.append(p)
        bodies.setdefault(h, set()).update(body)
    depth: Counter[int] = Counter()
    for body in bodies.values():
        depth.update(body)
    return Loops(block_of, depth, bodies, hot)


def report(path: Path, kernel: str, min_ffma: int) -> None:
    name, code, labels = read_kernel(path, kernel)
    loops = find_loops(code, labels)
    print(f"{name}\n{len(code)} instructions, {len(loops.bodies)} loops")
    innermost = [
        h for h, body in loops.bodies.items() if not any(o != h and o in body for o in loops.bodies)
    ]
    rows = []
    for h in innermost:
        members = [ins for ins, b in zip(code, loops.block_of) if b in loops.bodies[h]]
        kinds = Counter(ins.base for ins in members)
        if kinds["FFMA"] >= min_ffma:
            rows.append((len(members), h, kinds, members))
    rows.sort(key=lambda row: (-row[0], row[1]))
    print(f"\ninnermost loops with >= {min_ffma} FFMA, instructions per iteration:")
    print(f"{'depth':>5} {'all':>5} {'FFMA':>5} {'share':>6} {'FMUL+FADD':>9} {'LDS':>4} ", end="")
    print(f"{'LDG':>4} {'LDL':>4} {'SHFL':>4}  where most of its FFMA sit (file:line < inlined at)")
    total: Counter[str] = Counter()
    for n, h, kinds, members in rows:
        where = Counter(
            " < ".join(ins.lines[:3]) for ins in members if ins.base == "FFMA"
        ).most_common(1)[0][0]
        print(
            f"{loops.depth[h]:>5} {n:>5} {kinds['FFMA']:>5} {kinds['FFMA'] / n:>6.0%} "
            f"{kinds['FMUL'] + kinds['FADD']:>9} {kinds['LDS']:>4} {kinds['LDG']:>4} "
            f"{kinds['LDL']:>4} {kinds['SHFL']:>4}  {where}"
        )
        total.update(kinds)
        total["all"] += n
    if rows:
        print(
            f"{'sum':>5} {total['all']:>5} {total['FFMA']:>5} {total['FFMA'] / total['all']:>6.0%} "
            f"{total['FMUL'] + total['FADD']:>9} {total['LDS']:>4} {total['LDG']:>4} "
            f"{total['LDL']:>4} {total['SHFL']:>4}"
        )
    local: Counter[tuple[int, str, str]] = Counter()
    for i, ins in enumerate(code):
        if ins.base in ("LDL", "STL") and loops.block_of[i] in loops.hot:
            depth = loops.depth[loops.block_of[i]]
            local[(depth, ins.opcode, " < ".join(ins.lines[:3]))] += 1
    print("\nlocal loads and stores on the non-divergent paths, by loop depth:")
    for (depth, opcode, where), count in sorted(local.items(), key=lambda kv: (-kv[0][0], kv[0])):
        print(f"  depth {depth}  {count:>3} x {opcode:<8} {where}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sass", type=Path, help="nvdisasm -gi -c output")
    parser.add_argument("--kernel", required=True, help="a substring of the kernel's symbol")
    parser.add_argument("--min-ffma", type=int, default=20, help="loops with fewer are left out")
    args = parser.parse_args()
    report(args.sass, args.kernel, args.min_ffma)


if __name__ == "__main__":
    main()
