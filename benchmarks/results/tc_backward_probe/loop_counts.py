"""Instructions per edge of each tc_backward_micro kernel, counted in its SASS: the body of the
kernel's edge loop (the widest backward branch before the kernel's last EXIT; the slow paths
of warp-divergent branches sit after it), by opcode.

    cuobjdump -sass tc_backward_micro.o > micro.sass
    python loop_counts.py micro.sass
"""

from __future__ import annotations

import collections
import re
import sys

KERNEL = re.compile(r"(fma|tc|tc_force)_backward_kernelILi(\d)ELi(\d)E")
INSTRUCTION = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)(.*);")


def loop_bodies(sass: str) -> dict[tuple[str, int, int], collections.Counter[str]]:
    """(variant, d1, d3) -> opcode counts of the kernel's edge loop."""
    out: dict[tuple[str, int, int], collections.Counter[str]] = {}
    for function in re.split(r"\n\s*Function : ", sass)[1:]:
        name = KERNEL.search(function.split("\n", 1)[0])
        if not name:
            continue
        code = []
        for line in function.splitlines():
            m = INSTRUCTION.match(line)
            if m:
                code.append((int(m.group(1), 16), m.group(3).split(".")[0], m.group(4)))
        last_exit = max(at for at, op, _ in code if op == "EXIT")
        loops = []
        for at, op, rest in code:
            target = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
            if target and int(target.group(1), 16) < at < last_exit:
                loops.append((int(target.group(1), 16), at))
        begin, end = max(loops, key=lambda loop: loop[1] - loop[0])
        body = collections.Counter(op for at, op, _ in code if begin <= at <= end)
        out[(name.group(1), int(name.group(2)), int(name.group(3)))] = body
    return out


def main() -> None:
    bodies = loop_bodies(open(sys.argv[1]).read())
    print(
        "| d1 | d3 | fma (FFMA) | tc (HMMA, FFMA) | tc / fma "
        "| tc_force (HMMA, FFMA) | tc_force / fma |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for d1 in (1, 3, 5, 7):
        for d3 in (1, 3, 5, 7):
            fma, tc, force = (bodies[(v, d1, d3)] for v in ("fma", "tc", "tc_force"))
            n = {v: sum(c.values()) for v, c in (("fma", fma), ("tc", tc), ("force", force))}
            print(
                f"| {d1} | {d3} | {n['fma']} ({fma['FFMA']}) | {n['tc']} ({tc['HMMA']}, "
                f"{tc['FFMA']}) | {n['tc'] / n['fma']:.2f} | {n['force']} ({force['HMMA']}, "
                f"{force['FFMA']}) | {n['force'] / n['fma']:.2f} |"
            )
    for variant in ("fma", "tc", "tc_force"):
        mix = ", ".join(f"{op} {k}" for op, k in bodies[(variant, 7, 7)].most_common(12))
        print(f"\n{variant} (7, 7): {mix}")


if __name__ == "__main__":
    main()
