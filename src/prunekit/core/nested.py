"""The values inside a batch: one walk over its mappings, lists and tuples, and one way to name
where each value sits.

A batch is what a model's forward is given (``core.example_inputs``): a tensor, a tuple or list
of positional arguments, or a mapping of keyword arguments (a tokenizer's ``BatchEncoding``, a
``ModelOutput`` fed back in); an argument may itself hold tensors in mappings, lists and tuples
(a key/value cache: a tuple of tuples). The checks that look into a batch (a meta tensor, a
value that is not finite, a description in an error) all walk it here, as deep, in the same
order, and name a place the same way.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

__all__ = ["LEVELS", "described", "first_not_finite", "is_numeric", "leaves", "tensors"]

LEVELS = 3
"""How many levels of mappings, lists and tuples are looked into: the batch, an argument of it,
and one level inside that (a cache's tuple per layer); a container deeper down is a leaf."""

_SHOWN = 4
"""How many leaves a description shows before it counts the rest."""


def leaves(batch: Any) -> Iterator[tuple[str, Any]]:
    """Each value of `batch` not looked into, with the name of its place, in order.

    Args:
        batch: a tensor, a mapping of keyword arguments, a tuple or list of positional
            arguments, or any other value.

    Returns:
        Pairs ``(place, value)``: tensors, values other than mappings, lists and tuples, empty
        ones, and those `LEVELS` deep. A place is ``''`` for the batch itself, the key of a
        keyword argument (``input_ids``), ``argument <i>`` for a positional one, with a
        subscript per level further in (``past_key_values[0][1]``, ``argument 0['ids']``).
    """
    yield from _walk(batch, "", 0)


def _walk(value: Any, place: str, depth: int) -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        items: list[tuple[str, Any]] = [
            (str(key) if depth == 0 else f"{place}[{key!r}]", item) for key, item in value.items()
        ]
    elif isinstance(value, list | tuple):
        items = [
            (f"argument {k}" if depth == 0 else f"{place}[{k}]", item)
            for k, item in enumerate(value)
        ]
    else:
        items = []
    if not items or depth >= LEVELS:
        yield place, value
        return
    for name, item in items:
        yield from _walk(item, name, depth + 1)


def tensors(batch: Any) -> list[Tensor]:
    """The tensors of `batch` (see ``leaves``), in order.

    Args:
        batch: a batch, as ``leaves`` takes it.

    Returns:
        Each tensor found, as it is (not copied, not detached).
    """
    return [value for _, value in leaves(batch) if isinstance(value, Tensor)]


def is_numeric(value: Any) -> bool:
    """Whether `value` is a tensor whose values can be NaN or infinite, and are there to
    read: floating or complex (a complex value is finite when both its parts are), not meta.

    Args:
        value: any value (a leaf of a batch, a parameter).

    Returns:
        True for a floating or complex tensor with values.
    """
    return (
        isinstance(value, Tensor)
        and (value.is_floating_point() or value.is_complex())
        and not value.is_meta
    )


def first_not_finite(batch: Any) -> str | None:
    """The first value of `batch`'s numeric tensors (see ``is_numeric``, ``leaves``) that
    is NaN or infinite (a complex one with either part so), and where it is: the rule every
    check of a batch's values follows.

    Args:
        batch: a batch, as ``leaves`` takes it.

    Returns:
        e.g. ``'nan at index (2, 5) of shift[0][0]'``; None if every value is finite.
    """
    for place, value in leaves(batch):
        if not is_numeric(value):
            continue
        bad = ~torch.isfinite(value.detach())
        if bool(bad.any()):
            first = tuple(int(i) for i in bad.nonzero()[0])
            where = f" of {place}" if place else ""
            return f"{value.detach()[first].item()} at index {first}{where}"
    return None


def described(batch: Any) -> str:
    """`batch` as errors name it: its first few leaves' places with a tensor's shape and dtype,
    or the type of another value.

    Args:
        batch: a batch, as ``leaves`` takes it.

    Returns:
        e.g. ``'input_ids: a tensor of shape (2, 8), torch.int64; attention_mask: ...'``, or
        ``'a tensor of shape (5, 6), torch.float32'`` for a tensor, ``'an empty dict'``.
    """
    found = list(leaves(batch))
    shown = [f"{place}: {_one(value)}" if place else _one(value) for place, value in found[:_SHOWN]]
    more = [f"{len(found) - _SHOWN} more"] if len(found) > _SHOWN else []
    return "; ".join(shown + more)


def _one(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)}, {value.dtype}"
    if isinstance(value, Mapping | list | tuple) and not value:
        return f"an empty {type(value).__name__}"
    return f"a {type(value).__name__}"
