"""Rows of ``domains_llm.py`` for recovery after pruning (``--recover``).

For each budget B of --recover (CPU seconds of this process: the issue's budget is of CPU
time, and a wall-clock budget would shrink whenever other processes share the cores), each
peak rate of --lr and each share of the hidden-state term of --hidden-weight: the pruned
SmolLM2, before compaction, optionally trained block by block towards the dense model's
blocks (``prunekit.reconstruct_blocks``, --reconstruct steps per block at
--reconstruct-lr), then compacted and distilled from the dense model
(``prunekit.recover(cpu_seconds=...)``, KL at temperature 1) for what is left of B. Both
use the recovery windows: --recover-windows windows of the calibration documents (the
pruning's own 8 when 0), never the evaluation documents. The note of each row gives the
distillation's steps, the CPU seconds of reconstruction and distillation together, and
their wall seconds.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import time
from collections.abc import Callable

from torch import Tensor, nn

import prunekit

Batches = list[dict[str, Tensor]]


def name(short: str, budget: float, lr: float, hidden: float, args: argparse.Namespace) -> str:
    """A recovery row's name: '35% 0.3 +600s 3e-4' then ' wN', ' hW', ' rS' as used."""
    rate = f"{lr:.0e}".replace("e-0", "e-")
    what = f"{short} +{budget:.0f}s {rate}"
    what += f" w{args.recover_windows}" if args.recover_windows else ""
    what += f" h{hidden:g}" if hidden else ""
    return what + (f" r{args.reconstruct}" if args.reconstruct else "")


def rows(
    args: argparse.Namespace,
    pruned: nn.Module,
    dense: nn.Module,
    example: dict[str, Tensor],
    batches: Batches,
    emit: Callable[[str, nn.Module, float, str], None],
    short: str,
) -> None:
    """One row per (budget, rate, hidden weight): `emit(name, model, started, note)`."""
    for budget, lr, hidden in itertools.product(args.recover, args.lr, args.hidden_weight):
        started = time.perf_counter()
        student = copy.deepcopy(pruned)
        wall, cpu = time.perf_counter(), time.process_time()
        if args.reconstruct:  # masked, with the dense model's shapes: before compaction
            prunekit.reconstruct_blocks(student, dense, batches, steps=args.reconstruct,
                                        lr=args.reconstruct_lr)  # fmt: skip
        prunekit.compact(student, example)  # smaller: less memory to train it
        left = budget - (time.process_time() - cpu)
        steps = 0
        if left > 0:
            distiller = prunekit.Distiller(dense, temperature=1.0, hidden_weight=hidden)
            done = prunekit.recover(student, distiller, batches, cpu_seconds=left, lr=lr)
            steps = done.steps
        used, spent = time.process_time() - cpu, time.perf_counter() - wall
        note = f"; {steps} steps, {used:.0f} CPU s, {spent:.0f} wall s"
        emit(name(short, budget, lr, hidden, args), student, started, note)
        del student
