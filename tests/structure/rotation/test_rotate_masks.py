"""rotate_hidden's calibration masks and widths under hostile use: an attention_mask
counts a token or not (never weighs it), a mask that does not fit the tokens is refused,
and a width rounding that cannot remove anything is refused (one too long to print named in
words), the model left as it was; rotation alone takes any rounding."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import prunekit
from helpers import tiny_llm
from helpers.model_state import fingerprint

pytest.importorskip("transformers")

VOCAB = 96
G = torch.Generator().manual_seed(3)
A, B = torch.randint(0, VOCAB, (2, 10), generator=G), torch.randint(0, VOCAB, (2, 10), generator=G)


def model() -> Any:
    return tiny_llm.llama(vocab=VOCAB, layers=2)


def rotated(first_mask: torch.Tensor) -> tuple[Any, Any]:
    built = model()
    calibration = [{"input_ids": A, "attention_mask": first_mask},
                   {"input_ids": B, "attention_mask": torch.ones_like(B)}]  # fmt: skip
    report = prunekit.rotate_hidden(built, calibration, 0.25)
    return built, report


def test_a_mask_of_other_nonzero_values_counts_tokens_as_ones() -> None:
    ones, ones_report = rotated(torch.ones_like(A))
    twos, twos_report = rotated(torch.full_like(A, 2))
    assert twos_report == ones_report
    for (name, mine), (_, theirs) in zip(twos.state_dict().items(), ones.state_dict().items(),
                                         strict=True):  # fmt: skip
        assert torch.equal(mine, theirs), name


def test_a_mask_that_does_not_fit_the_tokens_is_refused() -> None:
    built = model()
    before, config = fingerprint(built), built.config.to_dict()
    calibration = [A, {"input_ids": B, "attention_mask": torch.ones(2, 5, dtype=torch.long)}]
    with pytest.raises(ValueError, match=r"rotate_hidden: calibration batch 1 has an "
                       r"attention_mask of shape \(2, 5\) for input_ids of shape \(2, 10\); "
                       r"expected the shape of its input_ids \(one entry per token\)"):  # fmt: skip
        prunekit.rotate_hidden(built, calibration, 0.25)
    assert fingerprint(built) == before and built.config.to_dict() == config


@pytest.mark.parametrize("round_to", [48, 10**6])
def test_a_rounding_wider_than_the_stream_is_refused(round_to: int) -> None:
    built = model()
    before, config = fingerprint(built), built.config.to_dict()
    message = (rf"rotate_hidden: round_to={round_to} with the 4 attention heads keeps "
               rf"multiples of {round_to} but the hidden width is 32, so hidden=0.25 would "
               r"remove nothing; expected round_to")  # fmt: skip
    with pytest.raises(ValueError, match=message):
        prunekit.rotate_hidden(built, [A], 0.25, round_to=round_to)
    assert fingerprint(built) == before and built.config.to_dict() == config


def test_a_rounding_too_long_to_print_is_refused_in_words() -> None:
    # Python refuses to print an int of more than 4300 digits: the message shows its first
    # digits and its count of them, for round_to and for the multiple it makes with the heads
    built = model()
    before, config = fingerprint(built), built.config.to_dict()
    message = (r"rotate_hidden: round_to=10000000000000000000\.\.\. \(5001 digits\) with the "
               r"4 attention heads keeps multiples of 40000000000000000000\.\.\. \(5001 "
               r"digits\) but the hidden width is 32")  # fmt: skip
    with pytest.raises(ValueError, match=message):
        prunekit.rotate_hidden(built, [A], 0.25, round_to=10**5000 + 1)
    assert fingerprint(built) == before and built.config.to_dict() == config


@pytest.mark.parametrize("round_to", [48, 10**400, 10**5000], ids=["48", "1e400", "1e5000"])
def test_rotation_alone_takes_any_rounding(round_to: int) -> None:
    # a rounding beyond a float's range too: the width kept is the whole width
    report = prunekit.rotate_hidden(model(), [A], 0.0, round_to=round_to)
    assert report.width_after == report.width_before == 32


@pytest.mark.parametrize(
    ("batch", "cause"),
    [(A.float(), "RuntimeError"), (A + VOCAB, "IndexError"), (A[:, :0], "RuntimeError")],
)
def test_a_batch_the_model_cannot_take_is_named(batch: torch.Tensor, cause: str) -> None:
    built = model()
    before, config = fingerprint(built), built.config.to_dict()
    with pytest.raises(ValueError, match=rf"the model cannot take batch 1: {cause}: .*; "
                       r"expected batches the model's forward accepts"):  # fmt: skip
        prunekit.rotate_hidden(built, [B, batch], 0.25)
    assert fingerprint(built) == before and built.config.to_dict() == config
