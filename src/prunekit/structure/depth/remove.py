"""``remove_blocks``: delete the skipped blocks, renumber the rest, update the config.

What follows a removed block moves up: every ``layer_idx`` attribute inside a kept block
(the attention's index into a key/value cache) becomes the block's new position. A Hugging
Face config whose ``num_hidden_layers`` counted the list gets the new count, and every list
of it with one entry per layer (``layer_types``, per-layer sliding windows, ...) keeps the
entries of the kept layers; ``max_window_layers`` (Qwen2: the first layers with full
attention) counts the kept ones among them. Maps fitted by ``prune_blocks(...,
replace='linear')`` are folded into their projections' weights first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from prunekit.core.errors import type_error, value_error
from prunekit.core.transaction import transaction
from prunekit.structure.depth.blocks import BlockList, find_blocks, is_skipped, unskip
from prunekit.structure.depth.linear import fold, fold_problem, is_projection, replacement_of
from prunekit.structure.measure import count_params

__all__ = ["BlockRemoval", "remove_blocks"]

_OWNER = "remove_blocks"


@dataclass(frozen=True)
class BlockRemoval:
    """What ``remove_blocks`` did: the ModuleList, the indices removed (as they were), the
    projections a replacement map was folded into, parameters, and the config fields set."""

    blocks: str
    removed: tuple[int, ...]
    folded: tuple[str, ...]
    params_before: int
    params_after: int
    config: dict[str, Any] = field(default_factory=dict)

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
        return "\n".join(lines)


def remove_blocks(model: nn.Module, *, blocks: str | None = None) -> BlockRemoval:
    """Remove the blocks ``prune_blocks`` (or ``skip_blocks``) skipped, in place.

    Args:
        model: the model whose blocks were skipped.
        blocks: the name of the ModuleList (``'model.layers'``); None finds it as
            ``prune_blocks`` does.

    Returns:
        A ``BlockRemoval``.

    Raises:
        TypeError: `model` is no ``nn.Module``.
        ValueError: no ModuleList of that name, or no skipped block in it. Nothing is
            changed then; if anything fails later, model and config are restored.
    """
    if not isinstance(model, nn.Module):
        raise type_error(f"{_OWNER}: model={model!r} is no torch.nn.Module")
    found = find_blocks(model, blocks, _OWNER)
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
    before = count_params(model)
    config = getattr(model, "config", None)
    maps = _folds(model)
    with transaction(model):  # the modules, the block list and the config
        folded = _fold(maps)
        _delete(found, removed)
        changed = _update_config(config, len(found) + len(removed), removed)
    return BlockRemoval(found.name, removed, folded, before, count_params(model), changed)


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


def _delete(found: BlockList, removed: tuple[int, ...]) -> None:
    kept = [block for i, block in enumerate(found.modules) if i not in removed]
    for i in removed:
        unskip(found.modules[i])
    found.modules._modules.clear()
    for index, block in enumerate(kept):
        found.modules._modules[str(index)] = block
        for module in block.modules():
            value = getattr(module, "layer_idx", None)
            if isinstance(value, int) and not isinstance(value, bool):
                setattr(module, "layer_idx", index)  # noqa: B010


def _update_config(config: Any, count: int, removed: tuple[int, ...]) -> dict[str, Any]:
    """Set the layer count and the per-layer fields of a config whose count was `count`."""
    if config is None or getattr(config, "num_hidden_layers", None) != count:
        return {}
    kept = [i for i in range(count) if i not in removed]
    changed: dict[str, Any] = {}
    for key, value in list(vars(config).items()):
        if isinstance(value, list | tuple) and len(value) == count and key != "_name_or_path":
            changed[key] = type(value)(value[i] for i in kept)
    window = getattr(config, "max_window_layers", None)
    if isinstance(window, int) and not isinstance(window, bool):
        changed["max_window_layers"] = sum(1 for i in kept if i < window)
    changed["num_hidden_layers"] = len(kept)
    for key, value in changed.items():
        setattr(config, key, value)
    return changed
