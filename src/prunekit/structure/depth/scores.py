"""How much each block (or span of consecutive blocks) matters, from calibration batches.

- ``angular``: the angular distance ``arccos(cos(h_in, h_out)) / pi`` between the hidden
  state entering a span of `n` consecutive blocks and the one leaving it, averaged over the
  calibration tokens (Gromov et al., "The Unreasonable Ineffectiveness of the Deeper
  Layers"). One score per span start; the span scored lowest goes.
- ``influence``: ShortGPT's block influence ``1 - cos(h_in, h_out)`` of each block alone,
  averaged over the tokens; the `n` blocks scored lowest go, wherever they are.
- ``loss``: how much the loss grows when the block alone is skipped (its output replaced by
  its input), averaged over the batches.
- a callable ``criterion(h_in, h_out) -> scalar tensor`` of one block's input and output
  hidden states for one batch, summed over the batches; the lowest go.

Lower is less important everywhere. Tokens are those of the batch's ``attention_mask`` where
it has one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.calibrate import evaluating
from prunekit.core.errors import type_error, value_error
from prunekit.structure.depth.blocks import REPLACES, BlockList, skip, unskip
from prunekit.structure.depth.states import rows, run_boundaries, run_one, token_mask

__all__ = ["CRITERIA", "BlockCriterion", "Loss", "block_scores"]

CRITERIA = ("angular", "influence", "loss")
BlockCriterion = Callable[[Tensor, Tensor], Any]
Loss = Callable[[Any, Any], Tensor]


def _cosines(before: Tensor, after: Tensor, mask: Tensor | None) -> Tensor:
    """The cosine of each counted token's two hidden states (float64; 1 where both are 0)."""
    a, b = rows(before, mask), rows(after, mask)
    dot = (a * b).sum(dim=1)
    norms = a.norm(dim=1) * b.norm(dim=1)
    cos = torch.where(norms > 0, dot / norms.clamp_min(1e-300), torch.ones_like(dot))
    return cos.clamp(-1.0, 1.0)


def _distance(kind: str, cos: Tensor) -> Tensor:
    return torch.arccos(cos) / math.pi if kind == "angular" else 1.0 - cos


def block_scores(
    model: nn.Module,
    blocks: BlockList,
    batches: Sequence[Any],
    criterion: str | BlockCriterion,
    span: int,
    loss: Loss | None,
    owner: str,
    style: str = REPLACES,
) -> list[float]:
    """One score per block, or per start of a span of `span` blocks for 'angular'
    (``len(blocks) - span + 1`` of them), the blocks' parent following the residual
    `style`. The model is left as it was."""
    with evaluating(model), torch.no_grad():
        if criterion == "loss":
            return _loss_scores(model, blocks, batches, loss, owner, style)
        width = span if criterion == "angular" else 1
        count = len(blocks) - width + 1
        sums = torch.zeros(count, dtype=torch.float64)
        tokens = 0
        for index, batch in enumerate(batches):
            found = run_boundaries(model, blocks, batch, index, owner, style)
            for start in range(count):
                before, after = found.inputs[start], found.outputs[start + width - 1]
                assert before is not None and after is not None
                if isinstance(criterion, str):
                    cos = _cosines(before, after, token_mask(batch, index, owner, before, model))
                    sums[start] += _distance(criterion, cos).sum()
                else:
                    sums[start] += _own_score(criterion, before, after, blocks.path(start), owner)
            first = found.inputs[0]
            assert first is not None
            mask = token_mask(batch, index, owner, first, model)
            tokens += first.shape[:-1].numel() if mask is None else int(mask.sum())
        if isinstance(criterion, str):
            sums /= max(tokens, 1)
    return _checked(sums.tolist(), blocks, owner)


def _own_score(criterion: BlockCriterion, before: Tensor, after: Tensor, where: str,
               owner: str) -> float:  # fmt: skip
    value = criterion(before, after)
    if isinstance(value, Tensor) and value.numel() == 1 and not value.is_complex() \
            and not value.is_meta:  # fmt: skip
        return float(value)
    if isinstance(value, float | int) and not isinstance(value, bool):
        return float(value)
    raise type_error(
        f"{owner}: criterion returned {_kind(value)} for {where}; expected a real scalar "
        "(a number or a one-element real tensor with a value)"
    )


def _kind(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)} on {value.device}"
    return type(value).__name__


def _loss_scores(model: nn.Module, blocks: BlockList, batches: Sequence[Any], loss: Loss | None,
                 owner: str, style: str) -> list[float]:  # fmt: skip
    def mean_loss() -> float:
        total = 0.0
        for index, batch in enumerate(batches):
            output = run_one(model, batch, index, owner)
            value = loss(output, batch) if loss is not None else getattr(output, "loss", None)
            if not isinstance(value, Tensor) or value.numel() != 1:
                raise value_error(
                    f"{owner}: criterion='loss' needs one loss value per batch; got "
                    f"{type(value).__name__}{'' if loss else ' as output.loss'}; expected "
                    "batches with labels (for output.loss) or loss=lambda output, batch: ..."
                )
            total += float(value)
        return total / len(batches)

    dense = mean_loss()
    scores = []
    for block in blocks.modules:
        skip(block, style)
        try:
            scores.append(mean_loss() - dense)
        finally:
            unskip(block)
    return _checked(scores, blocks, owner)


def _checked(scores: list[float], blocks: BlockList, owner: str) -> list[float]:
    for index, value in enumerate(scores):
        if not math.isfinite(value):
            raise value_error(
                f"{owner}: the score of {blocks.path(index)} is {value}; expected finite "
                "scores (the calibration batches may overflow the model's dtype)"
            )
    return scores
