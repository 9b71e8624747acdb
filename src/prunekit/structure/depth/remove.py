"""``remove_blocks``: delete the skipped blocks, renumber the rest, update the config, and
check the result.

What follows a removed block moves up: every attribute inside a kept block that holds its
position (``layer_idx``, the attention's index into a key/value cache, and any other a model
built from the config numbers so) becomes the block's new position. A Hugging Face config
(or sub-config) whose ``num_hidden_layers`` counted the list gets the new count, and every
field that describes layers by their position is rewritten for the kept layers or refused
(``depth.layerconfig``). Maps fitted by ``prune_blocks(..., replace='linear')`` are folded
into their projections' weights first. Before returning, a model built from the updated
config must build the kept layers as the old one did (``depth.removal_checks``), and the
model must compute on example inputs what it computed with the blocks skipped
(``depth.outputs``); where the model built from the updated config differs outside the
blocks (lacking what only the removed layers' kind used: Gemma 3's rotary tables of an
attention kind no kept layer has, Qwen2's sliding-window mask), it is built for real with
this model's weights and must compute the same too. A failure restores the model and its
config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from prunekit.core.errors import type_error, value_error
from prunekit.core.example_inputs import ExampleInputs
from prunekit.core.transaction import transaction
from prunekit.structure.depth.blocks import BlockList, find_blocks, is_skipped, skipped, unskip
from prunekit.structure.depth.layerconfig import layer_config, rewrite
from prunekit.structure.depth.linear import fold, fold_problem, is_projection, replacement_of
from prunekit.structure.depth.outputs import check_outputs, reference_outputs
from prunekit.structure.depth.removal_checks import (
    built,
    check_rebuilt,
    check_reloaded,
    index_attributes,
)
from prunekit.structure.depth.states import check_inputs
from prunekit.structure.measure import count_params

__all__ = ["BlockRemoval", "remove_blocks"]

_OWNER = "remove_blocks"


@dataclass(frozen=True)
class BlockRemoval:
    """What ``remove_blocks`` did; ``str()`` says it in a few lines.

    Attributes:
        blocks: the dotted name of the ModuleList the blocks were removed from.
        removed: the indices removed, as they were numbered before the removal.
        folded: the names of the projections a replacement linear map was folded into.
        params_before: the model's parameter count before the removal.
        params_after: the count after it.
        config: the config fields set to the new depth (``num_hidden_layers``, per-layer
            lists), by name.
        max_abs_diff: the largest absolute difference between the outputs of the skipped
            model and of the one with the blocks removed, on the example inputs; None
            without example inputs.
        max_abs_output: the largest absolute output on the example inputs (the scale of
            `max_abs_diff`); None without example inputs.
    """

    blocks: str
    removed: tuple[int, ...]
    folded: tuple[str, ...]
    params_before: int
    params_after: int
    config: dict[str, Any] = field(default_factory=dict)
    max_abs_diff: float | None = None
    max_abs_output: float | None = None

    def __str__(self) -> str:
        share = self.params_after / self.params_before if self.params_before else 1.0
        lines = [
            f"removed {len(self.removed)} blocks of {self.blocks}: {list(self.removed)}",
            f"parameters {self.params_before:,} -> {self.params_after:,} ({share:.1%})",
        ]
        if self.folded:
            lines.append("linear maps folded into: " + ", ".join(self.folded))
        if self.config:
            lines.append("config: " + ", ".join(f"{k}={v}" for k, v in self.config.items()))
        if self.max_abs_diff is None:
            lines.append("output check: none (no example inputs)")
        else:
            share = self.max_abs_diff / self.max_abs_output if self.max_abs_output else 0.0
            lines.append(f"output check: max |diff| / max |output| = {share:.2e}")
        return "\n".join(lines)


def remove_blocks(model: nn.Module, *, blocks: str | None = None,
                  example_inputs: ExampleInputs | None = None) -> BlockRemoval:  # fmt: skip
    """Remove the blocks ``prune_blocks`` (or ``skip_blocks``) skipped, in place, and check
    the result.

    Args:
        model: the model whose blocks were skipped.
        blocks: the name of the ModuleList (``'model.layers'``); None finds it as
            ``prune_blocks`` does.
        example_inputs: inputs the model's forward takes, on which the model with the
            blocks removed must compute what it computed with them skipped (relative
            tolerance 1e-4 on each floating tensor of the output); None: those the blocks
            were skipped with (``prune_blocks``' first calibration batch, ``skip_blocks``'
            example inputs), else for a Hugging Face model taking ``input_ids`` a few ids
            of its vocabulary, else no output check (``BlockRemoval.max_abs_diff`` None).

    Returns:
        A ``BlockRemoval``.

    Raises:
        TypeError: `model` is no ``nn.Module``.
        ValueError: no ModuleList of that name, no skipped block in it, a linear map that
            cannot be folded exactly, a config field that depends on layer positions and
            cannot express the kept layers (named), a model built from the updated config
            that would differ from this one in the kept layers (the difference named), or
            outside them and, given this model's weights, would not take them or compute
            the same on the example inputs (or there are none to run), or
            outputs that differ from the skipped model's (a parent that does more than
            ``h = block(h)`` or ``h = h + block(h)``). The model and its config are then
            exactly as they were.
    """
    if not isinstance(model, nn.Module):
        raise type_error(f"{_OWNER}: model={model!r} is no torch.nn.Module")
    found = find_blocks(model, blocks, _OWNER)
    check_inputs(example_inputs, _OWNER)
    removed = _removed(found)
    count = len(found)
    kept = [i for i in range(count) if i not in removed]
    before = count_params(model)
    maps = _folds(model)
    root = getattr(model, "config", None)
    layered = layer_config(root, count)
    changes = rewrite(layered, count, kept) if layered is not None else {}
    rebuilt = _built_before(model, root, found.name, count)
    inputs = example_inputs if example_inputs is not None else _inputs(model, found)
    reference = reference_outputs(model, inputs, explicit=example_inputs is not None)
    with transaction(model):  # the modules, the block list and the config
        folded = _fold(maps)
        _delete(found, removed, index_attributes(rebuilt, found.name))
        for key, value in changes.items():
            setattr(layered, key, value)
        outside = None
        if rebuilt is not None:
            outside = check_rebuilt(model, rebuilt, root, found.name, kept)
        diff, scale = check_outputs(model, inputs, reference, found.name, removed)
        if outside is not None:  # what no kept layer uses, say: run it to be sure
            check_reloaded(model, root, inputs, reference, outside)
    after = count_params(model)
    return BlockRemoval(found.name, removed, folded, before, after, changes, diff, scale)


def _removed(found: BlockList) -> tuple[int, ...]:
    """The indices of the skipped blocks, at least one and not all of them."""
    removed = tuple(i for i, block in enumerate(found.modules) if is_skipped(block))
    if not removed:
        raise value_error(
            f"{_OWNER}: no block of {found.name} is skipped; expected prune_blocks (or "
            "skip_blocks) first"
        )
    if len(removed) == len(found):
        raise value_error(
            f"{_OWNER}: every block of {found.name} is skipped; expected at least one kept"
        )
    return removed


def _built_before(model: nn.Module, config: Any, path: str, count: int) -> nn.Module | None:
    """`model`'s class built from its config before the removal, where the config describes
    the block list at `path` (a list of `count` blocks there); None otherwise."""
    fresh = built(model, config)
    try:
        blocks = fresh.get_submodule(path) if fresh is not None else None
    except AttributeError:
        return None
    return fresh if isinstance(blocks, nn.ModuleList) and len(blocks) == count else None


def _inputs(model: nn.Module, found: BlockList) -> Any:
    """The example inputs recorded with the skipped blocks, else a few ids for a Hugging
    Face model that takes ``input_ids``; None: none."""
    for block in found.modules:
        held = skipped(block)
        if held is not None and held.inputs is not None:
            return held.inputs
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if getattr(model, "main_input_name", None) == "input_ids" and isinstance(vocab, int):
        ids = torch.randint(0, max(vocab, 1), (1, 8), generator=torch.Generator().manual_seed(0))
        return {"input_ids": ids}
    return None


def _folds(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The projections holding a fitted map, each checked to take it exactly (refused with
    the reason before anything changes)."""
    found = [(name, module) for name, module in model.named_modules()
             if is_projection(module) and replacement_of(module) is not None]  # fmt: skip
    for name, module in found:
        problem = fold_problem(module, name)
        if problem is not None:
            raise value_error(
                f"{_OWNER}: cannot fold the linear map of prune_blocks(..., replace='linear') "
                f"into {name}: {problem}; the model is unchanged"
            )
    return found


def _fold(found: list[tuple[str, nn.Module]]) -> tuple[str, ...]:
    for _, module in found:
        fold(module)
    return tuple(name for name, _ in found)


def _delete(found: BlockList, removed: tuple[int, ...], indexed: set[tuple[str, str]]) -> None:
    """Delete the `removed` blocks; each kept block's attributes that hold its position
    (`indexed`: module name inside the block, or '*' for any, and attribute) take the new."""
    kept = [block for i, block in enumerate(found.modules) if i not in removed]
    for i in removed:
        unskip(found.modules[i])
    found.modules._modules.clear()
    for index, block in enumerate(kept):
        found.modules._modules[str(index)] = block
        for name, module in block.named_modules():
            for where, key in indexed:
                value = vars(module).get(key)
                if where in ("*", name) and type(value) is int:
                    setattr(module, key, index)
