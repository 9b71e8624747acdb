"""What a busy core costs prunekit and torch: every layer of a CNN with ResNet-18's weight
shapes pruned by one ``l1_unstructured`` call each, by torch.nn.utils.prune and by
prunekit, on a quiet machine and with a spinning process beside it, in one run.

Each round times both libraries quiet, starts a process that spins (a Python loop, one
core), times both again, and stops it; *slowdown* is the median busy time over the median
quiet time. Both run with torch's thread count (``torch.get_num_threads()``), which
prunekit's selection takes too (prunekit.select.tuning).

    python benchmarks/threads.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunekit


def resnet18_shapes() -> nn.Sequential:
    torch.manual_seed(1)
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7)]
    channels = 64
    for stage in (64, 128, 256, 512):
        for _ in range(4):
            layers.append(nn.Conv2d(channels, stage, 3))
            channels = stage
    layers.append(nn.Linear(channels, 1000))
    return nn.Sequential(*layers)


def timed(prune: Callable[..., object], base: nn.Sequential) -> float:
    model = copy.deepcopy(base)
    start = time.perf_counter()
    for layer in model:
        prune(layer, "weight", amount=0.3)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    base = resnet18_shapes()
    libraries = {"torch": torch_prune.l1_unstructured, "prunekit": prunekit.l1_unstructured}
    for prune in libraries.values():  # warm: pools, caches
        timed(prune, base)
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for state in ("quiet", "busy"):
            spinner = None
            if state == "busy":
                spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                time.sleep(0.3)
            try:
                for name, prune in libraries.items():
                    times.setdefault((name, state), []).append(timed(prune, base))
            finally:
                if spinner is not None:
                    spinner.kill()
                    spinner.wait()
    weights = sum(m.weight.numel() for m in base)
    print(
        f"ResNet-18 shapes: {len(base)} layers, {weights:,} weights; torch threads "
        f"{torch.get_num_threads()}; median of {args.rounds} rounds"
    )
    print(f"{'library':<10}{'quiet s':>10}{'busy s':>10}{'slowdown':>10}")
    for name in libraries:
        quiet = statistics.median(times[(name, "quiet")])
        busy = statistics.median(times[(name, "busy")])
        print(f"{name:<10}{quiet:>10.3f}{busy:>10.3f}{busy / quiet:>10.2f}")


if __name__ == "__main__":
    main()
