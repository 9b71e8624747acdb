"""Rows of ``domains_llm.py`` for recovery after pruning (``--recover``).

For each budget B of --recover (CPU seconds of this process: the issue's budget is of CPU
time, and a wall-clock budget would shrink whenever other processes share the cores), each
peak rate of --lr and each share of the hidden-state term of --hidden-weight: the pruned
SmolLM2, compacted (its hidden width is not cut, so its blocks still take the dense
model's shapes, and a compacted block's step costs less than a masked one's), optionally
trained block by block towards the dense model's blocks (``prunekit.reconstruct_blocks``,
--reconstruct steps per block at --reconstruct-lr; with --reconstruct-seconds S, S CPU
seconds spread over the blocks, --reconstruct then only a cap), then distilled from the
dense model (``prunekit.recover(cpu_seconds=...)``, KL at temperature 1) for what is left
of B. Both use the recovery windows: --recover-windows windows of the calibration
documents (the pruning's own 8 when 0), never the evaluation documents; with
--reconstruct-windows N, the reconstruction takes N windows of their own (its passes over
every window before and after the steps cost time that more windows would eat, where the
distillation sees each window once). The note of each
row gives the distillation's steps, the reconstruction's steps per block and CPU seconds,
the CPU seconds of reconstruction and distillation together, and their wall seconds.
With --autocast bfloat16 both run inside ``torch.autocast("cpu", dtype=torch.bfloat16)``
(the row's name ' bf16'): a bfloat16 product is about twice as fast as a float32 one on CPUs
that have the instructions for it, so the same CPU seconds buy more steps; the weights stay
float32.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import time
from collections.abc import Callable

import torch
from torch import Tensor, nn

import prunekit

Batches = list[dict[str, Tensor]]


def name(short: str, budget: float, lr: float, hidden: float, args: argparse.Namespace) -> str:
    """A recovery row's name: '35% 0.3 +600s 3e-4' then ' wN', ' hW', ' rS', ' rwN' as used."""
    rate = f"{lr:.0e}".replace("e-0", "e-")
    what = f"{short} +{budget:.0f}s {rate}"
    what += f" w{args.recover_windows}" if args.recover_windows else ""
    what += f" h{hidden:g}" if hidden else ""
    if args.reconstruct_seconds:
        what += f" r{args.reconstruct_seconds:g}s"
    elif args.reconstruct:
        what += f" r{args.reconstruct}"
    what += f" rw{args.reconstruct_windows}" if args.reconstruct_windows else ""
    return what + (" bf16" if args.autocast == "bfloat16" else "")


def precision(args: argparse.Namespace) -> contextlib.AbstractContextManager[object]:
    """The context the recovery runs in: bfloat16 autocast with --autocast bfloat16."""
    if args.autocast == "bfloat16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def rows(
    args: argparse.Namespace,
    pruned: nn.Module,
    dense: nn.Module,
    example: dict[str, Tensor],
    windows: tuple[Batches, Batches],
    emit: Callable[[str, nn.Module, float, str], None],
    short: str,
) -> None:
    """One row per (budget, rate, hidden weight): `emit(name, model, started, note)`.
    `windows`: the distillation's batches and the reconstruction's."""
    batches, rebuilt_on = windows
    for budget, lr, hidden in itertools.product(args.recover, args.lr, args.hidden_weight):
        started = time.perf_counter()
        student = copy.deepcopy(pruned)
        wall, cpu = time.perf_counter(), time.process_time()
        prunekit.compact(student, example)  # smaller: less time and memory to train it
        rebuilt = ""
        steps = 0
        with precision(args):
            if args.reconstruct or args.reconstruct_seconds:
                rebuilt = reconstruct(args, student, dense, rebuilt_on)
            left = budget - (time.process_time() - cpu)
            if left > 0:
                distiller = prunekit.Distiller(dense, temperature=1.0, hidden_weight=hidden)
                done = prunekit.recover(student, distiller, batches, cpu_seconds=left, lr=lr)
                steps = done.steps
        used, spent = time.process_time() - cpu, time.perf_counter() - wall
        note = f"; {steps} steps{rebuilt}, {used:.0f} CPU s, {spent:.0f} wall s"
        emit(name(short, budget, lr, hidden, args), student, started, note)
        del student


def reconstruct(args: argparse.Namespace, student: nn.Module, dense: nn.Module,
                batches: Batches) -> str:  # fmt: skip
    """reconstruct_blocks on the compacted student; its steps per block and CPU seconds."""
    blocks = student.get_submodule("model.layers")
    assert isinstance(blocks, nn.ModuleList)
    calls = [0]
    hooks = [b.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
             for b in blocks]  # fmt: skip
    cpu = time.process_time()
    try:
        prunekit.reconstruct_blocks(
            student, dense, batches, steps=args.reconstruct or 1_000_000,
            lr=args.reconstruct_lr, cpu_seconds=args.reconstruct_seconds or None,
        )  # fmt: skip
    finally:
        for hook in hooks:
            hook.remove()
    per = calls[0] / len(blocks) - 2 * len(batches)  # a pass before and after the steps
    return f", r {per:.0f} steps/block in {time.process_time() - cpu:.0f} CPU s"
