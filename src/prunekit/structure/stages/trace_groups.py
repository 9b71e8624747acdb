"""The trace stage: the candidate channel groups of a model, as the config asks for them.

Traces the model's coupled channels (``channel_groups``), checks that the kinds the config
prunes exist in it, and keeps the prunable groups of those kinds whose units none of the
excluded modules outputs.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch import nn

from prunekit.core.errors import value_error
from prunekit.structure.graph.graph import ChannelGroup, traced_groups
from prunekit.structure.stages.channel_config import ChannelConfig


@dataclass(frozen=True)
class Traced:
    """What the trace stage hands on: the groups that may lose units, in the graph's order.

    Attributes:
        groups: the candidate groups.
    """

    groups: list[ChannelGroup]


def trace(model: nn.Module, example_inputs: Any, config: ChannelConfig) -> Traced:
    """The candidate groups of `model` traced on `example_inputs` under `config`.

    Args:
        model: the model (its traced forward may write buffers: run it in a transaction).
        example_inputs: what its forward takes, as ``channel_groups`` reads it.
        config: the checked options.

    Returns:
        The candidate groups.

    Raises:
        ValueError: `exclude` names no module of the model (or one outside it), or the
            config prunes a kind of group the model does not have.
        TypeError: `exclude` holds something other than modules and names.
    """
    skipped = _ignored(model, config.excluded, config.excluded_as)
    found = traced_groups(model, example_inputs, config.gqa, "prune_channels")  # gqa checked
    _check_found(model, found, config.amounts)
    held = {id(p) for m in model.modules() if id(m) in skipped
            for p in m._parameters.values() if p is not None}  # fmt: skip
    groups = [g for g in found if g.prunable and not _made_by(g, skipped, held)]
    budget, amounts = config.budget, config.amounts
    wanted = [g for g in groups if (g.kind in budget.kinds if budget else amounts.get(g.kind))]
    return Traced(wanted)


def _made_by(g: ChannelGroup, modules: set[int], params: set[int]) -> bool:
    """Whether one of `modules` (or a module holding one of their `params`: a tied weight)
    outputs the group's channels: it holds a slice of the group other than a consumer's
    input columns (the rows that make them, a depthwise conv's, a bias, a norm's)."""
    outputs = [s for s in g.slices if s.role != "in"]
    return any(
        id(s.module) in modules or id(s.module._parameters.get(s.name)) in params for s in outputs
    )


_KNOWN = {
    "heads": "attention module it knows (nn.MultiheadAttention, BERT, GPT-2, Hugging Face "
    "decoders, ViT)",
    "hidden": "width that a LayerNorm/RMSNorm normalizes",
    "experts": "mixture-of-experts block with a router it knows (Mixtral, Qwen2-MoE, "
    "Qwen3-MoE, OLMoE)",
}


def _check_found(model: nn.Module, found: list[ChannelGroup], amounts: dict[str, float]) -> None:
    """heads= or hidden= on a model where the graph found no such width at all."""
    for kind, what in _KNOWN.items():
        if amounts[kind] and not any(g.kind == kind for g in found):
            raise ValueError(
                f"prune_channels: {kind}={amounts[kind]!r}, but {type(model).__name__} has no "
                f"{what}; expected {kind}=0.0 for this model"
            )


def _ignored(model: nn.Module, ignore: Iterable[nn.Module | str], what: str) -> set[int]:
    """The ids of the modules `ignore` (the argument `what`) names, and of their submodules
    (a block's output channels are made by its layers)."""
    names = dict(model.named_modules())
    found: set[int] = set()
    for item in ignore:
        if isinstance(item, nn.Module):
            if not any(m is item for m in names.values()):
                raise value_error(
                    f"prune_channels: {what} holds a {type(item).__name__} that is no module "
                    "of the model; expected modules of the model or their names"
                )
            found.add(id(item))
        elif isinstance(item, str):
            matched = [m for n, m in names.items() if fnmatch.fnmatchcase(n, item)]
            if not matched:
                raise ValueError(
                    f"prune_channels: {what}={item!r} names no module of the model; expected "
                    f"names such as {list(names)[1:4]} (globs allowed)"
                )
            found.update(id(m) for m in matched)
        else:
            raise TypeError(
                f"prune_channels: {what} holds {item!r}; expected modules or module names"
            )
    return {id(sub) for m in names.values() if id(m) in found for sub in m.modules()}
