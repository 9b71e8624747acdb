"""What a busy core costs prunekit and torch: every layer of a CNN with ResNet-18's weight
shapes pruned by one ``l1_unstructured`` call each, by torch.nn.utils.prune and by
prunekit, on a quiet machine and with a spinning process beside it, in one run.

Each round times every library quiet, then beside a process that spins (a Python loop, one
core) started in a session of its own, then beside one started in this process's session,
stopping each spinner after its timings; the libraries take turns going first. *slowdown*
is the median busy time over the median quiet time (*rounds*: the least and greatest of
each round's own busy over quiet, the spread); *cpu* is the process's CPU time (all
its threads) in the same calls, so a slowdown with the same CPU time is time spent waiting
for a core, not work. Both libraries run with torch's thread count
(``torch.get_num_threads()``), which prunekit takes for large tensors and cuts to one for
small ones (prunekit.select.tuning.threads_for); *torch, 1 thread* is torch's side on one
thread, the control that tells a cost of the thread count from a cost of the library.

Why two spinners: where Linux groups processes by session for scheduling (autogroup, on by
default in most distributions), a spinner in the benchmark's own session takes its share
of the CPU out of the benchmark's group, and on a machine that other sessions load, that
halves what a one-thread process gets. A spinner in a session of its own is another
program's busy core, the case the figures are for; the other is printed beside it.

Each timing prunes as many copies of the model one after the other as make it last about
`--least` seconds (times are per copy), so that prunekit's short calls are not timed by the
luck of a few time slices on a loaded machine.

    python benchmarks/threads.py [--rounds 7] [--least 1.0]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunekit
from prunekit.select.tuning import torch_threads

Prune = Callable[..., object]
STATES = {"quiet": None, "busy": True, "same session": False}  # spinner: own session?
# torch's OpenMP threads spin for a while after each parallel operation (libgomp's default
# wait policy; about 7 ms of CPU on this project's machine) before they sleep. The copy made
# before each timing is such an operation, and no library's work: its threads would spin
# inside the timing and, with one core busy, take the free core's time from the library's.
SETTLE = 0.1


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


def torch_one_thread(module: nn.Module, name: str, amount: float) -> None:
    with torch_threads(1):
        torch_prune.l1_unstructured(module, name, amount=amount)


def timed(prune: Prune, base: nn.Sequential, repeat: int = 1) -> tuple[float, float]:
    """Wall and CPU seconds of pruning a copy of `base`, layer by layer: the mean over
    `repeat` copies pruned one after the other in one timing."""
    models = [copy.deepcopy(base) for _ in range(repeat)]
    time.sleep(SETTLE)  # the copies' own OpenMP threads spin down first (see SETTLE)
    wall, cpu = time.perf_counter(), time.process_time()
    for model in models:
        for layer in model:
            prune(layer, "weight", amount=0.3)
    return (time.perf_counter() - wall) / repeat, (time.process_time() - cpu) / repeat


def spinner(own_session: bool | None) -> subprocess.Popen[bytes] | None:
    if own_session is None:
        return None
    process = subprocess.Popen(
        [sys.executable, "-c", "while True: pass"], start_new_session=own_session
    )
    time.sleep(0.3)
    return process


def measure(
    libraries: dict[str, Prune], repeats: dict[str, int], base: nn.Sequential, rounds: int
) -> dict[tuple[str, str], list[tuple[float, float]]]:
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    names = list(libraries)
    for index in range(rounds):
        turn = names[index % len(names) :] + names[: index % len(names)]
        for state, own_session in STATES.items():
            process = spinner(own_session)
            try:
                for name in turn:
                    sample = timed(libraries[name], base, repeats[name])
                    times.setdefault((name, state), []).append(sample)
            finally:
                if process is not None:
                    process.kill()
                    process.wait()
    return times


def spread(busy: list[tuple[float, float]], quiet: list[tuple[float, float]]) -> str:
    """The least and the greatest of the rounds' own slowdowns (busy over quiet, wall)."""
    ratios = [b / q for (b, _), (q, _) in zip(busy, quiet, strict=True)]
    return f"{min(ratios):.2f}-{max(ratios):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--least", type=float, default=1.0, help="seconds per timing, about")
    args = parser.parse_args()
    base = resnet18_shapes()
    libraries: dict[str, Prune] = {
        "torch": torch_prune.l1_unstructured,
        "torch, 1 thread": torch_one_thread,
        "prunekit": prunekit.l1_unstructured,
    }
    # warm (pools, caches), then as many copies per timing as make it last about `--least`
    # seconds: a short timing on a loaded machine is mostly the luck of its time slices
    warm = {name: timed(prune, base)[0] for name, prune in libraries.items()}
    repeats = {name: max(1, round(args.least / seconds)) for name, seconds in warm.items()}
    load = os.getloadavg()[0]
    times = measure(libraries, repeats, base, args.rounds)
    weights = sum(p.numel() for n, p in base.named_parameters() if n.endswith("weight"))
    print(
        f"ResNet-18 shapes: {len(base)} layers, {weights:,} weights; torch threads "
        f"{torch.get_num_threads()}; median of {args.rounds} rounds; load average "
        f"{load:.1f} before, {os.getloadavg()[0]:.1f} after; copies per timing "
        + ", ".join(f"{name} {count}" for name, count in repeats.items())
    )
    print(
        f"{'library':<17}{'quiet s':>8}{'busy s':>8}{'slowdown':>9}"
        f"{'same session s':>16}{'slowdown':>9}{'cpu quiet s':>12}{'cpu busy s':>11}"
        f"{'rounds':>12}"
    )
    for name in libraries:
        wall = {s: statistics.median(w for w, _ in times[(name, s)]) for s in STATES}
        cpu = {s: statistics.median(c for _, c in times[(name, s)]) for s in STATES}
        print(
            f"{name:<17}{wall['quiet']:>8.3f}{wall['busy']:>8.3f}"
            f"{wall['busy'] / wall['quiet']:>9.2f}{wall['same session']:>16.3f}"
            f"{wall['same session'] / wall['quiet']:>9.2f}{cpu['quiet']:>12.3f}{cpu['busy']:>11.3f}"
            f"{spread(times[(name, 'busy')], times[(name, 'quiet')]):>12}"
        )


if __name__ == "__main__":
    main()
