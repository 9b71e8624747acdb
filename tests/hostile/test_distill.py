"""Hostile uses of prunekit.Distiller (and recover, which runs it) with an encoder-decoder:
the teacher decodes what the student decodes, and the average over its positions leaves out
the target's padding, never by the source's mask."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import prunekit
from hostile.support import refused


def bart() -> Any:
    import transformers

    config = transformers.BartConfig(
        vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, max_position_embeddings=32, dropout=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.BartForConditionalGeneration(config).eval()


def batch(target: int = 6) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 50, (2, 6), generator=generator)
    mask = torch.ones_like(ids)
    mask[0, 3:] = 0  # the source's padding
    labels = torch.randint(3, 50, (2, target), generator=generator)
    labels[1, 4:] = -100  # the target's padding
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@pytest.mark.parametrize("target", [6, 4], ids=["same-length", "shorter-target"])
def test_a_student_equal_to_its_teacher_has_a_loss_of_zero(target: int) -> None:
    teacher = bart()
    student = copy.deepcopy(teacher)
    found = batch(target)
    loss = prunekit.Distiller(teacher).loss(student(**found), found)
    assert float(loss.detach()) == 0.0


def test_the_average_leaves_out_the_targets_padding() -> None:
    teacher = bart()
    student = copy.deepcopy(teacher)
    with torch.no_grad():
        for p in student.parameters():
            p.add_(0.05 * torch.randn_like(p))
    found = batch()
    output = student(**found)
    with torch.no_grad():
        theirs = teacher(**found).logits
    kept = found["labels"].ne(-100)
    expected = prunekit.distillation_loss(output.logits, theirs, attention_mask=kept)
    loss = prunekit.Distiller(teacher).loss(output, found)
    torch.testing.assert_close(loss, expected)
    decoder_mask = torch.ones_like(found["labels"])
    decoder_mask[0, 2:] = 0
    given = {**found, "decoder_attention_mask": decoder_mask}
    output = student(**given)
    expected = prunekit.distillation_loss(output.logits, theirs, attention_mask=decoder_mask)
    torch.testing.assert_close(prunekit.Distiller(teacher).loss(output, given), expected)


def test_recover_of_a_student_equal_to_its_teacher_starts_at_zero() -> None:
    teacher = bart()
    student = copy.deepcopy(teacher)
    done = prunekit.recover(student, prunekit.Distiller(teacher), [batch()], steps=1, lr=1e-4)
    assert done.losses == (0.0,)


def test_hidden_states_of_an_encoder_decoder_are_refused_for_what_they_are() -> None:
    """Its output holds encoder_ and decoder_hidden_states, never hidden_states: the
    refusal said to call the student with output_hidden_states=True, which it was."""
    teacher = bart()
    student = copy.deepcopy(teacher)
    found = batch()
    output = student(**found, output_hidden_states=True)
    distiller = prunekit.Distiller(teacher, hidden_weight=1.0)
    with pytest.raises(ValueError, match=r"^Distiller: hidden_weight=1\.0 .*encoder-decoder"):
        distiller.loss(output, found)


class Plain(torch.nn.Module):
    """A model whose forward takes no output_hidden_states (as most plain modules)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class Keywords(Plain):
    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return super().forward(x)


@pytest.mark.parametrize("whose", ["student", "teacher"])
def test_hidden_states_of_a_model_whose_forward_takes_none_are_refused_for_that(
    whose: str,
) -> None:
    """recover blamed batch 0 ('fails in the student's forward'), a good batch: the cause is
    the distiller's hidden_weight, which calls a forward with a keyword it does not take."""
    torch.manual_seed(0)
    student, teacher = (Plain(), Keywords()) if whose == "student" else (Keywords(), Plain())
    teacher.load_state_dict(student.state_dict())
    distiller = prunekit.Distiller(teacher, hidden_weight=1.0)
    refused(
        lambda: prunekit.recover(student, distiller, [torch.randn(4, 8)], steps=1),
        ValueError,
        rf"^recover: invalid distiller: hidden_weight=1 calls the {whose} with "
        rf"output_hidden_states=True, but Plain\.forward takes no output_hidden_states",
        model=student,
    )
