"""Hostile cases of prunekit.recover and Distiller: arguments of every wrong kind named, a
step that fails (a loss that is not finite, an interrupt) after others have run, a student
with batch norm (its running statistics are written in place without a version count), a
teacher that is the student."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import prunekit as prune
from prunekit.core.transaction import transaction
from prunekit.dropin.base_method import BasePruningMethod


def pair() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(21)
    teacher = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 4))
    student = copy.deepcopy(teacher)
    prune.l1_unstructured(student[0], "weight", amount=0.5)
    return teacher, student


def batches() -> list[torch.Tensor]:
    torch.manual_seed(22)
    return [torch.randn(5, 6) for _ in range(3)]


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_same(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert set(after) == set(before)
    changed = [k for k in before if not torch.equal(after[k], before[k])]
    assert changed == []


class _Failing:
    """Distiller.loss that fails at its `at`-th call (0 based): a NaN loss or an interrupt."""

    def __init__(self, at: int, how: str) -> None:
        self.at, self.how, self.calls = at, how, 0
        self.real = prune.Distiller.loss

    def __call__(self, distiller: Any, output: Any, inputs: Any, **kwargs: Any) -> torch.Tensor:
        self.calls += 1
        loss: torch.Tensor = self.real(distiller, output, inputs, **kwargs)
        if self.calls - 1 == self.at:
            if self.how == "interrupt":
                raise KeyboardInterrupt
            return loss * math.nan
        return loss

    def method(self) -> Callable[..., torch.Tensor]:
        """Itself as a function, which binds as Distiller.loss does."""

        def loss(distiller: Any, output: Any, inputs: Any, **kwargs: Any) -> torch.Tensor:
            return self(distiller, output, inputs, **kwargs)

        return loss


@pytest.mark.parametrize("how", ["nan", "interrupt"])
@pytest.mark.parametrize("mode", [True, False])
def test_a_step_that_fails_after_others_leaves_the_student_and_teacher(
    monkeypatch: pytest.MonkeyPatch, how: str, mode: bool
) -> None:
    teacher, student = pair()
    student.train(mode)
    before, teacher_before = state(student), state(teacher)
    failing = _Failing(2, how)
    monkeypatch.setattr(prune.Distiller, "loss", failing.method())
    error = KeyboardInterrupt if how == "interrupt" else ValueError
    with pytest.raises(error):
        prune.recover(student, prune.Distiller(teacher), batches(), steps=5, lr=1e-2)
    assert failing.calls == 3  # two steps were taken
    assert_same(student, before)  # the batch norm's running statistics too
    assert_same(teacher, teacher_before)
    assert student.training is mode and all(m.training is mode for m in student.modules())
    assert prune.is_pruned(student)


def test_a_transaction_undoes_batch_norm_statistics_written_in_training() -> None:
    norm = nn.BatchNorm1d(3).train()
    before = state(norm)
    with pytest.raises(RuntimeError, match="after the forward"), transaction(norm):
        norm(torch.randn(4, 3) + 5)
        assert not torch.equal(norm.running_mean, before["running_mean"])
        raise RuntimeError("after the forward")
    assert_same(norm, before)


def test_a_successful_run_trains_only_what_is_kept_and_ends_in_eval() -> None:
    teacher, student = pair()
    student.train()
    mask = student[0].weight_mask.clone()
    teacher_before = state(teacher)
    done = prune.recover(student, prune.Distiller(teacher), batches(), steps=4, lr=1e-2)
    assert done.steps == 4 and len(done.losses) == 4
    assert all(math.isfinite(x) for x in done.losses)
    assert torch.equal(student[0].weight_mask, mask)
    assert bool((student[0].weight[mask == 0] == 0).all())
    assert not student.training
    assert_same(teacher, teacher_before)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"steps": True}, TypeError, "steps=True"),
        ({"steps": 2.0}, TypeError, "steps=2.0"),
        ({"steps": -1}, ValueError, "steps=-1"),
        ({"seconds": math.nan}, ValueError, "seconds=nan"),
        ({"seconds": -1.0}, ValueError, "seconds=-1.0"),
        ({"steps": 2, "lr": math.inf}, ValueError, "lr=inf"),
        ({"steps": 2, "lr": 0}, ValueError, "lr=0"),
        ({"steps": 2, "warmup": -1}, ValueError, "warmup=-1"),
        ({"steps": 2, "warmup": 1.5}, TypeError, "warmup=1.5"),
    ],
)
def test_a_bad_budget_is_named_before_anything_runs(
    kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    teacher, student = pair()
    before = state(student)
    with pytest.raises(error) as raised:
        prune.recover(student, prune.Distiller(teacher), batches(), **kwargs)
    assert "recover" in str(raised.value) and words in str(raised.value)
    assert_same(student, before)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"temperature": 0}, ValueError, "temperature=0"),
        ({"temperature": math.nan}, ValueError, "temperature=nan"),
        ({"alpha": 1.5}, ValueError, "alpha=1.5"),
        ({"alpha": True}, TypeError, "alpha=True"),
        ({"logit_weight": -1.0}, ValueError, "logit_weight=-1.0"),
        ({"hidden_weight": math.inf}, ValueError, "hidden_weight=inf"),
    ],
)
def test_a_bad_distiller_option_is_named(
    kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    teacher, _ = pair()
    with pytest.raises(error) as raised:
        prune.Distiller(teacher, **kwargs)
    assert "Distiller" in str(raised.value) and words in str(raised.value)


def test_a_teacher_that_shares_the_student_s_parameters_is_refused() -> None:
    _, student = pair()
    before = state(student)
    with pytest.raises(ValueError, match=r"^recover: invalid distiller: its teacher shares the "
                       r"parameter '(0\.\w+)' with the student \(as its '\1'\), which is "
                       r"trained here.*; expected a separate teacher"):  # fmt: skip
        prune.recover(student, prune.Distiller(student), batches(), steps=3, lr=1e-2)
    assert_same(student, before)


def test_a_failed_run_keeps_the_gradients_the_student_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    teacher, student = pair()
    for param in student.parameters():
        param.grad = torch.ones_like(param)
    monkeypatch.setattr(prune.Distiller, "loss", _Failing(1, "nan").method())
    with pytest.raises(ValueError, match=r"step 1 is nan"):
        prune.recover(student, prune.Distiller(teacher), batches(), steps=3, lr=1e-2)
    grads = [p.grad for p in student.parameters()]
    assert all(g is not None and bool((g == 1).all()) for g in grads)


class _Root(nn.Module):
    """sqrt(x) where x > 0, else 0: its output is finite, its gradient NaN wherever x <= 0
    (0 x the NaN of the branch not taken)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x > 0, x.sqrt(), torch.zeros_like(x))


def test_a_last_step_that_leaves_a_parameter_not_finite_is_refused() -> None:
    # a finite loss with NaN gradients: the update makes the weights NaN; an earlier step's
    # would show in the next step's loss, refused as such
    torch.manual_seed(3)
    teacher = nn.Sequential(nn.Linear(6, 8), _Root(), nn.Linear(8, 4))
    student = copy.deepcopy(teacher)
    prune.l1_unstructured(student[0], "weight", amount=0.5)
    student.train()
    before = state(student)
    with pytest.raises(ValueError, match=r"^recover: step 0, the last, left the parameter "
                       r"'0\.\w+' holding nan; expected .*smaller lr"):  # fmt: skip
        prune.recover(student, prune.Distiller(teacher), batches(), steps=1, lr=1e-2)
    assert_same(student, before)
    assert student.training


def test_a_parameter_the_forward_never_uses_is_not_blamed_on_the_steps() -> None:
    teacher, student = pair()
    student.unused = nn.Parameter(torch.full((2,), math.nan))
    done = prune.recover(student, prune.Distiller(teacher), batches(), steps=2, lr=1e-2)
    assert done.steps == 2


def test_batches_holding_nan_are_refused_at_the_first_step_and_named() -> None:
    teacher, student = pair()
    before = state(student)
    bad = [torch.full((5, 6), math.nan)]
    with pytest.raises(ValueError, match=r"^recover: the loss of step 0 is nan; expected .*"
                       r"batches on which both models compute finite outputs"):  # fmt: skip
        prune.recover(student, prune.Distiller(teacher), bad, steps=3, lr=1e-2)
    assert_same(student, before)


def test_a_float16_student_is_refused_before_any_step() -> None:
    teacher, student = pair()
    student, teacher = student.half(), teacher.half()
    before = state(student)
    refused = r"^recover: float16 parameters such as '0\.(bias|weight_orig)' cannot be trained"
    with pytest.raises(ValueError, match=refused):
        prune.recover(student, prune.Distiller(teacher), [b.half() for b in batches()], steps=3,
                      lr=1e-3)  # fmt: skip
    assert_same(student, before)


def test_an_lr_beyond_what_the_parameters_dtype_holds_is_refused_by_name() -> None:
    teacher, student = pair()
    before = state(student)
    refused = r"^recover: invalid lr=1e\+300; expected .*torch\.float32"
    with pytest.raises(ValueError, match=refused):
        prune.recover(student, prune.Distiller(teacher), batches(), steps=2, lr=1e300)
    assert_same(student, before)


class _Steps:
    """Counts the optimizer steps recover takes (AdamW.step patched)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = torch.optim.AdamW.step

        def step(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return real(optimizer, *args, **kwargs)

        monkeypatch.setattr(torch.optim.AdamW, "step", step)


def test_a_batch_the_student_cannot_take_is_named_before_any_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    teacher, student = pair()
    student.train()
    before, teacher_before = state(student), state(teacher)
    steps = _Steps(monkeypatch)
    wide = [torch.randn(5, 7)]  # the student's first Linear takes 6 features
    with pytest.raises(ValueError) as raised:
        prune.recover(student, prune.Distiller(teacher), wide, steps=3, lr=1e-2)
    message = str(raised.value)
    assert message.startswith(
        "recover: invalid batches: batch 0 (a tensor of shape (5, 7), torch.float32) fails "
        "in the student's forward: "
    ), message
    assert "expected batches the student's forward takes" in message
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert str(raised.value.__cause__) in message  # torch's words, chained and quoted
    assert steps.count == 0
    assert_same(student, before) and assert_same(teacher, teacher_before)
    assert student.training and prune.is_pruned(student)


def test_a_later_batch_the_student_cannot_take_leaves_the_student_as_it_was() -> None:
    teacher, student = pair()
    before = state(student)
    given: list[Any] = [*batches()[:2], {"x": torch.randn(5, 6)}]  # no keyword x
    with pytest.raises(ValueError, match=r"^recover: invalid batches: batch 2 \(x: a tensor "
                       r"of shape \(5, 6\), torch.float32\) fails in the student's forward: "
                       r".*forward\(\) got an unexpected keyword argument 'x'"):  # fmt: skip
        prune.recover(student, prune.Distiller(teacher), given, steps=5, lr=1e-2)
    assert_same(student, before)


def test_a_teacher_of_another_dtype_is_named_with_both_dtypes_before_any_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    teacher, student = pair()
    teacher = teacher.double()
    before, teacher_before = state(student), state(teacher)
    steps = _Steps(monkeypatch)
    with pytest.raises(ValueError) as raised:
        prune.recover(student, prune.Distiller(teacher), batches(), steps=3, lr=1e-2)
    message = str(raised.value)
    assert message.startswith(
        "recover: invalid distiller: its teacher is torch.float64 and the student "
        "torch.float32; the teacher's forward fails on batch 0 (a tensor of shape (5, 6), "
        "torch.float32): "
    ), message
    assert "expected a teacher of the student's dtype, e.g. teacher.to(torch.float32)" in message
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert steps.count == 0
    assert_same(student, before) and assert_same(teacher, teacher_before)


def test_a_teacher_of_another_dtype_that_takes_the_batches_is_used() -> None:
    """Token ids go through a bfloat16 teacher: the loss promotes its logits."""
    torch.manual_seed(5)
    teacher = nn.Sequential(nn.Embedding(12, 8), nn.Linear(8, 12))
    student = copy.deepcopy(teacher)
    prune.l1_unstructured(student[1], "weight", amount=0.5)
    ids = [torch.randint(0, 12, (2, 5)) for _ in range(2)]
    done = prune.recover(student, prune.Distiller(teacher.bfloat16()), ids, steps=2, lr=1e-2)
    assert done.steps == 2 and all(math.isfinite(x) for x in done.losses)


def test_an_error_of_prunekit_s_own_hook_stays_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug of prunekit's mask hook, met in the student's forward, is not the batch's."""
    teacher, student = pair()
    before = state(student)

    def broken(method: Any, module: nn.Module) -> torch.Tensor:
        raise RuntimeError("a bug of the mask hook")

    monkeypatch.setattr(BasePruningMethod, "apply_mask", broken)
    with pytest.raises(RuntimeError, match=r"^a bug of the mask hook$"):
        prune.recover(student, prune.Distiller(teacher), batches(), steps=2, lr=1e-2)
    monkeypatch.undo()
    assert_same(student, before)
