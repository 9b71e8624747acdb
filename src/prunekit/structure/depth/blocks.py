"""The sequence of blocks of a model, their hidden states, and the skipped (masked) state.

A block is skipped by a forward hook that makes it contribute nothing: it gives back its
input hidden state in place of its output where the parent takes the output as the hidden
state (``h = block(h)``, Hugging Face's layers), zeros where the parent adds the output to
the hidden state (``h = h + block(h)``); the model then computes what it will compute once
the block is removed. Which of the two a parent does is found by running it
(``depth.style``), or known for Hugging Face's layers. The block
still runs (its attention still fills its place in a key/value cache, which keeps the cache's
length right for the blocks that follow), so a skipped model is no faster; removal is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from prunekit.calibrate import block_list
from prunekit.core.errors import type_error, value_error
from prunekit.core.unsaved import register_unsaved

__all__ = [
    "ADDS",
    "REPLACES",
    "BlockList",
    "Skipped",
    "find_blocks",
    "hidden_in",
    "hidden_out",
    "is_skipped",
    "skip",
    "skipped",
    "skipped_blocks",
    "unskip",
    "with_hidden",
]

_SKIP = "_prunekit_skip"  # the hook handle on a skipped block


class BlockList:
    """A model's ModuleList of blocks and its path in the model (``'model.layers'``)."""

    def __init__(self, name: str, modules: nn.ModuleList) -> None:
        self.name = name
        self.modules = modules

    def __len__(self) -> int:
        return len(self.modules)

    def path(self, index: int) -> str:
        return f"{self.name}.{index}" if self.name else str(index)


def find_blocks(model: nn.Module, blocks: str | None, owner: str) -> BlockList:
    """The ModuleList named `blocks`, or (None) the model's ModuleList of two or more
    modules of one class that holds the most modules (``model.layers``, ``encoder.layer``);
    refused where one block object stands at several positions."""
    found = _find(model, blocks, owner)
    positions: dict[int, list[int]] = {}
    for index, block in enumerate(found.modules):
        positions.setdefault(id(block), []).append(index)
    shared = [where for where in positions.values() if len(where) > 1]
    if shared:
        raise value_error(
            f"{owner}: {found.name or 'the ModuleList'} holds one block object at positions "
            f"{shared[0]}: skipping or removing it at one position would change them all; "
            "expected a distinct module at each position (copy.deepcopy the shared block)"
        )
    return found


def _find(model: nn.Module, blocks: str | None, owner: str) -> BlockList:
    if blocks is None:
        found = block_list(model, list(model.modules()))
        if found is None:
            raise value_error(
                f"{owner}: {type(model).__name__} has no ModuleList of two or more blocks of one "
                "class; expected blocks= naming the ModuleList that holds the blocks"
            )
        return BlockList(*found)
    if not isinstance(blocks, str):
        raise type_error(
            f"{owner}: invalid blocks={blocks!r}; expected the name of a ModuleList of the "
            "model (such as 'model.layers') or None to find it"
        )
    try:
        module = model.get_submodule(blocks)
    except AttributeError:
        module = None
    if not isinstance(module, nn.ModuleList) or len(module) < 2:
        lists = [n for n, m in model.named_modules() if isinstance(m, nn.ModuleList)]
        raise value_error(
            f"{owner}: invalid blocks={blocks!r}: no ModuleList of two or more blocks of that "
            f"name in {type(model).__name__}; expected one of {lists}"
        )
    return BlockList(blocks, module)


def hidden_in(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """The hidden state a block was called with: its first positional argument, or
    ``hidden_states=``."""
    found = args[0] if args else kwargs.get("hidden_states")
    return found if isinstance(found, Tensor) else None


def hidden_out(output: Any) -> Tensor | None:
    """The hidden state a block returned: the output, or its first element."""
    found = output[0] if isinstance(output, tuple | list) and output else output
    return found if isinstance(found, Tensor) else None


def with_hidden(output: Any, hidden: Tensor) -> Any:
    """`output` with its hidden state replaced by `hidden` (same structure)."""
    if isinstance(output, Tensor):
        return hidden
    return type(output)([hidden, *output[1:]])


def _identity(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
) -> Any:  # fmt: skip
    return with_hidden(output, _hidden(module, args, kwargs, output))


def _nothing(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
) -> Any:  # fmt: skip
    return with_hidden(output, torch.zeros_like(_hidden(module, args, kwargs, output)))


def _hidden(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
            output: Any) -> Tensor:  # fmt: skip
    hidden = hidden_in(args, kwargs)
    if hidden is None or hidden_out(output) is None:
        raise value_error(
            f"skipped block {type(module).__name__}: cannot tell which argument or output is "
            "the hidden state; expected a tensor as the first argument (or hidden_states=) and "
            "as the output (or its first element)"
        )
    return hidden


REPLACES = "replaces"
"""The parent takes a block's output as the new hidden state (``h = block(h)``): a skipped
block gives back its input."""
ADDS = "adds"
"""The parent adds a block's output to the hidden state (``h = h + block(h)``): a skipped
block gives back zeros."""


@dataclass
class Skipped:
    """How a block is skipped: its hook, the residual style it follows, and example inputs
    of the model (those the style was found on) for ``remove_blocks`` to check with."""

    handle: RemovableHandle
    style: str
    inputs: Any = None


def skip(block: nn.Module, style: str = REPLACES, inputs: Any = None) -> None:
    """Make `block` contribute nothing (a forward hook; its weights stay): it gives back its
    input hidden state where its parent takes the output as the hidden state, zeros where
    its parent adds the output to it."""
    hook = _identity if style == REPLACES else _nothing
    handle: RemovableHandle = block.register_forward_hook(hook, with_kwargs=True)
    setattr(block, _SKIP, Skipped(handle, style, inputs))


def skipped(block: nn.Module) -> Skipped | None:
    found = getattr(block, _SKIP, None)
    return found if isinstance(found, Skipped) else None


def is_skipped(block: nn.Module) -> bool:
    return skipped(block) is not None


register_unsaved("the skipped block", is_skipped, "prunekit.remove_blocks(model)")


def unskip(block: nn.Module) -> None:
    """Undo ``skip``: the block computes again."""
    found = skipped(block)
    if found is not None:
        found.handle.remove()
        delattr(block, _SKIP)


def skipped_blocks(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """The skipped blocks of `model`.

    Args:
        model: any module.

    Returns:
        Each ModuleList that holds skipped blocks, by name, with their indices.

    Raises:
        TypeError: `model` is no ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise type_error(f"skipped_blocks: model={model!r} is no torch.nn.Module")
    found: dict[str, tuple[int, ...]] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList):
            indices = tuple(i for i, block in enumerate(module) if is_skipped(block))
            if indices:
                found[name] = indices
    return found
