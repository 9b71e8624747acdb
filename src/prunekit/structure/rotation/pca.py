"""The principal directions of the residual stream on calibration data.

Every norm's input (each block's two, and the final norm's) is one point where the stream is
read. Each token's vector there is scaled to unit length first, as the norm divides it by
its own size: a direction's share of the error a reader sees is relative to the token's
size, so a token of large norm (the first token's outliers) counts as much as any other.
The sum of x x^T over every token at every point, in float64, is decomposed once: its
eigenvectors, by decreasing eigenvalue, are the columns of the one rotation of the stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.calibrate import batch_error, evaluating, run_batch
from prunekit.core.errors import value_error
from prunekit.core.example_inputs import token_mask
from prunekit.structure.rotation.family import OWNER, Stream


def second_moments(
    model: nn.Module, stream: Stream, batches: Sequence[Any], unit_tokens: bool = True
) -> list[Tensor]:
    """For each norm of ``stream.readings``, the sum of x x^T (float64, width x width) of the
    token vectors at its input, over `batches` (tokens an ``attention_mask`` of a mapping
    batch masks out are left out; a mask not shaped as the batch's input_ids, or not of
    one entry per token, is refused); each vector scaled to unit length first when
    `unit_tokens`, else as it is (the large tokens weighing more)."""
    width = stream.width
    totals = [torch.zeros(width, width, dtype=torch.float64) for _ in stream.readings]
    weights: list[Tensor | None] = [None]
    index = [0]

    def gather(total: Tensor) -> Any:
        def hook(_module: nn.Module, args: tuple[Any, ...]) -> None:
            x = args[0].detach().reshape(-1, width).to(torch.float64)
            if unit_tokens:
                x = x / x.norm(dim=1, keepdim=True).clamp_min(1e-30)
            kept = weights[0]
            if kept is not None:
                _check_fits(kept, x.shape[0], index[0])
                x = x * kept.reshape(-1, 1)
            total.addmm_(x.T, x)

        return hook

    pairs = zip(stream.readings, totals, strict=True)
    handles = [r.norm.register_forward_pre_hook(gather(t)) for r, t in pairs]
    try:
        with torch.no_grad(), evaluating(model):
            for index[0], batch in enumerate(batches):
                weights[0] = _token_weights(model, batch, index[0])
                try:
                    run_batch(model, batch)
                except Exception as error:  # the model's own, named; prunekit's as they are
                    raise batch_error(index[0], error, owner=OWNER)  # noqa: B904 (cause set)
    finally:
        for handle in handles:
            handle.remove()
    return totals


def _token_weights(model: nn.Module, batch: Any, index: int) -> Tensor | None:
    """1 for each token the batch's ``attention_mask`` (a tuple's by `model`'s forward's
    names) keeps (any nonzero value), 0 for the others; None: no mask, every token
    counts. A mask of another shape than its ``input_ids`` is refused (``token_mask``)."""
    kept = token_mask(batch, index, OWNER, model)
    return None if kept is None else kept.to(torch.float64)


def _check_fits(mask: Tensor, tokens: int, index: int) -> None:
    """Refuse a mask that does not give one entry per token seen at a norm: which tokens it
    leaves out could not be told."""
    if mask.numel() != tokens:
        raise value_error(
            f"{OWNER}: calibration batch {index} has an attention_mask of shape "
            f"{tuple(mask.shape)} ({mask.numel()} entries) for {tokens} tokens; expected one "
            "entry per token (the shape of its input_ids)"
        )


def principal_directions(moment: Tensor) -> tuple[Tensor, Tensor]:
    """The eigenvalues of `moment` (decreasing) and its eigenvectors as the columns of an
    orthogonal matrix in the same order, both float64."""
    values, vectors = torch.linalg.eigh(moment)
    order = torch.argsort(values, descending=True)
    return values[order], vectors[:, order]
