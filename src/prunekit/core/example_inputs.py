"""What a model's forward is given: one name for the types every entry point takes.

``ExampleInputs``: a tensor (one positional argument), a tuple or list of positional
arguments, or a mapping of keyword arguments, as ``channel_groups``, ``prune_channels``,
``compact`` and the depth calls trace and run them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

from torch import Tensor, nn

from prunekit.core.errors import value_error
from prunekit.core.signature import positional_names

__all__ = ["ExampleInputs", "named", "rowless", "token_mask"]

ExampleInputs: TypeAlias = Tensor | Sequence[object] | Mapping[str, object]
"""A forward's inputs: a tensor, a tuple (or list) of positional arguments, or a mapping of
keyword arguments."""


def rowless(batches: Sequence[object], model: nn.Module | None = None) -> str | None:
    """Why no batch of `batches` holds a row (a sample, a token) a calibration can use.

    Args:
        batches: each a tensor, a tuple or list of positional arguments, or a mapping of
            keyword arguments (its first value is the one looked at).
        model: the model the batches are given to, whose forward names a tuple's items
            (its ``attention_mask``, see `named`); None: a tuple has no mask.

    Returns:
        ``'is empty'`` (every batch's first tensor has no entry), ``'has an attention_mask
        that is all zero'`` (every batch masks out every token), or None where some batch
        has a row.
    """
    if all(isinstance(t, Tensor) and t.numel() == 0 for t in map(_first, batches)):
        return "is empty"
    named_batches = [named(b, model) for b in batches]
    masks = [b.get("attention_mask") if isinstance(b, Mapping) else None for b in named_batches]
    if all(isinstance(m, Tensor) and not bool((m != 0).any()) for m in masks):
        return "has an attention_mask that is all zero"
    return None


def _first(batch: object) -> object:
    """A batch's first input: a mapping's first value, a tuple's or list's first item, or
    the batch itself."""
    if isinstance(batch, Mapping):
        return next(iter(batch.values()), None)
    if isinstance(batch, tuple | list):
        return batch[0] if batch else None
    return batch


def named(batch: object, model: nn.Module | None) -> object:
    """A tuple or list batch as the mapping of the parameters of `model`'s forward its
    items fill (``model(*batch)``: the first item the first parameter's, and on), as far
    as the forward names them; any other batch, or without a `model` or a signature to
    read, the batch itself.

    Args:
        batch: a calibration batch.
        model: the module whose forward the batch is given to (None: not known).

    Returns:
        A dict of parameter name -> item, or `batch` as it is.
    """
    if model is None or not isinstance(batch, tuple | list):
        return batch
    names = positional_names(model)
    return batch if names is None else dict(zip(names, batch, strict=False))


def token_mask(
    batch: object, index: int, owner: str, model: nn.Module | None = None
) -> Tensor | None:
    """Which tokens of a calibration batch count: True where the batch's
    ``attention_mask`` is nonzero, in its shape; None where the batch has no such mask.
    A mapping names it; a tuple or list gives it by place, where `model`'s forward names
    the parameter of that place ``attention_mask`` (``model(*batch)``, see `named`).

    Args:
        batch: a calibration batch (a mapping of keyword arguments, or a tuple or list of
            positional ones; a tensor has no mask).
        index: its place among the batches, as the error names it.
        owner: the entry point the error names.
        model: the module the batch is given to, whose forward names a tuple's items
            (None: a tuple or list has no mask).

    Returns:
        Bool flags shaped like the mask, or None: every token counts.

    Raises:
        ValueError: the mask's shape is not its ``input_ids``' (or its ``inputs_embeds``'
            without the last dim): which entry is which token could not be told, even
            where the count is the same (a transposed or reshaped mask).
    """
    batch = named(batch, model)
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    if not isinstance(mask, Tensor):
        return None
    given = _tokens(batch)
    if given is not None and tuple(mask.shape) != given[2]:
        name, shape, _ = given
        raise value_error(
            f"{owner}: calibration batch {index} has an attention_mask of shape "
            f"{tuple(mask.shape)} for {name} of shape {shape}; expected the shape of its "
            f"{name}{'' if name == 'input_ids' else ' without its last dim'} (one entry per token)"
        )
    flags: Tensor = mask.ne(0)
    return flags


def _tokens(batch: object) -> tuple[str, tuple[int, ...], tuple[int, ...]] | None:
    """The input a mapping batch gives its tokens by: its name, its shape and the tokens'
    shape (``input_ids``' own, ``inputs_embeds``' without the last dim); None: neither."""
    if not isinstance(batch, Mapping):
        return None
    ids, embeds = batch.get("input_ids"), batch.get("inputs_embeds")
    if isinstance(ids, Tensor):
        return "input_ids", tuple(ids.shape), tuple(ids.shape)
    if isinstance(embeds, Tensor) and embeds.dim() > 0:
        return "inputs_embeds", tuple(embeds.shape), tuple(embeds.shape[:-1])
    return None
