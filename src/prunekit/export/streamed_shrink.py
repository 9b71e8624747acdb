"""Structural pruning under one budget of a sharded Hugging Face folder, one decoder block in
memory at a time, written compacted: ``shrink_streamed``.

What ``prune_channels(model, ..., budget=..., criterion=..., compensate=True)`` followed by
``compact`` and ``export(model, out, "hf")`` give the whole model in memory, in two streamed
passes over the folder's shards (the model built on the meta device, its embeddings mapped):

1. Score. The calibration batches run up to the first block once. Each block in turn is
   mapped from the shards, its channel groups traced (the MLP channels, the attention heads),
   scored by the criterion on its inputs, run to give the next block's inputs (the dense
   model's: the scores in memory are taken before anything is masked) and let go; the groups
   keep only their shapes.
2. Allocate. The one ``Budget`` is met over the groups of every block at once, by the code
   the in-memory call runs (``structure.stages.meet_budget``).
3. Prune. Each block is mapped again, masked by the allocation, its consumers compensated on
   its inputs (the outputs of the blocks before it, masked and compensated: what the
   in-memory compensation sees, as it runs block by block), run to give the next block's
   inputs, compacted, written into the output shards and let go.

The output is the folder ``export(..., "hf")`` writes for the compacted model: a stock
config where every layer keeps the same widths, else the family's config with a width a layer
and the modeling file ``modeling_pruned.py`` (``export.hf.plan_folder``, on the meta-device
model of compacted shapes), the shards and their index, and every other file of the source.
It is staged beside its folder and swapped in whole: a failure leaves it as it was.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

import prunekit.calibrate as cal
from prunekit.core.errors import type_error, value_error
from prunekit.core.heap import trim
from prunekit.export.hf_folder import MODELING_FILE, plan_folder
from prunekit.export.layer_widths import DecoderLayer, decoder_layers
from prunekit.io.atomic import atomic_folder
from prunekit.io.files import refuse_empty_path
from prunekit.io.folders import copy_companions
from prunekit.io.mapped import Planned, Writer, stored_values
from prunekit.io.sharded import Checkpoint, write_index
from prunekit.io.streamed import (
    COMPUTE,
    check_tokens,
    computed_inputs,
    let_go,
    open_streamed,
    put,
    weight_map,
)
from prunekit.progress import Progress
from prunekit.structure.budget import Budget, BudgetReport
from prunekit.structure.compaction.compact import compact
from prunekit.structure.compaction.hfconfig import update_config
from prunekit.structure.compensation.compensate import Openings, compensate_groups
from prunekit.structure.compensation.damping import check_damping
from prunekit.structure.pruned import PrunedGroup
from prunekit.structure.scoring.criteria import group_criterion, rank
from prunekit.structure.stages.channel_config import ChannelConfig
from prunekit.structure.stages.install_masks import install
from prunekit.structure.stages.meet_budget import meet
from prunekit.structure.stages.score_units import Scored
from prunekit.structure.stages.trace_groups import trace

__all__ = ["CRITERIA", "ShrinkStreamedConfig", "ShrinkStreamedReport", "shrink_streamed"]

OWNER = "shrink_streamed"
CONFIG = "ShrinkStreamedConfig"
CRITERIA = ("activation", "l1", "l2")
"""The criteria streamed: each scores a block's units from that block alone (and its inputs)."""
MEASURES = ("params", "units")
"""What a streamed budget may count: what the groups' shapes alone tell."""


@dataclass(frozen=True, eq=False)
class ShrinkStreamedConfig:
    """Every option of ``shrink_streamed`` but the folders and the calibration, checked when
    made (the options ``prune_channels`` shares are checked again by its ``ChannelConfig``
    when the call makes it).

    Args:
        budget: the one target, a ``Budget`` counting `params` or `units`, of kinds
            'channels' (the MLP widths) and 'heads' (the default; 'hidden' is not
            streamed).
        criterion: how units rank: 'activation' (the default; |W| x the input norm of every
            column reading the unit, from the calibration batches), 'l1' or 'l2'.
        compensate: True (the default): the layers reading removed units (``o_proj``,
            ``down_proj``) get the least-squares update of ``prune_channels(...,
            compensate=True)``; False: none.
        damping: the compensation's damping, a number > 0, 'rows' or 'auto' (None:
            ``prune_channels``' default); only with `compensate`.
        round_to: MLP widths kept as a multiple of it (an int >= 1; None: 1).
        progress: a bar on stderr (default: when stderr is a terminal).

    Raises:
        TypeError: a budget that is no Budget, or an option of the wrong type.
        ValueError: a budget of another measure or of kind 'hidden', a criterion not in
            ``CRITERIA``, a damping or round_to ``prune_channels`` refuses (damping without
            compensation too).
    """

    budget: Budget
    criterion: str = "activation"
    compensate: bool = True
    damping: float | str | None = None
    round_to: int | None = None
    progress: bool | None = None

    def __post_init__(self) -> None:
        budget = self.budget
        if not isinstance(budget, Budget):
            raise type_error(
                f"{CONFIG}: invalid budget={budget!r}; expected a prunekit.Budget such as "
                "Budget(params=0.2)"
            )
        if budget.measure not in MEASURES or "hidden" in budget.kinds:
            raise value_error(
                f"{CONFIG}: invalid budget={budget!r}; expected a Budget of params= or units= "
                "over the kinds 'channels' and 'heads' (MACs and latency need the whole model "
                "run, and the hidden width runs through every block)"
            )
        if not isinstance(self.criterion, str) or self.criterion not in CRITERIA:
            raise value_error(
                f"{CONFIG}: invalid criterion={self.criterion!r}; expected one of "
                f"{', '.join(CRITERIA)} (criteria that score a block from its own inputs)"
            )
        if not isinstance(self.compensate, bool):
            raise type_error(
                f"{CONFIG}: invalid compensate={self.compensate!r}; expected True or False"
            )
        if self.progress is not None and not isinstance(self.progress, bool):
            raise type_error(
                f"{CONFIG}: invalid progress={self.progress!r}; expected True, False or None"
            )
        _check_compensation(self.compensate, self.damping, self.round_to)
        self.channels([torch.zeros(1, 1, dtype=torch.long)])  # the rest, as prune_channels

    def channels(self, calibration: Sequence[object]) -> ChannelConfig:
        """The in-memory ``ChannelConfig`` of the same options on the `calibration` batches
        (given where the criterion or the compensation takes them)."""
        wanted = self.compensate or self.criterion == "activation"
        return ChannelConfig(
            criterion=self.criterion,
            budget=self.budget,
            compensate=self.compensate,
            damping=self.damping,
            round_to=self.round_to,
            calibration=calibration if wanted else None,
        )


def _check_compensation(compensate: bool, damping: object, round_to: object) -> None:
    """Refuse, in the config's name, a damping or round_to ``prune_channels`` refuses."""
    if round_to is not None and (
        isinstance(round_to, bool) or not isinstance(round_to, int) or round_to < 1
    ):
        raise value_error(
            f"{CONFIG}: invalid round_to={round_to!r}; expected an int >= 1, or None (the MLP "
            "widths are kept as a multiple of it)"
        )
    if damping is None:
        return
    if not compensate:
        raise value_error(
            f"{CONFIG}: damping={damping!r} needs compensate=True (it damps that "
            "least-squares update), not compensate=False; expected compensate=True or no damping"
        )
    check_damping(damping, CONFIG)


@dataclass(frozen=True)
class ShrinkStreamedReport:
    """What ``shrink_streamed`` wrote.

    Attributes:
        index: the index of the output shards.
        blocks: the decoder blocks streamed.
        budget: the allocation: the groups that lost units, what each kept, the share met.
        layers: the widths of every decoder layer written.
        params_before: the parameters of the source model.
        params_after: the parameters written.
    """

    index: Path
    blocks: int
    budget: BudgetReport
    layers: list[DecoderLayer]
    params_before: int
    params_after: int


def shrink_streamed(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    calibration: Iterable[object],
    config: ShrinkStreamedConfig,
) -> ShrinkStreamedReport:
    """Prune the channels and heads of the sharded Hugging Face folder `path` under one
    budget, block by block, and write the compacted model into the folder `out`: what
    ``prune_channels(model, ..., budget=..., criterion=..., compensate=...)``, ``compact``
    and ``export(model, out, "hf")`` give in memory (the same units kept; weights to float
    rounding), holding one block at a time (see the module's docstring).

    Args:
        path: a folder as ``save_pretrained`` writes it: config.json and safetensors shards
            with ``model.safetensors.index.json``, of a family in
            ``prunekit.io.streamed.FAMILIES``.
        out: the output folder (made if missing).
        calibration: batches for the model's forward (tensors of token ids, or mappings
            such as ``{"input_ids": ...}``): the inputs the groups are traced, scored and
            compensated on.
        config: the options.

    Returns:
        The index written, the allocation, every layer's widths, the parameters before and
        after.

    Raises:
        TypeError: an argument or batch of the wrong type.
        ValueError: a bad argument or batch, a model family not streamed, or a budget that
            cannot be met.
        CheckpointError: a folder that cannot be read or written, or too little free disk.

    The output is left as it was on any error.
    """
    refuse_empty_path(OWNER, "out", out)  # Path("") is ".": the current folder
    if not isinstance(config, ShrinkStreamedConfig):
        raise type_error(f"{OWNER}: invalid config={config!r}; expected a ShrinkStreamedConfig")
    batches = cal.batch_list(calibration, OWNER)
    check_tokens(batches, OWNER)
    channel = config.channels(batches)
    checkpoint, model, blocks, folder = open_streamed(path, out)
    check_tokens(batches, OWNER, model)  # a tuple batch's mask, by the forward's names
    source = checkpoint.index.parent
    before = sum(p.numel() for p in _unique(model))
    run = _Run(model, blocks, checkpoint, channel, batches,
               Progress("shrink streamed", 2 * len(blocks), config.progress))  # fmt: skip
    try:
        with cal.evaluating(model), torch.no_grad():
            scored = _score_pass(run)
            assert channel.budget is not None
            chosen = meet(model, None, scored.groups, scored.scores, channel.budget,
                          channel.round_to)  # fmt: skip
            with atomic_folder(folder) as stage:
                index = _prune_pass(run, list(chosen), stage)
                _write_config(model, source, stage)
    finally:
        run.bar.close()
    after = sum(p.numel() for p in _unique(model))
    layers = decoder_layers(model)
    return ShrinkStreamedReport(folder / index.name, len(blocks), chosen, layers, before, after)


@dataclass
class _Run:
    """One streamed shrink's model, blocks, source, options, batches and bar."""

    model: nn.Module
    blocks: nn.ModuleList
    checkpoint: Checkpoint
    channel: ChannelConfig
    batches: list[object]
    bar: Progress

    def prefix(self, i: int) -> str:
        return f"model.layers.{i}"

    def load(self, i: int) -> _Holder:
        """Map block `i`'s tensors from the shards (a half-precision folder's as float32
        copies: io.streamed.COMPUTE); the block at its path in the model."""
        prefix = self.prefix(i)
        for name, _ in list(self.blocks[i].named_parameters()):
            stored = self.checkpoint.tensors[f"{prefix}.{name}"]
            put(self.model, f"{prefix}.{name}", stored, COMPUTE.get(stored.dtype))
        return _Holder(prefix, self.blocks[i])

    def release(self, i: int) -> None:
        """Put block `i`'s tensors back on the meta device and free their memory."""
        self.blocks[i] = let_go(self.blocks[i])
        trim()
        self.bar.advance()


class _Holder(nn.Module):
    """A decoder block at its path in the model (``model.layers.3``), so that its groups and
    modules are named as in the model; its forward is the block's, on keyword arguments."""

    def __init__(self, path: str, block: nn.Module) -> None:
        super().__init__()
        parent: nn.Module = self
        *heads, leaf = path.split(".")
        for part in heads:
            child = nn.Module()
            parent.add_module(part, child)
            parent = child
        parent.add_module(leaf, block)
        object.__setattr__(self, "block", block)  # not a second submodule

    def forward(self, **kwargs: object) -> object:
        block: nn.Module = self.__dict__["block"]
        return block(**kwargs)


def _calls(inputs: Sequence[cal.Inputs], masks: Sequence[Tensor | None]) -> list[dict[str, object]]:
    """Each captured call of a block as the keyword arguments of its holder, with the
    token mask of its batch (`masks`, ``cal.batch_masks``): padding counts no more than in
    memory."""
    found: list[dict[str, object]] = []
    for (args, kwargs), tokens in zip(inputs, masks, strict=True):
        assert len(args) == 1, "a decoder block takes its hidden states first"
        found.append(cal.TokenCall({"hidden_states": args[0], **kwargs}, tokens))
    return found


def _first_inputs(
    run: _Run,
) -> tuple[list[cal.Inputs], cal.BlockCalls | None, list[Tensor | None]]:
    """What each pass starts from: the first block's inputs of every batch, every block's
    own call (its mask, its rotary embedding) and each batch's token mask."""
    inputs = computed_inputs(
        cal.capture_block_inputs(run.model, run.blocks[0], run.batches, owner=OWNER)
    )
    own = cal.block_calls(run.model, run.blocks, run.batches, owner=OWNER)
    return inputs, own, cal.batch_masks(run.batches, owner=OWNER, model=run.model)


def _score_pass(run: _Run) -> Scored:
    """Pass 1: every block's candidate groups and their scores, on the dense model's inputs."""
    channel = run.channel
    inputs, own, masks = _first_inputs(run)
    groups, scores = [], []
    for i in range(len(run.blocks)):
        holder = run.load(i)
        calls = _calls(inputs, masks)
        traced = trace(holder, calls[0], channel)
        scoring = None if channel.scoring is None else list(calls)
        found = group_criterion(channel.criterion)
        scores += rank(holder, traced.groups, found, scoring, None, "a budget")
        groups += traced.groups
        if i + 1 < len(run.blocks):
            inputs = cal.called_as(cal.next_inputs(run.blocks[i], inputs, owner=OWNER), own, i + 1)
            inputs = computed_inputs(inputs)
        del holder
        run.release(i)
    return Scored(groups, scores)


def _prune_pass(run: _Run, chosen: list[PrunedGroup], stage: Path) -> Path:
    """Pass 2: every block masked by `chosen`, compensated, compacted and written into
    `stage`, the other tensors copied; returns the index written."""
    shapes = _shapes(run.checkpoint, chosen)
    plans: dict[str, list[Planned]] = {}
    for name, s in run.checkpoint.tensors.items():
        plans.setdefault(s.path.name, []).append(Planned(name, s.code, shapes[name]))
    files = {f: run.checkpoint.files.get(f, {}) for f in plans}
    writer = Writer(stage, plans, files)
    try:
        inputs, own, masks = _first_inputs(run)
        for i in range(len(run.blocks)):
            inputs = _prune_block(run, i, chosen, inputs, writer, masks)
            if i + 1 < len(run.blocks):
                inputs = computed_inputs(cal.called_as(inputs, own, i + 1))
        inside = tuple(f"{run.prefix(i)}." for i in range(len(run.blocks)))
        for name, stored in run.checkpoint.tensors.items():
            if not name.startswith(inside):
                writer.copy(name, stored)
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    size = sum(writer.sizes.values())
    return write_index(stage, run.checkpoint.metadata, weight_map(run.checkpoint), size)


def _prune_block(
    run: _Run, i: int, chosen: list[PrunedGroup], inputs: list[cal.Inputs], writer: Writer,
    masks: Sequence[Tensor | None],
) -> list[cal.Inputs]:  # fmt: skip
    """Mask, compensate, compact and write block `i` (`masks`: each input's tokens that
    count); returns the next block's inputs (the outputs of this one, masked and
    compensated)."""
    holder = run.load(i)
    prefix = f"{run.prefix(i)}."
    mine = [p for p in chosen if all(s.module_name.startswith(prefix) for s in p.group.slices)]
    pairs = [(p.group, p.units) for p in mine]
    calls = _calls(inputs, masks)
    openings = Openings(holder, pairs)
    install(holder, mine)
    batches = run.channel.batches
    if batches is not None and pairs:
        compensate_groups(holder, pairs, openings, calls, run.channel.level,
                          run.channel.token_weights, owner=OWNER)  # fmt: skip
    if i + 1 < len(run.blocks):
        inputs = cal.next_inputs(run.blocks[i], inputs, owner=OWNER)
    if mine:
        compact(holder, calls[0], latency_runs=0)
    params = dict(run.blocks[i].named_parameters())
    for name, stored in run.checkpoint.tensors.items():
        if not name.startswith(prefix):
            continue
        param = params.get(name[len(prefix) :])
        if param is None:  # no parameter of the model (rotary frequencies): as stored
            writer.copy(name, stored)
            continue
        values = stored_values(name, param.detach(), stored.dtype, OWNER)
        want = writer.where[name][2]
        assert tuple(values.shape) == want.shape, (name, values.shape, want.shape)
        writer.write(name, 0, values.reshape(-1))
    del holder, openings
    run.release(i)
    return inputs


def _shapes(checkpoint: Checkpoint, chosen: list[PrunedGroup]) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape once the units of `chosen` are removed (as compact slices)."""
    removed: dict[str, dict[int, set[int]]] = {}
    for p in chosen:
        for s in p.group.slices:
            if s.is_buffer:
                continue
            at = removed.setdefault(s.qualified, {}).setdefault(s.dim, set())
            at.update(q for u in p.units for q in s.indices[u])
    shapes = {}
    for name, stored in checkpoint.tensors.items():
        gone = removed.get(name, {})
        shapes[name] = tuple(n - len(gone.get(d, ())) for d, n in enumerate(stored.shape))
    return shapes


def _write_config(model: nn.Module, source: Path, stage: Path) -> None:
    """Every file of `source` beside its weights, then the config (and the modeling file)
    ``export(..., "hf")`` writes for the compacted model (its blocks on the meta device)."""
    copy_companions(source, stage)
    update_config(model)
    plan = plan_folder(model)
    plan.config.save_pretrained(str(stage))
    if plan.module is not None:
        shutil.copyfile(plan.module, stage / MODELING_FILE)


def _unique(model: nn.Module) -> list[Tensor]:
    return list({id(p): p for p in model.parameters()}.values())
