"""``ChannelConfig``: every option of ``prune_channels``, checked once when it is made.

The stages read it and check nothing of it again; only what needs the model (the modules
`exclude` names, the kinds of groups the model has, the experts a router must keep) is
checked by the stage that meets the model.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypedDict

from torch import Tensor, nn

from prunekit.calibrate import batch_list
from prunekit.core.errors import type_error, value_error
from prunekit.core.example_inputs import rowless, token_mask
from prunekit.structure.budget import Budget
from prunekit.structure.compensation.damping import ROWS, check_damping
from prunekit.structure.graph.graph import ChannelGroup, check_gqa
from prunekit.structure.scoring.criteria import (
    GroupCriterion,
    Loss,
    criterion_batches,
    group_criterion,
)
from prunekit.whole.registry import check_scope
from prunekit.whole.vocabulary import renamed

DAMPING: float | str = ROWS
"""What `damping` is where not given: 'rows', from each layer's calibration rows per input
feature (``prunekit.structure.compensation.damping.by_rows``: 0.3 with a few rows per
feature, down to 0.01 with many; 0.01 for a convolution read as patches). 'auto' (the
held-out choice per layer) did not lift the worst text domain in
``benchmarks/domains_llm.py`` (docs/benchmarks.md)."""

Criterion = str | GroupCriterion | Callable[[ChannelGroup], Tensor]
Excluded = Iterable[nn.Module | str]

OWNER = "prune_channels"

_WHAT = {
    "channels": ("amount", "channels of each group"),
    "heads": ("heads", "heads of each attention module"),
    "hidden": ("hidden", "channels of the hidden width"),
    "experts": ("experts", "routed experts of each mixture-of-experts block"),
}


@dataclass(frozen=True, eq=False)
class ChannelConfig:
    """Every option of ``prune_channels``, checked when made: ``prune_channels(model,
    example_inputs, config=ChannelConfig(...))`` masks as the same keywords do;
    ``dataclasses.replace`` makes a changed copy, checked again.

    Args:
        amount: the share of the units of every group of kind 'channels' (conv and linear
            outputs, MLP widths) to mask, a float in [0, 1). `scope='layer'`: each group
            loses round(amount x its units). Units already masked score 0, so pruning again
            to the same amount changes nothing.
        criterion: how units rank (lowest go first): 'l1', 'l2' (the default), 'bn_scale',
            'taylor', 'activation', 'obs' and 'fluctuation' (these two rank by the error
            that removal leaves), 'frequency' and 'reap' (routed experts), a
            ``GroupCriterion`` or a callable(group) -> one score per unit. Under a budget
            or scope='global' the scores must be >= 0 (one above -1e-9 x its group's
            largest |score| counts as 0); a lower one is refused by group and value.
        scope: 'layer', or 'global': the units of all groups of a kind are ranked together
            (scores divided by their group's mean) and that share of all of them goes
            (heads with key/value groups are always counted per module); where widths keep
            a multiple of a step (`round_to`), groups lose whole steps, ranked by their
            units' mean, and at most that share goes, as near it as the steps allow.
        exclude: modules, or their names (globs allowed; a block stands for its layers),
            whose output channels stay (those of a norm or a depthwise conv are its input
            channels too); their input channels still follow their producers. Kept as a
            tuple; one str is one glob.
        round_to: channel and hidden groups keep a multiple of it (an int >= 1); None: of
            what the model's own kernels need where they constrain a width (the widths a
            mixture-of-experts block's fused experts span: multiples of 16 bytes, 4 float32
            channels, which grouped_mm needs), else of 1. A group keeps at least one unit
            (one query head per key/value group).
        heads: the share of the heads of each attention module (kind 'heads') to mask.
        hidden: the share of the widths that LayerNorm/RMSNorm normalize over (kind
            'hidden': the embedding width through every residual). The norms of a masked
            hidden width then normalize over its kept channels, so the masked model computes
            what ``compact`` makes of it; a hidden width that reaches the model's output
            makes that output narrower once compacted.
        experts: the share of the routed experts of each mixture-of-experts block (kind
            'experts'; shared experts are no such unit): a masked expert's router logit is
            -inf while masked, so the masked model routes as the compacted one will.
        gqa: the head unit of an attention with grouped-query heads, as in
            ``channel_groups``: 'query' or 'group'.
        calibration: batches for the criteria that learn from data ('activation', 'obs',
            'fluctuation', 'frequency', 'reap'; 'taylor' with `loss`) and for `compensate`,
            as prune_model takes them; kept as a tuple.
        loss: ``loss(output, batch)`` for criterion 'taylor' (default ``output.loss``).
        budget: one target for the whole model instead of `amount`, `heads`, `hidden` and
            `experts` (a ``Budget``: a share of the parameters, MACs, measured latency or
            units), met by removing the units of lowest score for their cost across all
            groups of its kinds (see ``prunekit.structure.budget``); ``prune_channels`` then
            returns a ``BudgetReport``, the same list with what each group kept.
        compensate: True: the layers that read removed channels or heads get the
            least-squares update of their kept input columns (and bias) that keeps their
            output on the `calibration` batches (needed then), taken in forward order on the
            model as masked so far (``prunekit.structure.compensation.compensate``);
            'reference': those layers and every Linear or convolution that runs after the
            first of them (but one whose weight another module holds too: a head tied to
            the embedding) are refitted towards the outputs they had in the model as it was
            before the call, from their inputs in the model as pruned so far
            (``prunekit.structure.compensation.refit``; it holds a copy of the model while
            it runs, and runs the model up to each layer for each batch: meant for CNNs);
            False (the default): neither.
        ignore: the old name of `exclude` (warns).
        damping: with `compensate=True` only: the damping of its least-squares solve, a
            number > 0 relative to the median diagonal of the input's second moment; 'rows'
            (None: ``DAMPING``): for each layer, 0.6 x its input features / the calibration
            rows (tokens) measured, between 0.01 and 0.3, so that a few rows per feature are
            damped strongly and many lightly (a convolution read as patches: 0.01); or
            'auto': for each layer, the
            damping of a log-scale grid
            whose update, fitted on alternate calibration batches, best keeps the layer's
            output on the others (both ways round), then fitted on all of them; a layer
            where no damping beats leaving it is left, with a warning
            (``prunekit.structure.compensation.damping``).
        token_weights: with `compensate=True` only: how its fit weighs the calibration
            rows (tokens) of each layer's input. 'energy' (the default): each by its
            squared error, so that a few rows of outsized activations (attention sinks)
            can hold most of what the fit sees; 'equal': each by its error relative to its
            own size (the median row's energy over its own, at most 100x), so that they do
            not decide it. 'equal' keeps a criterion that removes the channels such rows
            use ('l1', 'l2') from being undone by compensation at the other tokens'
            expense; with 'activation' it is about even.

    Attributes:
        excluded: the modules and globs excluded, from `exclude` or `ignore`.
        excluded_as: which of the two named them ('exclude' or 'ignore'), for the messages.
        level: the damping compensation uses (`damping`, or ``DAMPING``).
        scoring: the batches the criterion is prepared on (None: none).

    Raises:
        ValueError: a share outside [0, 1), an unknown scope, gqa, criterion, compensate or
            token_weights, a budget beside shares or scope='global', compensation without
            calibration, damping or token_weights without compensate=True, calibration or
            loss where the criterion takes none (or none where it needs them), both
            `exclude` and `ignore`.
        TypeError: a budget, criterion, compensate, calibration, damping or token_weights
            of the wrong type.
    """

    amount: float = 0.0
    criterion: Criterion = "l2"
    scope: str = "layer"
    exclude: Excluded = ()
    round_to: int | None = None
    heads: float = 0.0
    hidden: float = 0.0
    experts: float = 0.0
    gqa: str = "query"
    calibration: Iterable[Any] | None = field(default=None, repr=False)
    loss: Loss | None = None
    budget: Budget | None = None
    compensate: bool | str = False
    ignore: Excluded | None = None
    damping: float | str | None = None
    token_weights: str = "energy"
    excluded: tuple[nn.Module | str, ...] = field(init=False, repr=False)
    excluded_as: str = field(init=False, repr=False)
    level: float | str = field(init=False, repr=False)
    scoring: tuple[Any, ...] | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        _check_amounts(self.amounts, self.scope, self.round_to)
        for name in ("amount", "heads", "hidden", "experts"):  # numpy's numbers as Python's
            self._set(name, float(getattr(self, name)))
        if self.round_to is not None:
            self._set("round_to", int(self.round_to))
        if self.budget is not None:
            _check_budget(self.budget, self.amounts, self.scope)
        check_gqa(self.gqa, OWNER)
        batches = _compensation_batches(self.compensate, self.calibration)
        self._set("level", _damping(self.damping, self.compensate))
        _check_token_weights(self.token_weights, self.compensate)
        self._exclusions()
        found = group_criterion(self.criterion)
        given: Iterable[Any] | None = self.calibration
        if batches is not None:  # for the criterion too where it takes them
            wants = isinstance(found, GroupCriterion) and found.calibrated is not False
            given = batches if wants else None
        scoring = criterion_batches(found, self.criterion, given, self.loss)
        if scoring is not None and scoring is not batches:
            _check_rows(scoring, f"criterion={self.criterion!r} has no row to score on")
        if batches is None and scoring is not None:
            batches = scoring
        self._set("calibration", None if batches is None else tuple(batches))
        self._set("scoring", None if scoring is None else tuple(scoring))

    @property
    def amounts(self) -> dict[str, float]:
        """The share of each kind of group: 'channels', 'heads', 'hidden', 'experts'."""
        return {
            "channels": self.amount,
            "heads": self.heads,
            "hidden": self.hidden,
            "experts": self.experts,
        }

    @property
    def batches(self) -> list[Any] | None:
        """The calibration batches compensation runs on (None: no compensation)."""
        if not self.compensate or self.calibration is None:
            return None
        return list(self.calibration)

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)

    def _exclusions(self) -> None:
        given = _listed(self.exclude, "exclude")
        excluded, what = given, "exclude"
        if self.ignore is not None:  # the old name
            old = _listed(self.ignore, "ignore")
            excluded = renamed(OWNER, "exclude", excluded, "ignore", old, bool(excluded))
            what = "ignore"
            self._set("ignore", tuple(old))
        self._set("exclude", tuple(given))
        self._set("excluded", tuple(excluded))
        self._set("excluded_as", what)


class ChannelOptions(TypedDict, total=False):
    """The keywords of ``prune_channels`` beside `amount`: the fields of ``ChannelConfig``."""

    criterion: Criterion
    scope: str
    exclude: Excluded
    round_to: int | None
    heads: float
    hidden: float
    experts: float
    gqa: str
    calibration: Iterable[Any] | None
    loss: Loss | None
    budget: Budget | None
    compensate: bool | str
    ignore: Excluded | None
    damping: float | str | None
    token_weights: str


def _check_amounts(amounts: dict[str, Any], scope: Any, round_to: Any) -> None:
    """Refuse a share or `round_to` out of place (numpy's numbers are taken as Python's;
    `amount` is a fraction only, never an integer that could read as a count)."""
    for kind, value in amounts.items():
        name, what = _WHAT[kind]
        integral = isinstance(value, numbers.Integral)
        number = isinstance(value, numbers.Real) and (name != "amount" or not integral)
        if isinstance(value, bool) or not number or not 0.0 <= value < 1.0:
            raise ValueError(
                f"prune_channels: invalid {name}={value!r}; expected a float in [0, 1): the "
                f"fraction of the {what} to mask"
            )
    check_scope(scope, OWNER)
    if round_to is not None and (
        isinstance(round_to, bool) or not isinstance(round_to, numbers.Integral) or round_to < 1
    ):
        raise ValueError(
            f"prune_channels: invalid round_to={round_to!r}; expected an int >= 1, or None "
            "(what the model's kernels need)"
        )


def _check_budget(budget: Any, amounts: dict[str, Any], scope: str) -> None:
    """`budget` is a Budget and replaces `amount`/`heads`/`hidden`/`experts` and `scope`."""
    if not isinstance(budget, Budget):
        raise type_error(
            f"prune_channels: invalid budget={budget!r}; expected a prunekit.Budget such as "
            "Budget(params=0.2), or None"
        )
    given = {k: v for k, v in amounts.items() if v}
    if given:
        names = {"channels": "amount", "heads": "heads", "hidden": "hidden", "experts": "experts"}
        shown = ", ".join(f"{names[k]}={v!r}" for k, v in given.items())
        raise value_error(
            f"prune_channels: budget={budget!r} chooses the share of every kind itself; got "
            f"{shown} too; expected amount, heads, hidden and experts left at 0 (the kinds go "
            "in Budget(kinds=...))"
        )
    if scope != "layer":
        raise value_error(
            f"prune_channels: budget={budget!r} ranks all groups together already; expected "
            f"scope='layer' (the default), got scope={scope!r}"
        )


def _compensation_batches(compensate: Any, calibration: Any) -> list[Any] | None:
    """The calibration batches as a list when `compensate` (which needs them), else None."""
    if not (isinstance(compensate, bool) or compensate == "reference"):
        raise (ValueError if isinstance(compensate, str) else TypeError)(
            f"prune_channels: invalid compensate={compensate!r}; expected True (update the "
            "layers that read removed units from calibration data), 'reference' (the same, "
            "towards the outputs of the model as it was before the call) or False"
        )
    if not compensate:
        return None
    if calibration is None:
        raise ValueError(
            f"prune_channels: compensate={compensate!r} needs calibration data; expected "
            "calibration= an iterable of batches the model's forward takes"
        )
    batches = batch_list(calibration, OWNER)
    _check_rows(batches, "compensation has no row to fit on")
    return batches


def check_rows(config: ChannelConfig, model: nn.Module) -> None:
    """Refuse, now that the model is known, calibration with nothing to fit or score on
    where a tuple batch's mask says so: its item that `model`'s forward names
    ``attention_mask`` (``core.example_inputs.named``). The Config, made without a model,
    checked the mappings' masks only.

    Args:
        config: the checked options.
        model: the model the batches are given to.

    Raises:
        ValueError: every batch's mask all zero, or a mask not shaped like its batch's
            tokens, naming the batch (as ``ChannelConfig`` does for mappings).
    """
    if config.compensate and config.calibration is not None:
        _check_rows(list(config.calibration), "compensation has no row to fit on", model)
    if config.scoring is not None:
        why = f"criterion={config.criterion!r} has no row to score on"
        _check_rows(list(config.scoring), why, model)


def _check_rows(batches: list[Any], why: str, model: nn.Module | None = None) -> None:
    """Refuse calibration with nothing to fit or score on: every batch empty, or every
    ``attention_mask`` all zero (the update would be fitted on no row, and change nothing;
    a criterion would rank on nothing), or a mask not shaped like its batch's tokens
    (``token_mask``; a tuple's by `model`'s forward's names, where it is known). `why`:
    what has no row."""
    for index, batch in enumerate(batches):
        token_mask(batch, index, "prune_channels", model)
    what = rowless(batches, model)
    if what is not None:
        raise value_error(
            f"prune_channels: every one of the {len(batches)} calibration batches {what}, so "
            f"{why}; expected batches with at least one row (token)"
        )


def _damping(damping: object, compensate: object) -> float | str:
    """The damping compensation uses: `damping` checked, or the default where None."""
    if damping is None:
        return DAMPING
    _only_compensating("damping", damping, compensate, "damps that least-squares update",
                       "no damping")  # fmt: skip
    return check_damping(damping, OWNER)


def _only_compensating(name: str, value: object, compensate: object, what: str, or_: str) -> None:
    """Refuse `name`=`value`, an option of compensate=True's least-squares update (it `what`),
    beside any other `compensate`; `or_`: what to pass instead of it."""
    if compensate is not True:
        raise value_error(
            f"prune_channels: {name}={value!r} needs compensate=True (it {what}), not "
            f"compensate={compensate!r}; expected compensate=True or {or_}"
        )


TOKEN_WEIGHTS = ("energy", "equal")


def _check_token_weights(weights: object, compensate: object) -> None:
    """`token_weights` is one of ``TOKEN_WEIGHTS``, and other than the default only where
    compensate=True fits with it."""
    if not isinstance(weights, str) or weights not in TOKEN_WEIGHTS:
        raise (value_error if isinstance(weights, str) else type_error)(
            f"prune_channels: invalid token_weights={weights!r}; expected one of "
            f"{TOKEN_WEIGHTS}: how compensate=True's fit weighs each calibration token"
        )
    if weights != "energy":
        what = "weighs that least-squares fit's tokens"
        _only_compensating("token_weights", weights, compensate, what, "token_weights='energy'")


def _listed(names: Excluded | str, what: str) -> list[nn.Module | str]:
    """Modules or globs as a list; a str is one glob. `what`: the option's name."""
    listed: list[Any] | None = [names] if isinstance(names, (str, nn.Module)) else None
    if listed is None and isinstance(names, Iterable) and not isinstance(names, Tensor):
        listed = list(names)
    if listed is None or not all(isinstance(n, (str, nn.Module)) for n in listed):
        raise type_error(
            f"{OWNER}: invalid {what}={names!r}; expected modules of the model or their "
            "names (globs allowed): a str, a module, or an iterable of them"
        )
    return listed
