"""Rewrites sevenn checkpoints without their training state (optimizer and scheduler), in place,
for the device carries (scripts/slim_carry.sh, scripts/carry_may2024.sh): SevenNet-l3i5's
14.3 MB checkpoint holds 9.4 MB of Adam moments. sevenn reads both with .get(..., {}) and
inference and e3fuse's converter read only the model's state and config, so the results do
not change. Needs torch and sevenn (the config is pickled with sevenn's types)."""

from __future__ import annotations

import sys

import torch


def main(paths: list[str]) -> None:
    for path in paths:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
        if checkpoint.get("optimizer_state_dict") or checkpoint.get("scheduler_state_dict"):
            checkpoint["optimizer_state_dict"], checkpoint["scheduler_state_dict"] = {}, {}
            torch.save(checkpoint, path)
            print(f"stripped the training state of {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
