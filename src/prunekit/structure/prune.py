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

from prunekit.core.errors import type_error, value_error
from prunekit.core.transaction import transaction
from prunekit.structure.graph.graph import check_model
from prunekit.structure.pruned import PrunedGroup
from prunekit.structure.stages.allocate_units import allocate
from prunekit.structure.stages.channel_config import DAMPING, ChannelConfig, ChannelOptions
from prunekit.structure.stages.compensate_layers import prepare
from prunekit.structure.stages.install_masks import install
from prunekit.structure.stages.score_units import score
from prunekit.structure.stages.trace_groups import trace

if TYPE_CHECKING:  # Unpack is in typing from Python 3.11 on
    from typing_extensions import Unpack

__all__ = ["DAMPING", "ChannelConfig", "prune_channels", "run_stages"]


def prune_channels(
    model: nn.Module,
    example_inputs: Any,
    amount: float = 0.0,
    *,
    config: ChannelConfig | None = None,
    **options: Unpack[ChannelOptions],
) -> list[PrunedGroup]:
    """Mask `amount` of the channels of every prunable group of `model` (whole units).

    `amount` applies to the groups of kind 'channels' (conv and linear outputs, MLP widths),
    `heads` to the heads of each attention module (kind 'heads'), `hidden` to the widths
    that LayerNorm/RMSNorm normalize over (kind 'hidden': the embedding width through every
    residual). The norms of a masked hidden width then normalize over its kept channels, so
    the masked model computes what ``compact`` makes of it; a hidden width that reaches the
    model's output makes that output narrower once compacted. `experts`: the routed experts
    of each mixture-of-experts block (kind 'experts'; shared experts are no such unit): a
    masked expert's router logit is -inf while masked, so the masked model routes as the
    compacted one will. `gqa`: the head unit of an attention with grouped-query heads, as in
    ``channel_groups``.

    `scope='layer'`: each group loses round(amount x its units); 'global': the units of all
    groups of a kind are ranked together (scores divided by their group's mean), and that
    share of all of them goes (heads with key/value groups are always counted per module).
    Units already masked score 0, so pruning again to the same amount changes nothing. A
    group keeps at least one unit (one query head per key/value group), and channel and
    hidden groups a number of units that is a multiple of `round_to`; without it, of what
    the model's own kernels need where they constrain a width, else of 1 (the widths a
    mixture-of-experts block's fused experts span: multiples of 16 bytes, 4 float32
    channels, which grouped_mm needs). `exclude`: modules
    (or their names, globs allowed; a block stands for its layers) whose output channels
    stay (those of a norm or a depthwise conv are its input channels too); their input
    channels still follow their producers (``ignore=``, its old name, warns). `calibration`:
    batches for the criteria that learn from data ('activation'; 'taylor' with
    `loss(output, batch)`, default ``output.loss``), as prune_model takes them. `budget`:
    one target for the whole model instead of `amount`, `heads` and `hidden` (a ``Budget``:
    a share of the parameters, MACs, measured latency or units), met by removing the units
    of lowest score for their cost across all groups of its kinds (see
    ``prunekit.structure.budget``); the result is then a ``BudgetReport``, the same list
    with what each group kept.
    `compensate=True`: the layers that read removed channels or heads get the least-squares
    update of their kept input columns (and bias) that keeps their output on the
    `calibration` batches (needed then), taken in forward order on the model as masked so
    far (``prunekit.structure.compensation.compensate``); `compensate='reference'`: those layers and
    every Linear or convolution that runs after the first of them are refitted towards the
    outputs they had in the model as it was before the call, from their inputs in the model
    as pruned so far, which also corrects the error that the layers before them left
    (``prunekit.structure.compensation.refit``; it holds a copy of the model while it runs,
    and runs the model up to each layer for each batch: meant for CNNs). `damping` (with
    `compensate=True` only): the damping of that least-squares solve, a number > 0 relative
    to the mean diagonal of the input's second moment (default 0.3, ``damping.DAMP``), or
    'auto': for each layer, the damping of a log-scale grid whose update, fitted on
    alternate calibration batches, best keeps the layer's output on the others (both ways
    round), then fitted on all of them; a layer where no damping beats leaving it is left,
    with a warning (``prunekit.structure.compensation.damping``). 'obs' and 'fluctuation'
    rank by the error that removal leaves.

    Args:
        model: the model to mask (in place, in one transaction: a failed call leaves it as
            it was).
        example_inputs: what its forward takes (a tensor, a tuple of them, or a mapping of
            keyword arguments), traced once to find the groups.
        amount: the share of the channels of each group to mask, in [0, 1).
        config: every option at once, a ``ChannelConfig`` (then neither `amount` nor any
            keyword beside it).
        **options: the keywords above, each a field of ``ChannelConfig``: `criterion`,
            `scope`, `exclude`, `round_to`, `heads`, `hidden`, `experts`, `gqa`,
            `calibration`, `loss`, `budget`, `compensate`, `ignore`, `damping`.

    Returns:
        The groups pruned, each with the units now masked; with a budget, a
        ``BudgetReport``.

    Raises:
        ValueError: an option out of range or in conflict with another (see
            ``ChannelConfig``), a kind of group the model does not have, a budget that
            cannot be met, `config` beside keywords.
        TypeError: a `model` that is no torch module, an option of the wrong type or an
            unknown keyword.
    """
    check_model(model, "prune_channels")
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
    with transaction(model) as recorded:  # the traced and calibrating forwards write buffers
        scored = score(model, trace(model, example_inputs, config), config)
        chosen = allocate(model, example_inputs, scored, config)
        compensation = prepare(model, chosen, config, recorded)
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
