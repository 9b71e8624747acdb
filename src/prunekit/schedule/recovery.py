"""Recovery in a budget of time: a pruned student distilled from the dense teacher for so many
seconds, CPU seconds or steps, with a learning rate that follows the budget.

``recover`` runs AdamW over the student's trainable parameters, one batch per step in turn,
with the loss a ``Distiller`` makes. The learning rate warms up linearly over the first
`warmup` steps and then decays along a cosine from `lr` to 0 over the *share of the budget
used*: elapsed seconds over `seconds`, the process's CPU seconds over `cpu_seconds`, or
steps taken over `steps`, whichever is furthest on. A budget of CPU time does not shrink
when other processes share the cores (the wall clock runs on while the process waits).
So a short budget is not cut off at its highest learning rate, and a long one is not spent
at its lowest: the schedule is the one for the time given, however fast the machine is.
Masked entries stay masked (a mask multiplies the stored weight, so their gradient is zero
and no weight decay moves them): the student compacts exactly afterwards, as before.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from prunekit.calibrate import batch_list, is_callers
from prunekit.core.autocast import fresh_casts
from prunekit.core.checks import (
    check_number,
    check_rate,
    refuse_float16,
    refuse_not_finite,
    refuse_shared,
)
from prunekit.core.errors import type_error, value_error
from prunekit.core.nested import described, first_not_finite
from prunekit.core.signature import takes_keyword
from prunekit.core.transaction import transaction
from prunekit.schedule.distill import (
    Distiller,
    Inputs,
    Output,
    _logits,
    _split,
    without_labels,
)

__all__ = ["Recovery", "recover"]

_OWNER = "recover"
_FIRST = "batches on which both models compute finite outputs"
# a teacher sharing a parameter with the student, refused (core.checks.refuse_shared)
_TEACHER = f"{_OWNER}: invalid distiller: its teacher"
_APART = (
    "which is trained here, so the teacher would move with it (a model distilled from "
    "itself); expected a separate teacher, e.g. copy.deepcopy(model) made before pruning"
)


@dataclass(frozen=True)
class Recovery:
    """What a run of recover did: its steps, their seconds and losses.

    Attributes:
        steps: the optimizer steps taken.
        seconds: their wall-clock time.
        cpu_seconds: the CPU time of this process meanwhile (all its threads).
        losses: the loss of each step, before its update.
    """

    steps: int
    seconds: float
    cpu_seconds: float
    losses: tuple[float, ...]


def recover(
    student: nn.Module,
    distiller: Distiller,
    batches: Iterable[Inputs],
    *,
    seconds: float | None = None,
    steps: int | None = None,
    lr: float = 1e-4,
    warmup: int = 10,
    cpu_seconds: float | None = None,
) -> Recovery:
    """Distil a pruned student from the dense teacher within a budget of time or steps.

    Args:
        student: the pruned model (masked or compacted); trained in place, left in eval mode.
        distiller: the teacher and the loss (its `hidden_weight` asks both forwards for
            their hidden states).
        batches: what the student's forward takes (a tensor, a tuple of positional
            arguments or a mapping of keywords each), used one per step in turn.
        seconds: stop once this much wall-clock time has passed (a float > 0); the cosine
            follows elapsed time over it.
        steps: stop after this many steps (an int >= 1); the cosine follows the steps over
            it. At least one of `seconds`, `cpu_seconds` and `steps` is given; with several,
            whichever ends first.
        lr: AdamW's peak learning rate, finite and > 0.
        warmup: steps of linear warm-up to `lr` (an int >= 0).
        cpu_seconds: stop once this process has used this much CPU time meanwhile (all
            its threads; a finite float > 0); the cosine follows it.

    Returns:
        The steps taken, their wall and CPU seconds and the loss of each.

    Under ``torch.autocast`` both forwards compute in its dtype (the loss promotes the
    logits to float32), the parameters and AdamW's moments staying in theirs. Autocast's
    cache of cast parameters is off during the call, or every forward after the first
    would read the weights as they were then (steps that train blind), and it is emptied on
    return, so the caller's forwards in the same context read the new weights.

    Memory beyond the two models: a copy of the trained parameters (put back on an error),
    their gradients and AdamW's two moments, so about five times the student's parameters
    (compact the student first: it is smaller, and its masks and stored weights go).

    Raises:
        TypeError: a student that is no nn.Module, a distiller that is no Distiller,
            batches that are no iterable of batches, a budget or rate of the wrong type.
        ValueError: no budget (`seconds`, `cpu_seconds`, `steps`), one out of range, no
            batch, a teacher that shares a parameter with the student, float16
            parameters to train (AdamW's steps turn to inf there), a loss that is
            not finite or a last step that leaves a parameter NaN or inf, a batch whose
            first forward through the student or the teacher fails (named with its
            shapes and dtypes, torch's error quoted and chained), a teacher of another
            dtype whose forward fails (both dtypes named); the student is then left as it
            was, its gradients too (batch 0's errors come before any step). An error of
            prunekit's own hooks in a forward is raised as it is.
    """
    _check(student, distiller, (seconds, cpu_seconds, steps), lr, warmup)
    found = batch_list(batches, _OWNER)
    trained = [p for p in student.parameters() if p.requires_grad]
    if not trained:
        raise value_error(f"{_OWNER}: the student has no parameter that requires grad; "
                          "expected some to train")  # fmt: skip
    refuse_shared(student, distiller.teacher, "student", _TEACHER, _APART)
    refuse_float16(_OWNER, student, trained)
    check_rate(_OWNER, lr, trained)
    # under autocast: each forward casts the weights as the steps left them
    with fresh_casts(), transaction(student, writes=trained):
        plan = _Plan(seconds, steps, lr, warmup, cpu_seconds)
        return _run(student, distiller, found, trained, plan)


@dataclass(frozen=True)
class _Plan:
    seconds: float | None
    steps: int | None
    lr: float
    warmup: int
    cpu_seconds: float | None = None

    def used(self, step: int, elapsed: float, cpu: float = 0.0) -> float:
        """The share of the budget used, in [0, 1], after `step` steps, `elapsed` wall
        seconds and `cpu` CPU seconds."""
        shares = [elapsed / self.seconds if self.seconds else 0.0]
        shares.append(step / self.steps if self.steps else 0.0)
        shares.append(cpu / self.cpu_seconds if self.cpu_seconds else 0.0)
        return min(1.0, max(shares))

    def rate(self, step: int, elapsed: float, cpu: float = 0.0) -> float:
        """The learning rate of step `step` (from 0)."""
        warm = min(1.0, (step + 1) / self.warmup) if self.warmup else 1.0
        share = self.used(step, elapsed, cpu)
        return self.lr * warm * 0.5 * (1 + math.cos(math.pi * share))


def _run(
    student: nn.Module, distiller: Distiller, batches: list[Inputs],
    trained: list[nn.Parameter], plan: _Plan,
) -> Recovery:  # fmt: skip
    optimizer = torch.optim.AdamW(trained, lr=plan.lr, weight_decay=0.0)
    losses: list[float] = []
    student.train()
    started, cpu = time.perf_counter(), time.process_time()

    def clocks() -> tuple[float, float]:
        """Wall and CPU seconds since the start."""
        return time.perf_counter() - started, time.process_time() - cpu

    held = [p.grad for p in trained]  # put back if the call fails
    done = False
    try:
        while plan.used(len(losses), *clocks()) < 1.0:
            step = len(losses)
            for group in optimizer.param_groups:
                group["lr"] = plan.rate(step, *clocks())
            batch = batches[step % len(batches)]
            # a batch's first forwards, before any step for batch 0: their errors name it
            number = step if step < len(batches) else None
            output, teacher = _forwards(student, distiller, batch, number)
            loss = distiller.loss(output, batch, teacher_output=teacher)
            if not bool(torch.isfinite(loss)):
                # the first loss comes before any update: the lr is not its cause, nor is
                # it where the batch itself holds NaN or inf
                found = first_not_finite(batch)
                cause = _FIRST if step == 0 else "a smaller lr"
                if found is not None:
                    cause = f"batch {step % len(batches)} holds {found}: {_FIRST}"
                raise value_error(
                    f"{_OWNER}: the loss of step {step} is {float(loss.detach())}; expected "
                    f"a finite loss ({cause})"
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            optimizer.step()
            losses.append(float(loss.detach()))
        if losses:
            last = f"step {len(losses) - 1}, the last,"
            refuse_not_finite(_OWNER, student, trained, last, f"a smaller lr, or {_FIRST}")
        done = True
    finally:
        student.eval()
        for p, grad in zip(trained, held, strict=True):
            p.grad = None if done else grad
    wall, used = time.perf_counter() - started, time.process_time() - cpu
    return Recovery(len(losses), wall, used, tuple(losses))


def _forwards(
    student: nn.Module, distiller: Distiller, batch: Inputs, number: int | None
) -> tuple[Output, Output]:
    """The student's output on `batch` and the teacher's. On a batch's first use (`number`
    its index; None after) an error of either forward that is the caller's (``is_callers``:
    not an error of prunekit's own hooks, which stays as it is) is raised as a ValueError
    naming the batch, or the two dtypes where the teacher's differs, chained from it."""
    try:
        output = _forward(student, batch, distiller)
    except Exception as error:
        if number is None or not is_callers(error):
            raise
        raise value_error(
            f"{_OWNER}: invalid batches: batch {number} ({described(batch)}) fails in the "
            f"student's forward: {type(error).__name__}: {error}; expected batches the "
            "student's forward takes"
        ) from error
    try:
        return output, distiller.teacher_output(batch, _logits(output, "student").device)
    except Exception as error:
        if number is None or not is_callers(error):
            raise
        raise _teacher_error(student, distiller.teacher, batch, number, error) from error


def _teacher_error(
    student: nn.Module, teacher: nn.Module, batch: Inputs, number: int, error: Exception
) -> ValueError:
    """The teacher's forward failed on batch `number`, which the student's took: the dtypes
    named where they differ (a float64 teacher of a float32 student), else the batch."""
    failed = f"{type(error).__name__}: {error}"
    found = {whose: _dtypes(model) for whose, model in (("teacher", teacher), ("student", student))}
    if found["teacher"] != found["student"]:
        own = found["student"]
        fix = f", e.g. teacher.to({own[0]})" if len(own) == 1 else ""
        return value_error(
            f"{_OWNER}: invalid distiller: its teacher is {' and '.join(found['teacher'])} and "
            f"the student {' and '.join(own)}; the teacher's forward fails on batch {number} "
            f"({described(batch)}): {failed}; expected a teacher of the student's dtype{fix}"
        )
    return value_error(
        f"{_OWNER}: invalid batches: batch {number} ({described(batch)}) goes through the "
        f"student but fails in the distiller's teacher's forward: {failed}; expected batches "
        "both models' forwards take"
    )


def _dtypes(model: nn.Module) -> list[str]:
    """The floating dtypes of `model`'s parameters, as torch names them."""
    return sorted({str(p.dtype) for p in model.parameters() if p.is_floating_point()})


def _forward(student: nn.Module, batch: Inputs, distiller: Distiller) -> Output:
    args, kwargs = _split(batch)
    if distiller.hidden_weight:
        kwargs["output_hidden_states"] = True
    if distiller.alpha == 1:
        without_labels(student, kwargs)  # an encoder-decoder keeps the target it decodes
    found: Output = student(*args, **kwargs)
    return found


def _check(
    student: object, distiller: object, budgets: tuple[object, object, object], lr: object,
    warmup: object,
) -> None:  # fmt: skip
    if not isinstance(student, nn.Module):
        raise type_error(f"{_OWNER}: invalid student of type {type(student).__name__}; "
                         "expected the pruned torch.nn.Module")  # fmt: skip
    if not isinstance(distiller, Distiller):
        raise type_error(f"{_OWNER}: invalid distiller of type {type(distiller).__name__}; "
                         "expected a prunekit.Distiller")  # fmt: skip
    _check_hidden_states(student, distiller)
    seconds, cpu_seconds, steps = budgets
    if seconds is None and cpu_seconds is None and steps is None:
        raise value_error(
            f"{_OWNER}: neither seconds nor steps given, nor cpu_seconds; expected a budget "
            "of wall time (seconds=...), of CPU time (cpu_seconds=...) or of steps "
            "(steps=...), or several"
        )
    for name, value in (("seconds", seconds), ("cpu_seconds", cpu_seconds)):
        if value is not None:
            check_number(value, name, _OWNER, "a finite float > 0", _positive)
    if steps is not None:
        check_number(steps, "steps", _OWNER, "an int >= 1", lambda v: v >= 1, integral=True)
    check_number(lr, "lr", _OWNER, "a finite float > 0", _positive)
    check_number(warmup, "warmup", _OWNER, "an int >= 0", lambda v: v >= 0, integral=True)


def _check_hidden_states(student: nn.Module, distiller: Distiller) -> None:
    """Refuse a `distiller` with a hidden-state term for a student or teacher whose forward
    takes no ``output_hidden_states`` (its error would read as the first batch's)."""
    if not distiller.hidden_weight:
        return
    for whose, model in (("student", student), ("teacher", distiller.teacher)):
        if takes_keyword(model, "output_hidden_states") is False:
            raise value_error(
                f"{_OWNER}: invalid distiller: hidden_weight={distiller.hidden_weight:g} "
                f"calls the {whose} with output_hidden_states=True, but "
                f"{type(model).__name__}.forward takes no output_hidden_states; expected "
                "hidden_weight=0 for a model that returns no hidden states, or a forward "
                "that takes output_hidden_states and returns hidden_states"
            )


def _positive(value: float) -> bool:
    return 0 < value < math.inf
