"""``prune_channels``: mask the least important units of each channel group.

A thin entry: the options become one checked ``ChannelConfig``, and the stages of
``prunekit.structure.stages`` run in one transaction (trace -> score -> allocate ->
compensate -> install). Masks go on every parameter slice of a chosen unit through
``prunekit.custom_from_mask``, so the model trains, reports, saves and unprunes as any
pruned model; ``compact`` removes them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from prunekit.core.checks import refuse_meta
from prunekit.core.errors import type_error, value_error
from prunekit.core.example_inputs import ExampleInputs
from prunekit.core.transaction import transaction
from prunekit.structure.graph.graph import check_model
from prunekit.structure.pruned import PrunedGroup
from prunekit.structure.stages.allocate_units import allocate
from prunekit.structure.stages.channel_config import (
    DAMPING,
    ChannelConfig,
    ChannelOptions,
    check_rows,
)
from prunekit.structure.stages.compensate_layers import plan_compensation
from prunekit.structure.stages.install_masks import install
from prunekit.structure.stages.score_units import score
from prunekit.structure.stages.trace_groups import trace

if TYPE_CHECKING:  # Unpack is in typing from Python 3.11 on
    from typing_extensions import Unpack

__all__ = ["DAMPING", "ChannelConfig", "prune_channels", "run_stages"]


def prune_channels(
    model: nn.Module,
    example_inputs: ExampleInputs,
    amount: float = 0.0,
    *,
    config: ChannelConfig | None = None,
    **options: Unpack[ChannelOptions],
) -> list[PrunedGroup]:
    """Mask `amount` of the channels of every prunable group of `model` (whole units).

    The lowest-scoring units of each channel group (or of the heads, hidden widths and
    routed experts, or across all groups to meet one budget) are masked on every parameter
    slice they own; the layers that read them may then be compensated. Every option is a
    field of ``ChannelConfig``, which says what each means and checks them all before the
    model is touched.

    Args:
        model: the model to mask, in place, in one transaction (a failed call leaves it
            as it was).
        example_inputs: what its forward takes (a tensor, a tuple of them, or a mapping of
            keyword arguments), traced once to find the groups.
        amount: the share of the channels of each group to mask, in [0, 1).
        config: every option at once, a ``ChannelConfig`` (then neither `amount` nor any
            keyword beside it).
        **options: the other fields of ``ChannelConfig`` by name: `criterion`, `scope`,
            `exclude`, `round_to`, `heads`, `hidden`, `experts`, `gqa`, `calibration`,
            `loss`, `budget`, `compensate`, `ignore`, `damping`, `token_weights`.

    Returns:
        The groups pruned, each with the units now masked; with a budget, a
        ``BudgetReport``.

    Raises:
        ValueError: a tensor of `model` on the meta device (no values), `example_inputs`
            the model's forward fails on (the model's error its cause), an option out of
            range or in conflict with another (``ChannelConfig``),
            a kind of group the model does not have, a budget that cannot be met, a
            criterion's scores of the wrong shape, not finite, or below 0 under a budget or
            scope='global', or a `config` beside keywords.
        TypeError: a `model` that is no torch module, an option of the wrong type or an
            unknown keyword.

    Warns:
        UserWarning: once per call, where a share (`amount`, `heads`, `hidden`,
            `experts`) rounds to no unit of a group (of all its kind under
            scope='global'): to 0 units, or under `round_to` at or near the group's width;
            it names the first such group and the rule, and nothing else changes.
    """
    check_model(model, "prune_channels")
    refuse_meta("prune_channels", model)
    return run_stages(model, example_inputs, _config(amount, config, options))


def run_stages(model: nn.Module, example_inputs: Any, config: ChannelConfig) -> list[PrunedGroup]:
    """Run the stages of ``prune_channels`` on `model` under `config`, in one transaction.

    Args:
        model: the model to mask.
        example_inputs: what its forward takes.
        config: the checked options.

    Returns:
        The groups pruned (a ``BudgetReport`` with a budget).

    Raises:
        ValueError: as ``prune_channels``; the model is then as it was.
    """
    check_rows(config, model)  # a tuple batch's mask, which the model's forward names
    with transaction(model) as recorded:  # the traced and calibrating forwards write buffers
        scored = score(model, trace(model, example_inputs, config), config)
        chosen = allocate(model, example_inputs, scored, config)
        compensation = plan_compensation(model, chosen, config, recorded)
        install(model, chosen)
        if compensation is not None:
            compensation.apply(model)
    return chosen


def _config(amount: float, config: object, options: ChannelOptions) -> ChannelConfig:
    """The config of a call: `config` alone, or one made of `amount` and `options`."""
    unknown = [k for k in options if k not in ChannelOptions.__optional_keys__]
    if unknown:  # as Python words it for a keyword the signature lacks
        raise TypeError(f"prune_channels() got an unexpected keyword argument {unknown[0]!r}")
    if config is None:
        return ChannelConfig(amount, **options)
    if not isinstance(config, ChannelConfig):
        raise type_error(
            f"prune_channels: invalid config={config!r}; expected a ChannelConfig, or None"
        )
    if amount != 0.0 or options:
        given = ([f"amount={amount!r}"] if amount != 0.0 else []) + [f"{k}=" for k in options]
        raise value_error(
            f"prune_channels: config= holds every option, but {', '.join(given)} came beside "
            "it; expected config=dataclasses.replace(config, ...) or the keywords alone"
        )
    return config
