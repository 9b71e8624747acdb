"""``prune_blocks``: rank whole blocks on calibration data and skip the least important.

Skipped blocks are the masks of depth pruning: the model computes what it will once they are
gone (``skipped_blocks`` lists them, ``unskip_blocks`` brings them back), and
``remove_blocks`` deletes them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from prunekit.calibrate import batch_list
from prunekit.core.errors import type_error, value_error
from prunekit.core.example_inputs import ExampleInputs
from prunekit.core.transaction import transaction
from prunekit.structure.depth.block_config import BlockConfig, BlockOptions, block_config
from prunekit.structure.depth.blocks import (
    ADDS,
    BlockList,
    find_blocks,
    is_skipped,
    skip,
    skipped,
    unskip,
)
from prunekit.structure.depth.linear import drop, fit_map, fold_problem, install
from prunekit.structure.depth.scores import block_scores
from prunekit.structure.depth.states import check_inputs, check_tokens
from prunekit.structure.depth.style import style_for

if TYPE_CHECKING:  # Unpack is in typing from Python 3.11 on
    from typing_extensions import Unpack

__all__ = ["BlockConfig", "BlockPruning", "prune_blocks", "skip_blocks", "unskip_blocks"]

_OWNER = "prune_blocks"


@dataclass(frozen=True)
class BlockPruning:
    """What ``prune_blocks`` skipped; ``str()`` says it in a few lines.

    Attributes:
        blocks: the dotted name of the ModuleList of blocks (``'model.layers'``).
        skipped: the indices of the blocks skipped, ascending.
        criterion: the name of the criterion that ranked them (``'angular'``, ...).
        scores: one score per block, or per start of a span for ``'angular'``; the lowest
            were skipped.
        replaced: for each span replaced by a linear map (``replace=``), its first index, the
            index past its end, and the name of the projection the map folds into on removal;
            empty without ``replace``.
    """

    blocks: str
    skipped: tuple[int, ...]
    criterion: str
    scores: tuple[float, ...]
    replaced: tuple[tuple[int, int, str], ...] = ()

    def __str__(self) -> str:
        lines = [f"skipped {len(self.skipped)} blocks of {self.blocks}: {list(self.skipped)} "
                 f"(by {self.criterion})"]  # fmt: skip
        for start, end, linear in self.replaced:
            lines.append(f"blocks {start}..{end - 1} replaced by a linear map on {linear}")
        return "\n".join(lines)


def prune_blocks(
    model: nn.Module,
    calibration: Iterable[object] | None,
    count: int | None = None,
    *,
    config: BlockConfig | None = None,
    **options: Unpack[BlockOptions],
) -> BlockPruning:
    """Skip the `count` least important blocks of `model` (masks first; ``remove_blocks`` then
    deletes them).

    Args:
        model: a model with a ModuleList of blocks (a Hugging Face decoder's
            ``model.layers``, BERT's ``encoder.layer``, any list named by `blocks`).
        calibration: batches the criteria run (tensors, mappings of keyword arguments or
            tuples, as ``prune_model`` takes them).
        count: how many blocks to skip, an int in [1, number of blocks).
        config: every option at once, a ``BlockConfig`` (then neither `count` nor any
            keyword beside it).
        **options: the other fields of ``BlockConfig`` by name: `amount` (instead of
            `count`), `criterion`, `replace`, `blocks`, `loss`, `ridge`; ``n=``, the old name
            of `count` (a FutureWarning).

    Returns:
        A ``BlockPruning``.

    Raises:
        TypeError, ValueError: a bad argument or an unknown keyword, a batch the model cannot
            take, a block whose hidden state cannot be told, a model the linear map cannot be
            folded into. The model is then exactly as it was.
    """
    if not isinstance(model, nn.Module):
        raise type_error(f"{_OWNER}: model={model!r} is no torch.nn.Module")
    settings = block_config(count, config, options)
    found = find_blocks(model, settings.blocks, _OWNER)
    number = _count(found, settings.count, settings.amount)
    batches, style = _calibration(model, found, calibration, settings)
    scores = block_scores(model, found, batches, settings.criterion, number, settings.loss,
                          _OWNER, style)  # fmt: skip
    fit = settings.fit
    chosen = _choose(scores, number, settings.name, first=0 if fit is None else 1)
    with transaction(model):
        replaced = _apply(model, found, chosen, batches, fit, style)
    return BlockPruning(found.name, chosen, settings.name, tuple(scores), replaced)


def _calibration(
    model: nn.Module, found: BlockList, calibration: Iterable[object] | None, settings: BlockConfig
) -> tuple[list[Any], str]:
    """The calibration batches, checked, and the residual style of the blocks' parent."""
    if calibration is None:
        raise value_error(
            f"{_OWNER}: calibration=None, but criterion={settings.name!r} ranks the blocks of "
            f"{found.name} on data; expected an iterable of batches"
        )
    batches = batch_list(calibration, _OWNER)
    check_tokens(batches, _OWNER, model)
    already = [i for i, block in enumerate(found.modules) if is_skipped(block)]
    if already:
        raise value_error(
            f"{_OWNER}: blocks {already} of {found.name} are skipped already; expected "
            "remove_blocks(model) (or unskip_blocks) before pruning again"
        )
    style = style_for(model, found, batches[0], _OWNER, "calibration batch 0")
    if settings.fit is not None and style == ADDS:
        raise value_error(
            f"{_OWNER}: replace='linear' folds a map into blocks that return the residual "
            f"stream, but the parent of {found.name} adds each block's output to the hidden "
            "state (h = h + block(h)); expected replace=False for this model"
        )
    return batches, style


def skip_blocks(model: nn.Module, indices: Iterable[int], *, blocks: str | None = None,
                example_inputs: ExampleInputs | None = None) -> None:  # fmt: skip
    """Skip the given blocks by hand, as ``prune_blocks`` would: each contributes nothing
    (it gives back its input where the parent takes its output as the hidden state, zeros
    where the parent adds its output to the hidden state).

    Args:
        model: the model.
        indices: positions in the ModuleList of blocks; ones skipped already stay so.
        blocks: the name of the ModuleList; None finds it.
        example_inputs: inputs the model's forward takes (a tensor, a mapping of keyword
            arguments or a tuple), on which the parent's residual style is found and which
            ``remove_blocks`` checks its result on; None: the style of blocks skipped
            already, or that of Hugging Face's layers (they return the residual stream).

    Raises:
        TypeError: `model` is no ``nn.Module``, `indices` no iterable.
        ValueError: an index out of range or repeated, every block skipped, one block
            object at several positions, or a residual style that cannot be told (no
            example inputs for a block list of another library, a parent that does more
            between its blocks). The model is then unchanged.
    """
    if not isinstance(model, nn.Module):
        raise type_error(f"skip_blocks: model={model!r} is no torch.nn.Module")
    found = find_blocks(model, blocks, "skip_blocks")
    if not isinstance(indices, Iterable) or isinstance(indices, str | bytes):
        raise type_error(
            f"skip_blocks: invalid indices={indices!r} of type {type(indices).__name__}; "
            f"expected an iterable of ints in [0, {len(found)}), such as [{len(found) - 1}]"
        )
    wanted = list(indices)
    bad = [i for i in wanted if isinstance(i, bool) or not isinstance(i, int)
           or not 0 <= i < len(found)]  # fmt: skip
    if bad or len(set(wanted)) != len(wanted) or not wanted:
        raise value_error(
            f"skip_blocks: invalid indices={wanted!r} for {found.name}; expected distinct "
            f"ints in [0, {len(found)})"
        )
    skipped = {i for i, b in enumerate(found.modules) if is_skipped(b)} | set(wanted)
    if len(skipped) == len(found):
        raise value_error(
            f"skip_blocks: indices={wanted!r} would skip every block of {found.name}; "
            "expected at least one kept"
        )
    check_inputs(example_inputs, "skip_blocks")
    style = style_for(model, found, example_inputs, "skip_blocks")
    inputs = example_inputs if example_inputs is not None else _recorded(found)
    for i in wanted:
        if not is_skipped(found.modules[i]):
            skip(found.modules[i], style, inputs)


def _recorded(found: BlockList) -> Any:
    """The example inputs recorded with a block skipped already (None: none)."""
    held = [skipped(block) for block in found.modules]
    return next((h.inputs for h in held if h is not None and h.inputs is not None), None)


def unskip_blocks(model: nn.Module) -> None:
    """Bring back every skipped block of `model` and drop the maps fitted to replace them
    (blocks removed already stay removed).

    Args:
        model: the model whose blocks ``prune_blocks`` or ``skip_blocks`` skipped.

    Raises:
        TypeError: `model` is no ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise type_error(f"unskip_blocks: model={model!r} is no torch.nn.Module")
    for module in model.modules():
        unskip(module)
        drop(module)


def _count(found: BlockList, n: Any, amount: Any) -> int:
    total = len(found)
    if (n is None) == (amount is None):
        raise value_error(
            f"{_OWNER}: count={n!r}, amount={amount!r}; expected exactly one of them: count "
            f"blocks of {found.name} ({total}) or their share"
        )
    if amount is not None:
        if isinstance(amount, bool) or not isinstance(amount, float) or not 0 < amount < 1:
            raise value_error(
                f"{_OWNER}: invalid amount={amount!r}; expected a float in (0, 1): the share "
                f"of the {total} blocks of {found.name} to skip"
            )
        n = round(amount * total)
        if not 1 <= n < total:
            raise value_error(
                f"{_OWNER}: amount={amount!r} of the {total} blocks of {found.name} rounds to "
                f"{n}; expected a share that leaves between 1 and {total - 1} blocks skipped"
            )
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n < total:
        raise value_error(
            f"{_OWNER}: invalid count={n!r}; expected an int in [1, {total}): {found.name} has "
            f"{total} blocks and keeps at least one"
        )
    return n


def _choose(scores: list[float], n: int, criterion: str, first: int) -> tuple[int, ...]:
    """The blocks to skip: the lowest-scored span for 'angular', else the n lowest."""
    candidates = range(first, len(scores))
    if criterion == "angular":
        start = min(candidates, key=lambda i: (scores[i], i))
        return tuple(range(start, start + n))
    ranked = sorted(candidates, key=lambda i: (scores[i], i))
    return tuple(sorted(ranked[:n]))


def _spans(chosen: tuple[int, ...]) -> list[tuple[int, int]]:
    """Runs of consecutive indices as [start, end) pairs."""
    spans: list[tuple[int, int]] = []
    for i in chosen:
        if spans and spans[-1][1] == i:
            spans[-1] = (spans[-1][0], i + 1)
        else:
            spans.append((i, i + 1))
    return spans


def _apply(model: nn.Module, found: BlockList, chosen: tuple[int, ...], batches: list[Any],
           ridge: float | None, style: str) -> tuple[tuple[int, int, str], ...]:  # fmt: skip
    """Skip the chosen blocks; with a ridge, fit and install each span's map first, span
    by span, each on the model with the spans before it replaced."""
    replaced = []
    names = {id(m): n for n, m in model.named_modules()}
    for start, end in _spans(chosen):
        if ridge is not None:
            linear, fitted = fit_map(model, found, start, end, batches, ridge, _OWNER)
            problem = fold_problem(linear, names[id(linear)])
            if problem is not None:
                raise value_error(
                    f"{_OWNER}: replace='linear' cannot fold a map into {names[id(linear)]}: "
                    f"{problem}; expected prunekit.remove on it first, or replace=False"
                )
            install(linear, fitted)
            replaced.append((start, end, names[id(linear)]))
        for i in range(start, end):
            skip(found.modules[i], style, batches[0])
    return tuple(replaced)
