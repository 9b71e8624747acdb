"""reconstruct_blocks leaves out the padding of a batch's attention_mask by the rule the
calibration's statistics follow (``calibrate.statistics.token_rows``): an output of one row
per token, (*mask.shape, features) or the tokens flattened. Its own copy of the rule took
only (batch, tokens, features): the outputs of a model fed unbatched tokens, (tokens,
features) with a mask of (tokens,), were compared whole, padding counted."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from prunekit.calibrate.statistics import token_rows
from prunekit.structure.compensation.reconstruct import reconstruct_blocks

WIDTH, VOCAB, TOKENS, PAD = 8, 40, 10, 3


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.lin(x))


class _Unbatched(nn.Module):
    """A model of one sequence of tokens, (tokens,) in, (tokens, VOCAB) out."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(_Block() for _ in range(3))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        h = self.embed(input_ids)
        for block in self.layers:
            h = block(h)
        out: torch.Tensor = self.head(h)
        return out


def _batches(padded: bool) -> list[dict[str, torch.Tensor]]:
    found = []
    for k in range(3):
        ids = torch.randint(0, VOCAB, (TOKENS,), generator=torch.Generator().manual_seed(k))
        if not padded:
            found.append({"input_ids": ids})
            continue
        pads = torch.randint(0, VOCAB, (PAD,), generator=torch.Generator().manual_seed(9 + k))
        mask = torch.cat([torch.ones(TOKENS), torch.zeros(PAD)])
        found.append({"input_ids": torch.cat([ids, pads]), "attention_mask": mask})
    return found


@pytest.mark.parametrize("ends", [False, True])
def test_unbatched_padded_tokens_reconstruct_as_unpadded(ends: bool) -> None:
    torch.manual_seed(0)
    reference = _Unbatched()
    pruned = copy.deepcopy(reference)
    with torch.no_grad():
        for block in pruned.modules():
            if isinstance(block, _Block):
                block.lin.weight[:, : WIDTH // 2] = 0
    done = []
    for padded in (False, True):
        model = copy.deepcopy(pruned)
        errors = reconstruct_blocks(model, reference, _batches(padded), steps=4, lr=1e-2,
                                    ends=ends)  # fmt: skip
        done.append((errors, model.state_dict()))
    (errors, plain), (padded_errors, padded_state) = done
    assert any(after < before for before, after in errors)
    for (before, after), (padded_before, padded_after) in zip(errors, padded_errors, strict=True):
        assert padded_before == pytest.approx(before, rel=1e-5)
        assert padded_after == pytest.approx(after, rel=1e-4)
    for name, value in plain.items():
        assert torch.allclose(value, padded_state[name], rtol=1e-4, atol=1e-6), name


def test_token_rows_keeps_the_rows_of_the_kept_tokens() -> None:
    mask = torch.tensor([[True, False, True], [False, True, True]])
    x = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
    assert torch.equal(token_rows(x, mask), x[mask])  # (*mask.shape, features)
    flat = x.reshape(6, 4)
    assert torch.equal(token_rows(flat, mask), flat[mask.reshape(-1)])  # tokens flattened
    one = torch.tensor([True, False, True])
    assert torch.equal(token_rows(x[0], one), x[0][one])  # unbatched: (tokens, features)
    for other in (x[:, :2], torch.ones(5, 4), torch.ones(3)):  # rows that are not the tokens
        assert token_rows(other, mask) is other
    assert token_rows(x, None) is x
