"""Rows of ``domains_llm.py`` for the hidden width by rotation (``--rotate``).

For each hidden share H of --rotate: ``rotate_hidden(model, calibration, H)`` alone, then for
each target T of --rotate-targets that the rotation alone does not reach, the rotated model
pruned further by ``prune_channels`` with a ``Budget`` over MLP widths and query heads
(activation, compensate) so that T of the dense model's non-embedding parameters go in all.
Non-embedding parameters here are the decoder blocks' and the final norm's: the embedding and
the head are left out (the head the rotation unties from the embedding too).
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable
from typing import Any, cast

from torch import Tensor, nn

import prunekit


def body_params(model: nn.Module) -> int:
    """The parameters of the decoder blocks and the final norm."""
    base: Any = cast(Any, model).model
    return int(sum(p.numel() for p in base.layers.parameters()) + base.norm.weight.numel())


def rows(
    args: argparse.Namespace,
    model: nn.Module,
    batches: list[dict[str, Tensor]],
    measure: Callable[[nn.Module], dict[str, float]],
    names: list[str],
    compensation: dict[str, Any],
) -> None:
    """Print one row per rotation and per rotation + channel budget."""
    dense = body_params(model)
    for share in args.rotate:
        started = time.perf_counter()
        rotated = copy.deepcopy(model)
        report = prunekit.rotate_hidden(rotated, batches, share, round_to=args.rotate_round_to,
                                        compensate=args.rotate_compensate,
                                        unit_tokens=not args.rotate_raw)  # fmt: skip
        seconds = time.perf_counter() - started
        gone = 1.0 - body_params(rotated) / dense
        fit = ("+fit" if args.rotate_compensate else "") + ("+raw" if args.rotate_raw else "")
        label = f"rot{fit} {report.width_after}/{report.width_before} ({gone:.0%})"
        _print(label, measure(rotated), names, started)
        print(f"    energy kept {report.energy:.4f}; params {report.params_before:,} "
              f"-> {report.params_after:,} (untied: {report.untied}); {seconds:.0f} s")  # fmt: skip
        for target in args.rotate_targets:
            if target <= gone + 0.005:
                continue
            started = time.perf_counter()
            pruned: Any = copy.deepcopy(rotated)
            after = body_params(pruned)
            counted = after + (pruned.lm_head.weight.numel() if report.untied else 0)
            want = (target * dense - (dense - after)) / counted
            example = {"input_ids": batches[0]["input_ids"][:, :32]}
            budget = prunekit.Budget(params=want, kinds=("channels", "heads"))
            prunekit.prune_channels(
                pruned, example, budget=budget, criterion=args.criterion, calibration=batches,
                round_to=args.round_to, **compensation,
            )  # fmt: skip
            prunekit.compact(pruned, example)
            total = 1.0 - body_params(pruned) / dense
            label = f"{target:.0%} rot{fit} {report.width_after} ({total:.1%})"
            _print(label, measure(pruned), names, started)
            del pruned
        del rotated


def _print(label: str, ratios: dict[str, float], names: list[str], started: float) -> None:
    worst = max(names, key=lambda n: ratios[n])
    row = f"{label:<24}" + "".join(f"{ratios[n]:>9.2f}x" for n in names)
    row += f"{ratios[worst]:>8.2f}x {worst:<9}"
    print(row + f" ({time.perf_counter() - started:.0f} s)", flush=True)
