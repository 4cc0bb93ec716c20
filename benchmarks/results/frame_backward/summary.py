"""Per-layer medians of one frame_backward_micro JSON (--json-out): engine and frame ms, their
ratio, and the largest relative difference of the outputs. Used by run_ahead.sh and
run_with_tests.sh:

    python3 benchmarks/results/frame_backward/summary.py frame_7net-l3i5_32000_ec8_ahead1.json
"""

import json
import statistics
import sys

path = sys.argv[1]
with open(path) as f:
    record = json.load(f)
print(path.rsplit("/", 1)[-1])
for layer in record["layers"]:
    e = statistics.median(layer["engine_ms"])
    t = statistics.median(layer["frame_ms"])
    diff = max(layer["relative_difference"].values())
    times = f"engine {e:.3f} frame {t:.3f} ({t / e:.3f})"
    print(f"  layer {layer['layer']}: {times} max diff {diff:.1e}")
