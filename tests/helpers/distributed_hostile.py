"""Hostile cases for the multi-process tests: one rank called with other arguments, one rank
failing (before the first collective or between two), a rank that never makes the call.

Every rank must raise the same clear error, its model (or its statistics) left bit for
bit as it was. The calls go through a group whose waits are bounded by `BOUND` seconds: a
rank left waiting would end in RanksTimeout instead of the expected error, and the case
fails; each case's seconds are checked against the bound too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
from torch import nn

import prunekit
from helpers import distributed_calibration as calibrated
from prunekit.distributed.collectives import TorchGroup

BOUND = 20.0  # seconds a rank may wait for the others in these cases
LATE = 1.5  # the bound of the case where a rank never comes


class Failing(prunekit.Magnitude):
    """Magnitude on every rank but rank 1, where its scores raise (a bug of the criterion)."""

    def scores(self, values: torch.Tensor, target: Any = None) -> torch.Tensor:
        if torch.distributed.get_rank() == 1:
            raise RuntimeError("the criterion failed on purpose")
        return values


class Misshapen(prunekit.Magnitude):
    """Magnitude on every rank but rank 1, where its scores are flat (the wrong shape)."""

    def scores(self, values: torch.Tensor, target: Any = None) -> torch.Tensor:
        return values.reshape(-1) if torch.distributed.get_rank() == 1 else values


def _weights(model: nn.Module) -> list[tuple[nn.Module, str]]:
    return [(m, "weight") for m in model.modules() if isinstance(m, nn.Linear)]


def _global(amount: float, **options: Any) -> Callable[[nn.Module, Any], Any]:
    method = options.pop("method", prunekit.L1Unstructured)

    def call(model: nn.Module, group: Any) -> Any:
        return prunekit.global_unstructured(
            _weights(model), method, amount=amount, process_group=group, **options
        )

    return call


def _model(amount: Any = 0.5, **options: Any) -> Callable[[nn.Module, Any], Any]:
    def call(model: nn.Module, group: Any) -> Any:
        given = dict(options)
        if "calibration" not in given and given.get("method") != "l1":
            given["calibration"] = calibrated.batches(group.rank, group.size)
        return prunekit.prune_model(model, amount, process_group=group, **given)

    return call


def _on(rank: int, odd: Any, usual: Any) -> Any:
    return odd if torch.distributed.get_rank() == rank else usual


def _cases(rank: int) -> dict[str, Callable[[nn.Module, Any], Any]]:
    """Each case's call on this rank (rank 1 is the odd one)."""
    odd = rank == 1
    return {
        "amount": _global(0.9 if odd else 0.5),
        "wanda_amount": _model(0.25 if odd else 0.5, method="wanda"),
        "sparsegpt_pattern": _model(
            method="sparsegpt", sequential=False, pattern="row" if odd else "2:4"
        ),
        "method": _model(method="sparsegpt" if odd else "wanda"),
        "bad_amount": _global(1.5 if odd else 0.5),
        "glob": _model(method="l1", scope="global", include="nowhere.*" if odd else "*"),
        "no_calibration": _model(method="wanda", **({"calibration": None} if odd else {})),
        "criterion_raises": _global(0.5, method=prunekit.Pruning, criterion=Failing()),
        "criterion_shape": _global(0.5, method=prunekit.Pruning, criterion=Misshapen()),
        "other_call": (
            (lambda model, group: prunekit.all_reduce_statistics({"a": torch.ones(1)}, group))
            if odd
            else _global(0.5)
        ),
    }


# What every rank's error must say (rank 1's own error where it is a bug: see check).
EXPECTED = {
    "amount": ("ValueError", "amount: 0.5 on rank(s) [0, 2, 3], 0.9 on rank(s) [1]"),
    "wanda_amount": ("ValueError", "amount: 0.5 on rank(s) [0, 2, 3], 0.25 on rank(s) [1]"),
    "sparsegpt_pattern": (
        "ValueError",
        "pattern: '2:4' on rank(s) [0, 2, 3], 'row' on rank(s) [1]",
    ),
    "method": ("ValueError", "method: 'wanda' on rank(s) [0, 2, 3], 'sparsegpt' on rank(s) [1]"),
    "bad_amount": ("ValueError", "rank(s) [1] of the"),
    "glob": ("ValueError", "nowhere.*"),
    "no_calibration": ("ValueError", "needs calibration data"),
    "criterion_raises": ("RuntimeError", "the criterion failed on purpose"),
    "criterion_shape": ("ValueError", "returned shape"),
    "other_call": (
        "ValueError",
        "call: 'global_unstructured' on rank(s) [0, 2, 3], 'all_reduce_statistics' on rank(s) [1]",
    ),
}
BUGS = {"criterion_raises"}  # rank 1's error is not the caller's: it raises it as it is
WEIGHTS: list[Any] = [math.inf, math.nan, -1.0, "many"]
NAMES = [*EXPECTED, "weights", "late"]


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _unchanged(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    after = model.state_dict()
    return after.keys() == before.keys() and all(
        after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items()
    )


def _attempt(call: Callable[[], Any], unchanged: Callable[[], bool]) -> dict[str, Any]:
    began = time.monotonic()
    try:
        call()
    except Exception as error:
        return {
            "type": type(error).__name__,
            "message": str(error),
            "unchanged": unchanged(),
            "seconds": time.monotonic() - began,
        }
    return {"type": None, "message": "no error", "unchanged": unchanged(), "seconds": 0.0}


def run(name: str, rank: int, world: int) -> Any:
    """This rank's outcome of case `name` (see check)."""
    group = TorchGroup(torch.distributed.group.WORLD, timeout=BOUND)
    if name == "weights":
        found = []
        for w in WEIGHTS:
            stats = {"h": torch.eye(3) * (rank + 1)}
            given = w if rank == 1 else 1.0
            call = lambda: prunekit.all_reduce_statistics(stats, group, weight=given)  # noqa: B023,E731
            found.append(_attempt(call, lambda: torch.equal(stats["h"], torch.eye(3) * (rank + 1))))  # noqa: B023
        return found
    model = calibrated.build()
    before = _state(model)
    unchanged = lambda: _unchanged(model, before) and not prunekit.is_pruned(model)  # noqa: E731
    if name == "late":  # the last rank never calls: the others wait LATE seconds at most
        sub = torch.distributed.new_group(timeout=timedelta(seconds=10))
        found = {"type": None, "message": "not called", "unchanged": True, "seconds": 0.0}
        if rank != world - 1:
            late = TorchGroup(sub, timeout=LATE)
            found = _attempt(lambda: _global(0.5)(model, late), unchanged)
        torch.distributed.barrier()  # the default group is still in step
        return found
    call = _cases(rank)[name]
    return _attempt(lambda: call(model, group), unchanged)


def check(name: str, found: list[Any]) -> list[str]:
    """What is wrong with the ranks' outcomes of case `name` (nothing: an empty list)."""
    failures = []
    if name == "weights":
        for i, w in enumerate(WEIGHTS):
            failures += _same(f"weights ({w!r})", [f[i] for f in found], "weight", None)
        return failures
    if name == "late":
        for r, f in enumerate(found[:-1]):
            ok = f["type"] == "RanksTimeout" and f["unchanged"] and f["seconds"] < LATE + 5
            if not ok or f"timeout of {LATE:g} s" not in f["message"]:
                failures.append(f"late, rank {r}: {f}")
        return failures
    kind, text = EXPECTED[name]
    if len(found) != 4:  # the texts name ranks 0, 2 and 3
        text = text.replace("[0, 2, 3]", "[0]")
    return _same(name, found, text, kind, name in BUGS)


def _same(name: str, found: list[Any], text: str, kind: str | None, bug: bool = False) -> list[str]:
    """Every rank raised, promptly, the same error saying `text`, and changed nothing;
    with `bug`, rank 1 raises its own error (a bug stays a bug), the others the same."""
    failures = []
    messages = {f["message"] for r, f in enumerate(found) if not (bug and r == 1)}
    if bug and "rank(s) [1] of the" in found[1]["message"]:
        failures.append(f"{name}, rank 1 did not raise its own error: {found[1]}")
    for r, f in enumerate(found):
        ok = f["unchanged"] and f["seconds"] < BOUND and text in f["message"]
        if not ok or (kind is not None and f["type"] != kind) or f["type"] is None:
            failures.append(f"{name}, rank {r}: {f}")
    if len(messages) != 1:
        failures.append(f"{name}: the ranks raised different errors: {sorted(messages)}")
    return failures
