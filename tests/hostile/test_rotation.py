"""Hostile cases of rotate_hidden (prunekit.structure.rotation): an attention_mask that gives
one entry per token only by count (transposed, reshaped) is refused, not read in another
order, and the refusal leaves the model and its config as they were."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import prunekit
from hostile.support import refused

T = pytest.importorskip("transformers")

IDS = torch.randint(3, 100, (2, 8), generator=torch.Generator().manual_seed(1))


def _llama() -> Any:
    torch.manual_seed(0)
    config = T.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=48,
                           num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2)  # fmt: skip
    return T.LlamaForCausalLM(config).eval()


def _padding() -> torch.Tensor:
    """The last three tokens of the first row are padding."""
    mask = torch.ones_like(IDS)
    mask[0, -3:] = 0
    return mask


MASKS = [
    ("transposed", lambda: _padding().T.contiguous(), r"\(8, 2\)"),
    ("reshaped", lambda: _padding().reshape(4, 4), r"\(4, 4\)"),
]


@pytest.mark.parametrize(("case", "mask", "shown"), MASKS, ids=[m[0] for m in MASKS])
def test_a_mask_of_as_many_entries_in_another_shape_is_refused(
    case: str, mask: Any, shown: str
) -> None:
    """The model's forward takes such a mask (Llama's does, and computes with it); its
    entries were read flat as the tokens' (the padding counted, real tokens left out)."""
    model = _llama()
    batch = {"input_ids": IDS, "attention_mask": mask()}
    refused(lambda: prunekit.rotate_hidden(model, [IDS, batch], 0.25), ValueError,
            rf"^rotate_hidden: calibration batch 1 has an attention_mask of shape {shown} for "
            r"input_ids of shape \(2, 8\); expected the shape of its input_ids \(one entry "
            r"per token\)", model=model)  # fmt: skip
