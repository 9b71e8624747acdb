"""Recovery by distillation: the loss, its gradients, and a pruned student catching up."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import prunekit as prune
from prunekit.schedule import hidden_state_loss


def test_the_loss_is_zero_for_equal_logits_and_is_t2_times_kl() -> None:
    logits = torch.randn(5, 7)
    assert float(prune.distillation_loss(logits, logits.clone())) == 0.0
    student, teacher = torch.randn(5, 7), torch.randn(5, 7)
    for t in (1.0, 2.0, 4.0):
        expected = t * t * F.kl_div(
            F.log_softmax(student / t, -1), F.log_softmax(teacher / t, -1),
            log_target=True, reduction="batchmean",
        )  # fmt: skip
        got = prune.distillation_loss(student, teacher, temperature=t)
        assert float(got) == pytest.approx(float(expected), rel=1e-6)


def test_gradients_reach_the_student_only() -> None:
    student, teacher = nn.Linear(4, 3), nn.Linear(4, 3)
    x = torch.randn(6, 4)
    prune.distillation_loss(student(x), teacher(x)).backward()
    assert teacher.weight.grad is None and teacher.bias.grad is None
    assert student.weight.grad is not None and float(student.weight.grad.abs().sum()) > 0
    distiller = prune.Distiller(teacher)
    student.zero_grad()
    distiller.loss(student(x), x).backward()
    assert teacher.weight.grad is None and float(student.weight.grad.abs().sum()) > 0


def test_padding_positions_do_not_count() -> None:
    student, teacher = torch.randn(2, 5, 7), torch.randn(2, 5, 7)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    loss = prune.distillation_loss(student, teacher, attention_mask=mask)
    changed = student.clone()
    changed[0, 3:] = 100.0  # padding
    assert float(prune.distillation_loss(changed, teacher, attention_mask=mask)) == float(loss)
    kept = mask.bool()
    assert float(loss) == pytest.approx(
        float(prune.distillation_loss(student[kept], teacher[kept])), rel=1e-6
    )


def test_hidden_states_loss_is_the_mean_squared_error_over_pairs() -> None:
    a, b = [torch.randn(2, 3, 4) for _ in range(2)], [torch.randn(2, 3, 4) for _ in range(2)]
    expected = (F.mse_loss(a[0], b[0]) + F.mse_loss(a[1], b[1])) / 2
    assert float(hidden_state_loss(a, b)) == pytest.approx(float(expected), rel=1e-6)
    assert float(hidden_state_loss(a, a)) == 0.0


def test_the_logit_term_adds_the_mean_squared_error_of_the_logits() -> None:
    teacher = nn.Linear(4, 6)
    x, student = torch.randn(5, 4), torch.randn(5, 6)
    plain = prune.Distiller(teacher, temperature=1.0).loss(student, x)
    both = prune.Distiller(teacher, temperature=1.0, logit_weight=0.5).loss(student, x)
    expected = 0.5 * F.mse_loss(student, teacher(x).detach())
    assert float(both - plain) == pytest.approx(float(expected), rel=1e-5)
    shifted = teacher(x).detach() + 3.0  # the same softmax: only the logit term sees it
    distiller = prune.Distiller(teacher, logit_weight=1.0)
    assert float(prune.distillation_loss(shifted, teacher(x))) == pytest.approx(0.0, abs=1e-6)
    assert float(distiller.loss(shifted, x)) == pytest.approx(9.0, rel=1e-5)


def test_the_logit_term_leaves_padding_out() -> None:
    class Tokens(nn.Module):
        def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
            return F.one_hot(input_ids, 7).float()

    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    student = torch.zeros(2, 3, 7)
    student[0, 2] = 100.0  # padding
    distiller = prune.Distiller(Tokens(), alpha=1.0, logit_weight=1.0)
    plain = prune.Distiller(Tokens(), alpha=1.0)
    inputs = {"input_ids": ids, "attention_mask": mask}
    term = distiller.loss(student, inputs) - plain.loss(student, inputs)
    assert float(term) == pytest.approx(1 / 7, rel=1e-5)  # one logit off by 1 per kept place


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 64)
        self.fc2 = nn.Linear(64, 64)
        self.fc3 = nn.Linear(64, 5)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.fc3(F.gelu(self.fc2(F.gelu(self.fc1(x)))))
        return out


def gap(student: nn.Module, teacher: nn.Module, x: Tensor) -> float:
    with torch.no_grad():
        return float(prune.distillation_loss(student(x), teacher(x), temperature=1.0))


def test_a_few_steps_of_distillation_close_most_of_the_gap_of_a_pruned_model() -> None:
    teacher = Mlp()
    x, held_out = torch.randn(2, 256, 8)
    student = copy.deepcopy(teacher)
    prune.prune_channels(student, x, 0.6)
    before = gap(student, teacher, held_out)
    distiller = prune.Distiller(teacher, temperature=2.0)
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-2)
    for step in range(25):
        batch = x[(step % 4) * 64 : (step % 4 + 1) * 64]
        optimizer.zero_grad()
        distiller.loss(student(batch), batch).backward()
        optimizer.step()
    after = gap(student, teacher, held_out)
    assert after < 0.5 * before
    prune.compact(student, x, latency_runs=0)  # the masks held: it compacts as before
    assert student.fc1.out_features == 26 and gap(student, teacher, held_out) == pytest.approx(
        after, rel=1e-4
    )


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: prune.distillation_loss(torch.ones(2, 3), torch.ones(2, 4)), ValueError,
         "student_logits of shape (2, 3) and teacher_logits of shape (2, 4)"),
        (lambda: prune.distillation_loss([1.0], torch.ones(1)), TypeError,
         "invalid student_logits of type list"),
        (lambda: prune.distillation_loss(torch.ones(2, 3), torch.ones(2, 3), temperature=0.0),
         ValueError, "invalid temperature=0.0; expected a finite float > 0"),
        (lambda: prune.distillation_loss(torch.ones(2, 3), torch.ones(2, 3),
                                         temperature=math.nan), ValueError, "temperature=nan"),
        (lambda: prune.distillation_loss(torch.ones(2, 3), torch.ones(2, 3),
                                         attention_mask=torch.ones(3)), ValueError,
         "attention_mask of shape (3,); expected (2,)"),
        (lambda: prune.distillation_loss(torch.ones(2, 3), torch.ones(2, 3),
                                         attention_mask=torch.zeros(2)), ValueError,
         "keeps no position"),
        (lambda: prune.distillation_loss(torch.ones(2, 3), torch.ones(2, 3),
                                         attention_mask=torch.tensor([1.0, math.nan])),
         ValueError, "distillation_loss: attention_mask holds nan; expected 1s"),
        (lambda: prune.distillation_loss(torch.ones(3, 3), torch.ones(3, 3),
                                         attention_mask=torch.tensor([1, 1, -1])),
         ValueError, "attention_mask holds -1; expected 1s (kept) and 0s"),
        (lambda: hidden_state_loss([torch.ones(2, 3, 4)], [torch.ones(2, 3, 4)],
                                   attention_mask=torch.ones(2, 5)), ValueError,
         "hidden_state_loss: attention_mask of shape (2, 5); expected (2, 3), the states' "
         "shape without their last dim"),
        (lambda: prune.Distiller("model"), TypeError, "invalid teacher of type str"),  # type: ignore[arg-type]
        (lambda: prune.Distiller(nn.Linear(2, 2), alpha=1.5), ValueError, "invalid alpha=1.5"),
        (lambda: prune.Distiller(nn.Linear(2, 2), hidden_weight=-1.0), ValueError,
         "invalid hidden_weight=-1.0"),
        (lambda: prune.Distiller(nn.Linear(2, 2), logit_weight=-0.5), ValueError,
         "invalid logit_weight=-0.5; expected a finite float >= 0"),
        (lambda: prune.Distiller(nn.Linear(2, 2), logit_weight=math.inf), ValueError,
         "invalid logit_weight=inf"),
        (lambda: prune.Distiller(nn.Linear(2, 2), logit_weight=math.nan), ValueError,
         "invalid logit_weight=nan"),
        (lambda: prune.Distiller(nn.Linear(2, 2), logit_weight="1"), TypeError,  # type: ignore[arg-type]
         "invalid logit_weight='1' of type str"),
        (lambda: prune.Distiller(nn.Linear(2, 2), logit_weight=True), TypeError,
         "invalid logit_weight=True of type bool"),
        (lambda: prune.Distiller(nn.Linear(2, 2), temperature=True), TypeError,
         "invalid temperature=True of type bool; expected a finite float > 0"),
        (lambda: prune.Distiller(nn.Linear(2, 2), alpha="0.5"), TypeError,  # type: ignore[arg-type]
         "invalid alpha='0.5' of type str; expected a float in [0, 1]"),
        (lambda: prune.Distiller(nn.Linear(2, 2), hidden_weight=None), TypeError,  # type: ignore[arg-type]
         "invalid hidden_weight=None of type NoneType"),
        (lambda: prune.Distiller(nn.Linear(2, 2), alpha=math.nan), ValueError,
         "invalid alpha=nan"),
        (lambda: prune.distillation_loss(torch.ones(2, 3), torch.ones(2, 3), temperature="2"),  # type: ignore[arg-type]
         TypeError, "distillation_loss: invalid temperature='2' of type str"),
        (lambda: prune.Distiller(nn.Linear(2, 2), alpha=0.5).loss(
            torch.ones(1, 2), torch.ones(1, 2)), ValueError, "its output has no `loss`"),
        (lambda: prune.Distiller(nn.Linear(2, 2)).loss("out", torch.ones(1, 2)), TypeError,
         "the student's output is str, with no logits"),
        (lambda: hidden_state_loss([torch.ones(2, 3)], [torch.ones(2, 4)]), ValueError,
         "pair 0 has student (2, 3) and teacher (2, 4)"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused(call: Any, error: type, words: str) -> None:
    with pytest.raises(error, match=re.escape(words)):
        call()


def test_the_teacher_keeps_its_mode_and_weights() -> None:
    teacher = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    teacher.train()
    state = {k: v.clone() for k, v in teacher.state_dict().items()}
    distiller = prune.Distiller(teacher)
    x = torch.randn(3, 4)
    out = distiller.teacher_output(x)
    assert torch.equal(out, teacher[0](x))  # eval mode: no dropout
    assert teacher.training and all(
        torch.equal(v, teacher.state_dict()[k]) for k, v in state.items()
    )


def test_the_teacher_keeps_the_mode_of_each_submodule() -> None:
    teacher = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    teacher.train()
    teacher[1].eval()  # a frozen norm inside a teacher in training mode
    prune.Distiller(teacher).teacher_output(torch.randn(3, 4))
    assert [m.training for m in teacher] == [True, False, True] and teacher.training


def test_the_hidden_states_of_a_classifier_leave_padding_out() -> None:
    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.head = nn.Linear(4, 3)

        def forward(self, input_ids: Tensor, attention_mask: Tensor,
                    output_hidden_states: bool = False) -> dict[str, Any]:  # fmt: skip
            hidden = self.embed(input_ids)
            return {"logits": self.head(hidden[:, 0]), "hidden_states": (hidden,)}

    torch.manual_seed(0)
    teacher, student = Classifier(), Classifier()
    ids, mask = torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([[1, 1, 0], [1, 1, 1]])
    inputs = {"input_ids": ids, "attention_mask": mask}
    plain = prune.Distiller(teacher)
    distiller = prune.Distiller(teacher, hidden_weight=1.0)
    output = student(ids, mask)
    term = (distiller.loss(output, inputs) - plain.loss(output, inputs)).detach()
    kept = mask.bool()
    with torch.no_grad():
        expected = F.mse_loss(output["hidden_states"][0][kept], teacher.embed(ids)[kept])
    assert float(term) == pytest.approx(float(expected), rel=1e-5)
    padded = output["hidden_states"][0].detach().clone()
    padded[0, 2] += 100.0  # the padding's hidden state
    changed = {"logits": output["logits"], "hidden_states": (padded,)}
    assert float(distiller.loss(changed, inputs).detach()) == pytest.approx(
        float(distiller.loss(output, inputs).detach()), rel=1e-6
    )


def test_teacher_logits_of_minus_infinity_are_classes_of_probability_zero() -> None:
    torch.manual_seed(0)
    student = torch.randn(4, 5, requires_grad=True)
    teacher = torch.randn(4, 5)
    teacher[:, 0] = -math.inf  # a class the teacher rules out
    t = 2.0
    log_student = F.log_softmax(student.detach() / t, -1)[:, 1:]
    log_teacher = F.log_softmax(teacher[:, 1:] / t, -1)
    expected = t * t * (log_teacher.exp() * (log_teacher - log_student)).sum(-1).mean()
    loss = prune.distillation_loss(student, teacher, temperature=t)
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-6)
    loss.backward()
    assert student.grad is not None and bool(student.grad.isfinite().all())
    both = student.detach().clone()
    both[:, 0] = -math.inf  # ruled out by both
    expected = t * t * F.kl_div(F.log_softmax(both[:, 1:] / t, -1), log_teacher,
                                log_target=True, reduction="batchmean")  # fmt: skip
    assert float(prune.distillation_loss(both, teacher, temperature=t)) == pytest.approx(
        float(expected), rel=1e-6
    )


@pytest.mark.parametrize("where", ["one", "row", "all"])
def test_teacher_logits_of_nan_make_the_loss_nan_not_zero(where: str) -> None:
    # a NaN counts as a difference: a teacher that computes NaN is no teacher ruling out
    torch.manual_seed(0)
    student = torch.randn(4, 5)
    teacher = torch.randn(4, 5)
    if where == "one":
        teacher[1, 2] = math.nan
    elif where == "row":
        teacher[1] = math.nan
    else:
        teacher[:] = math.nan
        student[:] = math.nan  # a NaN input gives both
    assert math.isnan(float(prune.distillation_loss(student, teacher)))


def test_hugging_face_trainer_distils_into_a_pruned_llama(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from prunekit.schedule.hf_callback import DistillationTrainer

    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, intermediate_size=64, max_position_embeddings=32,
        initializer_range=0.3,  # logits far from uniform: a gap worth closing
    )  # fmt: skip
    teacher = transformers.LlamaForCausalLM(config).eval()
    student = copy.deepcopy(teacher)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (16, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[:, 10:] = 0
    rows = [
        {"input_ids": i, "attention_mask": m, "labels": i} for i, m in zip(ids, mask, strict=True)
    ]
    prune.prune_channels(student, {"input_ids": ids[:2]}, 0.5)
    inputs = {"input_ids": ids, "attention_mask": mask}

    def distance() -> float:
        with torch.no_grad():
            s, t = student(**inputs).logits, teacher(**inputs).logits
        return float(prune.distillation_loss(s, t, temperature=1.0, attention_mask=mask))

    before = distance()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=8, per_device_train_batch_size=8,
        learning_rate=5e-3, logging_strategy="no", save_strategy="no", report_to=[],
        disable_tqdm=True, use_cpu=True, seed=0, dataloader_num_workers=0,
    )  # fmt: skip
    distiller = prune.Distiller(teacher, alpha=0.9, hidden_weight=0.1)
    DistillationTrainer(model=student, args=args, train_dataset=rows, distiller=distiller).train()
    assert distance() < 0.7 * before
    assert all(p.grad is None for p in teacher.parameters())
    with pytest.raises(TypeError, match="invalid distiller of type str"):
        DistillationTrainer(model=student, args=args, distiller="teacher")


class Counted(nn.Linear):
    """A teacher that counts its forwards."""

    calls = 0

    def forward(self, x: Tensor) -> Tensor:
        self.calls += 1
        return super().forward(x)


def test_a_given_teacher_output_is_used_and_the_teacher_does_not_run() -> None:
    torch.manual_seed(0)
    teacher = Counted(4, 6)
    x, student = torch.randn(5, 4), torch.randn(5, 6, requires_grad=True)
    distiller = prune.Distiller(teacher, temperature=1.5, logit_weight=0.5)
    fresh = distiller.loss(student, x)
    assert teacher.calls == 1
    cached = teacher(x).detach()
    given = distiller.loss(student, x, teacher_output=cached)
    assert teacher.calls == 2  # only the call above
    assert torch.equal(given, fresh)
    other = distiller.loss(student, x, teacher_output=cached + torch.randn(5, 6))
    assert float(other.detach()) != float(fresh.detach())  # the given output counts
    assert teacher.calls == 2
    wanting = cached.clone().requires_grad_()
    distiller.loss(student, x, teacher_output=wanting).backward()
    assert wanting.grad is None and student.grad is not None  # the teacher's side detached


def test_a_given_teacher_output_is_checked() -> None:
    teacher = nn.Linear(4, 6)
    x, student = torch.randn(5, 4), torch.randn(5, 6)
    distiller = prune.Distiller(teacher)
    with pytest.raises(TypeError, match=re.escape("the teacher's output is list, with no logits")):
        distiller.loss(student, x, teacher_output=[1.0])
    with pytest.raises(ValueError, match=re.escape("teacher_logits of shape (5, 3)")):
        distiller.loss(student, x, teacher_output=torch.randn(5, 3))
    hidden = prune.Distiller(teacher, hidden_weight=1.0)
    output = {"logits": student, "hidden_states": (torch.randn(5, 2),)}
    with pytest.raises(ValueError, match=re.escape("the teacher_output given has none")):
        hidden.loss(output, x, teacher_output={"logits": torch.randn(5, 6)})
    states = (torch.randn(5, 2),)
    loss = hidden.loss(output, x, teacher_output={"logits": student, "hidden_states": states})
    assert float(loss) == pytest.approx(float(F.mse_loss(output["hidden_states"][0], states[0])))


def test_a_tuple_batch_s_attention_mask_leaves_padding_out_as_a_mapping_s() -> None:
    """A tuple of positional arguments gives the attention_mask by the place the forward
    names it (as calibration reads it): its padding counted in the average, unlike the
    same batch as a mapping."""
    pytest.importorskip("transformers")
    from helpers.tiny_llm import llama

    teacher, student = llama(seed=0), llama(seed=1)
    ids = torch.randint(0, 300, (2, 10), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0  # the first row's last four tokens are padding
    distiller = prune.Distiller(teacher, logit_weight=1.0)
    found = []
    for inputs in ({"input_ids": ids, "attention_mask": mask}, (ids, mask)):
        args = inputs if isinstance(inputs, tuple) else ()
        kwargs = inputs if isinstance(inputs, dict) else {}
        found.append(float(distiller.loss(student(*args, **kwargs), inputs)))
    assert found[1] == pytest.approx(found[0], rel=1e-6)
