"""``BlockConfig``: the options of ``prune_blocks``, checked once when made.

What needs the model (how many blocks its list has, for `count` and `amount`) is checked by
``prune_blocks`` when it meets the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypedDict

from prunekit.core.errors import type_error, value_error
from prunekit.structure.depth.scores import CRITERIA, BlockCriterion, Loss
from prunekit.whole.vocabulary import renamed

__all__ = ["BlockConfig", "BlockOptions", "block_config"]

OWNER = "prune_blocks"


@dataclass(frozen=True)
class BlockConfig:
    """Every option of ``prune_blocks``, checked when made: ``prune_blocks(model,
    calibration, config=BlockConfig(...))`` skips as the same keywords do;
    ``dataclasses.replace`` makes a changed copy, checked again.

    Args:
        count: how many blocks to skip, an int in [1, number of blocks).
        amount: instead of `count`, the share of the blocks, a float in (0, 1); rounded.
        criterion: 'angular' (the span of `count` consecutive blocks whose input and output
            hidden states are closest in angle), 'influence' (the `count` blocks of lowest
            ``1 - cos``, ShortGPT), 'loss' (the `count` blocks whose skipping alone raises
            the loss least; `loss(output, batch)`, default ``output.loss``), or a callable
            ``(h_in, h_out) -> scalar`` per block and batch, summed (lowest skipped).
        replace: False, or 'linear': each run of consecutive skipped blocks is replaced by a
            least-squares linear map folded into the last projection of the block before it
            (``prunekit.structure.depth.linear``; pre-norm blocks only, and the first block
            is then never skipped).
        blocks: the name of the ModuleList; None finds it.
        loss: for criterion='loss'.
        ridge: the damping of the linear fit, relative to the mean of ``diag(M^T M)``.

    Raises:
        ValueError: an unknown criterion or replace, a ridge that is no finite number >= 0.
        TypeError: a criterion that is neither a name nor a callable.
    """

    count: int | None = None
    amount: float | None = None
    criterion: str | BlockCriterion = "angular"
    replace: bool | str = False
    blocks: str | None = None
    loss: Loss | None = None
    ridge: float = 1e-4

    def __post_init__(self) -> None:
        criterion_name(self.criterion)
        linear(self.replace)
        ridge = self.ridge
        if (
            not isinstance(ridge, float | int)
            or isinstance(ridge, bool)
            or not 0 <= ridge < math.inf
        ):
            raise value_error(f"{OWNER}: invalid ridge={ridge!r}; expected a finite float >= 0")

    @property
    def name(self) -> str:
        """The criterion's name (a callable's ``__name__``)."""
        return criterion_name(self.criterion)

    @property
    def fit(self) -> float | None:
        """The ridge of the linear fit with ``replace='linear'``, else None."""
        return float(self.ridge) if linear(self.replace) else None


class BlockOptions(TypedDict, total=False):
    """The keywords of ``prune_blocks`` beside `count`: the fields of ``BlockConfig``, and
    ``n``, the old name of `count` (a FutureWarning)."""

    amount: float | None
    criterion: str | BlockCriterion
    replace: bool | str
    blocks: str | None
    loss: Loss | None
    ridge: float
    n: int | None


def block_config(count: int | None, config: object, options: BlockOptions) -> BlockConfig:
    """The config of a call: `config` alone, or one made of `count` and `options` (``n=``
    renamed to `count`, with a FutureWarning: ``n`` is a norm order elsewhere).

    Args:
        count: the `count` of the call.
        config: the `config` of the call, or None.
        options: the other keywords of the call.

    Returns:
        The checked config.

    Raises:
        TypeError: an unknown keyword, a `config` that is no BlockConfig.
        ValueError: both `count` and `n`, or a `config` beside `count` or keywords.
    """
    unknown = sorted(set(options) - set(BlockOptions.__optional_keys__))
    if unknown:
        raise type_error(
            f"{OWNER}: unexpected keyword argument {unknown[0]!r}; expected count, amount, "
            "criterion, replace, blocks, loss or ridge"
        )
    if config is None:
        old = options.get("n")
        count = renamed(OWNER, "count", count, "n", old, count is not None)
        return BlockConfig(
            count,
            amount=options.get("amount"),
            criterion=options.get("criterion", "angular"),
            replace=options.get("replace", False),
            blocks=options.get("blocks"),
            loss=options.get("loss"),
            ridge=options.get("ridge", 1e-4),
        )
    if not isinstance(config, BlockConfig):
        raise type_error(f"{OWNER}: invalid config={config!r}; expected a BlockConfig, or None")
    if count is not None or options:
        given = ([f"count={count!r}"] if count is not None else []) + [f"{k}=" for k in options]
        raise value_error(
            f"{OWNER}: config= holds every option, but {', '.join(given)} came beside it; "
            "expected config=dataclasses.replace(config, ...) or the keywords alone"
        )
    return config


def criterion_name(criterion: object) -> str:
    """The name of a block criterion (a callable's ``__name__``), checked.

    Args:
        criterion: a name of ``CRITERIA`` or a callable.

    Returns:
        Its name.

    Raises:
        ValueError: an unknown name.
        TypeError: neither a name nor a callable.
    """
    if isinstance(criterion, str):
        if criterion not in CRITERIA:
            raise value_error(
                f"{OWNER}: unknown criterion={criterion!r}; expected one of {list(CRITERIA)} "
                "or a callable (h_in, h_out) -> scalar"
            )
        return criterion
    if callable(criterion):
        return getattr(criterion, "__name__", type(criterion).__name__)
    raise type_error(
        f"{OWNER}: invalid criterion={criterion!r}; expected one of {list(CRITERIA)} or a "
        "callable (h_in, h_out) -> scalar"
    )


def linear(replace: object) -> bool:
    """Whether `replace` asks for linear maps, checked.

    Args:
        replace: False, None or 'linear'.

    Returns:
        True for 'linear'.

    Raises:
        ValueError: anything else.
    """
    if replace is False or replace is None:
        return False
    if replace == "linear":
        return True
    raise value_error(f"{OWNER}: invalid replace={replace!r}; expected False or 'linear'")
