"""Recovery in a budget of time or steps: the schedule, the masks, the checks."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from tests.helpers.gguf_models import tiny_llama
from torch import nn

import prunekit as prune
from prunekit.schedule.recovery import _Plan


def _pruned_pair() -> tuple[nn.Module, nn.Module, list[dict[str, torch.Tensor]]]:
    teacher = tiny_llama(64, seed=3)
    generator = torch.Generator().manual_seed(0)
    batches = [{"input_ids": torch.randint(0, 64, (2, 16), generator=generator)}
               for _ in range(4)]  # fmt: skip
    student = copy.deepcopy(teacher)
    prune.prune_channels(student, batches[0], 0.5, heads=0.5, criterion="l2")
    return student, teacher, batches


def _kl(student: nn.Module, teacher: nn.Module, batches: list[Any]) -> float:
    distiller = prune.Distiller(teacher, temperature=1.0)
    with torch.no_grad():
        return sum(float(distiller.loss(student(**b), b)) for b in batches) / len(batches)


def test_steps_close_the_gap_keep_the_masks_and_compaction_stays_exact() -> None:
    student, teacher, batches = _pruned_pair()
    masks = {n: b.clone() for n, b in student.named_buffers() if n.endswith("_mask")}
    before = _kl(student, teacher, batches)
    done = prune.recover(student, prune.Distiller(teacher, temperature=1.0), batches,
                         steps=40, lr=3e-3)  # fmt: skip
    assert done.steps == 40 and len(done.losses) == 40 and done.cpu_seconds > 0
    assert _kl(student, teacher, batches) < 0.5 * before
    assert not student.training
    for name, buffer in student.named_buffers():
        if name.endswith("_mask"):
            assert torch.equal(buffer, masks[name])
    ids = batches[0]["input_ids"]
    with torch.no_grad():
        masked = student(input_ids=ids).logits
        prune.compact(student, batches[0])
        torch.testing.assert_close(student(input_ids=ids).logits, masked, atol=1e-5, rtol=1e-5)


def test_the_hidden_state_term_takes_part() -> None:
    student, teacher, batches = _pruned_pair()
    plain = copy.deepcopy(student)
    with_hidden = prune.Distiller(teacher, temperature=1.0, hidden_weight=1.0)
    a = prune.recover(student, with_hidden, batches, steps=3, lr=1e-3)
    b = prune.recover(plain, prune.Distiller(teacher, temperature=1.0), batches, steps=3, lr=1e-3)
    assert a.losses[0] > b.losses[0]  # the hidden term adds to the first step's loss


def test_a_time_budget_stops_near_its_end() -> None:
    student, teacher, batches = _pruned_pair()
    done = prune.recover(student, prune.Distiller(teacher), batches, seconds=0.5)
    assert done.steps >= 1 and 0.5 <= done.seconds < 30.0, done


def test_the_rate_warms_up_then_follows_the_share_of_the_budget_used() -> None:
    plan = _Plan(seconds=10.0, steps=None, lr=1.0, warmup=4)
    assert plan.rate(0, 0.0) == pytest.approx(0.25)
    assert plan.rate(3, 0.0) == pytest.approx(1.0)
    assert plan.rate(100, 5.0) == pytest.approx(0.5)
    assert plan.rate(100, 10.0) == pytest.approx(0.0)
    both = _Plan(seconds=10.0, steps=100, lr=1.0, warmup=0)  # whichever is further on
    assert both.used(75, 5.0) == pytest.approx(0.75)
    assert both.used(10, 9.0) == pytest.approx(0.9)
    assert both.rate(50, 0.0) == pytest.approx(0.5 * (1 + math.cos(math.pi / 2)))


def test_a_loss_that_is_not_finite_leaves_the_student_as_it_was() -> None:
    student, teacher = nn.Linear(3, 4), nn.Linear(3, 4)
    with torch.no_grad():
        student.bias[0] = math.nan
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    batches = [torch.randn(2, 3)]
    with pytest.raises(ValueError, match=r"recover: the loss of step 0 is nan"):
        prune.recover(student, prune.Distiller(teacher), batches, steps=3, lr=0.1)
    for name, p in student.named_parameters():
        assert torch.equal(p.nan_to_num(7.0), before[name].nan_to_num(7.0))


_M = nn.Linear(2, 2)
_D = prune.Distiller(nn.Linear(2, 2))
_B = [torch.zeros(1, 2)]


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"student": "x"}, TypeError, "recover: invalid student of type str"),
        ({"distiller": _M}, TypeError, "recover: invalid distiller of type Linear"),
        ({"steps": None}, ValueError, "recover: neither seconds nor steps given"),
        (
            {"seconds": 0.0},
            ValueError,
            r"recover: invalid seconds=0.0; expected a finite float > 0",
        ),
        ({"seconds": math.inf}, ValueError, "invalid seconds=inf"),
        ({"steps": 0}, ValueError, r"recover: invalid steps=0; expected an int >= 1"),
        ({"steps": 2.0}, TypeError, "invalid steps=2.0 of type float"),
        ({"steps": True}, TypeError, "invalid steps=True of type bool"),
        ({"lr": -1.0}, ValueError, "invalid lr=-1.0"),
        ({"lr": math.nan}, ValueError, "invalid lr=nan"),
        ({"warmup": -1}, ValueError, "invalid warmup=-1; expected an int >= 0"),
        ({"batches": []}, ValueError, "recover: calibration holds no batch"),
        ({"batches": torch.zeros(2)}, TypeError, "recover: invalid calibration of type Tensor"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], error: type, words: str) -> None:
    given: dict[str, Any] = {"student": _M, "distiller": _D, "batches": _B, "steps": 1}
    given.update(kwargs)
    with pytest.raises(error, match=words):
        prune.recover(given.pop("student"), given.pop("distiller"), given.pop("batches"), **given)
