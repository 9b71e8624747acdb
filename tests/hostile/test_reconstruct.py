"""Hostile calls of prunekit.reconstruct_blocks: what the calibration batches carry beside
the model's inputs changes nothing it trains towards."""

from __future__ import annotations

import copy

import pytest
import torch

import prunekit
from helpers import tiny_llm


@pytest.mark.parametrize("return_dict", [True, False], ids=["output", "tuple"])
def test_labels_in_the_batches_leave_the_head_training_towards_the_logits(
    return_dict: bool,
) -> None:
    """A Hugging Face output given labels starts with its loss (a scalar), as a mapping or
    a tuple: the head's target is still the reference's logits, so the run equals the one
    on the same batches without them."""
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(1))
    reference = tiny_llm.llama()
    pruned = copy.deepcopy(reference)
    prunekit.prune_channels(pruned, ids, amount=0.25)
    plain = [{"input_ids": ids, "return_dict": return_dict}]
    plain.append({"input_ids": ids.flip(0), "return_dict": return_dict})
    labelled = [{**b, "labels": b["input_ids"]} for b in plain]
    runs = []
    for batches in (plain, labelled):
        model = copy.deepcopy(pruned)
        errors = prunekit.reconstruct_blocks(model, reference, batches, steps=20, lr=1e-3,
                                             ends=True)  # fmt: skip
        runs.append((errors, model.state_dict()))
    (errors, state), (errors_labelled, state_labelled) = runs
    assert errors_labelled == errors
    assert errors[-1][1] < errors[-1][0]  # the head's steps took on the logits
    for key, value in state.items():
        assert torch.equal(state_labelled[key], value), key
