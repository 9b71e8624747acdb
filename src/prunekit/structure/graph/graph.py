"""``channel_groups``: trace one forward pass into groups of coupled channel slices.

A group is a set of units (channels that are removed together) and the slices that each unit
owns: positions along one dim of a parameter or buffer of some module. Removing unit u of a
group means removing, in every slice, the positions ``indices[u]``. A group that cannot be
pruned exactly says why in ``reason``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from prunekit.calibrate.batches import example_error
from prunekit.core.errors import value_error
from prunekit.core.example_inputs import ExampleInputs
from prunekit.structure.graph.grouping import build_groups
from prunekit.structure.graph.groups import ChannelGroup, Slice
from prunekit.structure.graph.tables import HANDLERS
from prunekit.structure.trace.tracer import run_traced

__all__ = ["GQA_UNITS", "ChannelGroup", "Slice", "channel_groups", "traced_groups"]


GQA_UNITS = ("query", "group")


def channel_groups(model: nn.Module, example_inputs: ExampleInputs, *, gqa: str = "query") -> list[
    ChannelGroup
]:  # fmt: skip
    """The groups of coupled channels of `model`, traced from one forward on `example_inputs`.

    The forward runs in eval mode without gradients (the model's mode is restored), first
    without computing its costly ops (their outputs are zeros: the graph reads shapes, not
    values); where the model's code or a handler could read those values, it runs again
    computing every op. The model is not changed.

    Args:
        model: the torch module to trace.
        example_inputs: what one forward takes: a tensor, a tuple of positional arguments or
            a dict of keyword arguments (a small batch is enough).
        gqa: the unit of an attention with grouped-query heads: ``'query'`` (query heads,
            the same count from every key/value group) or ``'group'`` (whole key/value
            groups with their query heads).

    Returns:
        Every group of coupled channels, prunable ones first; the others carry the reason
        they are left alone (``ChannelGroup.reason``).

    Raises:
        TypeError: `model` is no ``torch.nn.Module``, or `example_inputs` is none of a
            tensor, a tuple or a dict.
        ValueError: `gqa` is neither ``'query'`` nor ``'group'``, or `example_inputs` is
            empty (its first tensor has no entry), or the model's forward fails on it (the
            model's error its cause).
    """
    check_model(model, "channel_groups")
    check_gqa(gqa, "channel_groups")
    return traced_groups(model, example_inputs, gqa, "channel_groups")


def traced_groups(model: nn.Module, example_inputs: Any, gqa: str, owner: str) -> list[
    ChannelGroup
]:  # fmt: skip
    """The groups, `gqa` unchecked: 'auto' (compact) takes whole key/value groups in the
    attention modules where some are masked whole, query heads elsewhere."""
    args, kwargs = split_inputs(example_inputs, owner)
    first = args[0] if args else next(iter(kwargs.values()), None)
    if isinstance(first, Tensor) and first.numel() == 0:  # no entry carries a channel
        raise value_error(
            f"{owner}: example_inputs is empty (its first tensor has shape "
            f"{tuple(first.shape)}), so no channel reaches any layer to be traced; expected "
            "inputs with at least one sample"
        )
    try:
        tracer, _ = run_traced(model, args, kwargs, HANDLERS, {"gqa": gqa})
    except Exception as error:  # the model's own error, named so; a bug of prunekit's as it is
        raise example_error(owner, error)  # noqa: B904 (the cause is set on a new error)
    return build_groups(tracer)


def check_gqa(gqa: Any, owner: str) -> None:
    if not isinstance(gqa, str) or gqa not in GQA_UNITS:
        raise ValueError(
            f"{owner}: invalid gqa={gqa!r}; expected 'query' (query heads, the same count "
            "from every key/value group) or 'group' (whole key/value groups)"
        )


def check_model(model: Any, owner: str, argument: str = "model") -> None:
    """Refuse (TypeError) a `model` that is no torch module; `argument`: its name in the
    call of `owner`."""
    if not isinstance(model, nn.Module):
        kind = type(model)
        if kind.__module__.split(".")[0] == "tensorplay":
            raise TypeError(
                f"{owner}: {argument} is a TensorPlay module ({kind.__name__}); the channel "
                "graph traces torch ops, which TensorPlay's modules do not run. Expected a "
                "torch.nn.Module"
            )
        raise TypeError(f"{owner}: {argument}={model!r} is no torch.nn.Module")


def split_inputs(example_inputs: Any, owner: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(example_inputs, Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, Mapping):
        return (), dict(example_inputs)
    if isinstance(example_inputs, Sequence) and not isinstance(example_inputs, str):
        return tuple(example_inputs), {}
    raise TypeError(
        f"{owner}: example_inputs={type(example_inputs).__name__}; expected a tensor, a tuple "
        "of positional arguments or a dict of keyword arguments"
    )
