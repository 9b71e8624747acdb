"""Config: the checked arguments of one whole-model pruning, frozen.

Every entry point that prunes a whole model builds one (prune_model, the one-shot engine);
the functions below it take the Config instead of a long list of loose arguments, and may
trust what it holds: a known method, a scope, an amount in range, globs as tuples.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict

from prunekit.core.amount import (
    Amount,
    validate_dim_type,
    validate_norm_order,
    validate_pruning_amount_init,
)
from prunekit.core.checks import check_number
from prunekit.core.errors import type_error, value_error
from prunekit.criteria import SparseGPT
from prunekit.patterns import NM, Pattern, PerRow, Unstructured
from prunekit.whole.registry import (
    METHODS,
    Method,
    check_scope,
    check_settings,
    default_pattern,
    default_sequential,
)
from prunekit.whole.targets import ALL, globs

__all__ = ["PATTERNS", "Config", "ModelOptions", "parse_pattern"]

PATTERNS = "'unstructured', 'row', or 'N:M' such as '2:4' and '4:8'"


def parse_pattern(pattern: Any, owner: str = "prune_model") -> Pattern:
    """A Pattern from its name ('unstructured', 'row', '2:4', ...) or as given."""
    if isinstance(pattern, Pattern):
        return pattern
    if pattern == "unstructured":
        return Unstructured()
    if pattern == "row":
        return PerRow()
    found = re.fullmatch(r"(\d+):(\d+)", pattern) if isinstance(pattern, str) else None
    if found is None:
        raise value_error(f"{owner}: invalid pattern={pattern!r}; expected {PATTERNS}")
    return NM(int(found[1]), int(found[2]))


@dataclass(frozen=True)
class Config:
    """What to prune in a whole model, and how; checked when made: ``prune_model(model,
    config=Config(...))`` prunes as the same keywords do (``dataclasses.replace`` makes a
    changed copy, checked again).

    Args:
        method: a method of the registry (``prunekit.whole.registry.METHODS``): ``'l1'``
            (smallest magnitudes), ``'random'``, ``'ln'`` (whole output channels, dim 0, by
            their L2 norm; layer scope only), or, from calibration batches: ``'wanda'`` (|W|
            x the L2 norm of each input feature), ``'sparsegpt'`` (OBS, with updates of the
            weights left, written into ``<name>_orig``), ``'taylor'`` (|W x grad| summed
            over the batches of a loss).
        amount: the fraction to prune, in [0, 1], of each tensor (scope ``'layer'``) or of
            all of them together (``'global'``); for ``'N:M'`` it must be (M-N)/M. A count
            of entries (or channels, for ``'ln'``) where the entry point takes one.
        pattern: ``'unstructured'``, ``'row'`` (the same share of each output row),
            ``'N:M'`` (``'2:4'``, ``'4:8'``: keep N of every M along the input dim) or a
            ``prunekit.Pattern``. None (kept as None): the method's own
            (``registry.default_pattern``, read as `chosen_pattern`): ``'row'`` for
            ``'wanda'`` in scope ``'layer'`` (as Wanda's paper ranks; whole-layer ranking is
            clearly worse on LLMs), ``'unstructured'`` otherwise.
        scope: ``'layer'`` prunes `amount` of each tensor, ``'global'`` `amount` of all the
            selected tensors ranked together (unstructured only).
        include: globs of parameter names, as the CLI's. The default ``('*',)`` takes every
            floating-point parameter of two or more dims (weights, not biases or norms), and
            for the calibrated methods every Linear weight but the output head
            (``get_output_embeddings()``, or a Linear sharing an embedding's weight); any
            other `include` selects by name, any number of dims. Kept as a tuple; one str is
            one glob.
        exclude: globs of parameter names left alone, kept as a tuple. A parameter of
            several names (tied, or a module shared under several paths) is left out under
            all of them or none: excluding some of its names is refused.
        sequential: True calibrates block by block, each on the outputs of the pruned blocks
            before it (one block's statistics in memory). ``'layers'``: in each block too,
            its layers group by group in the order the block calls them (query, key and
            value; the attention's output; gate and up; down), each on the outputs of the
            groups pruned before it, as SparseGPT's paper prunes (each layer runs about once
            a batch, where True runs each block twice; as True for a model without blocks).
            False: one pass of the whole model. None (kept as None): the method's own
            (``registry.default_sequential``, read as `chosen_sequential`): ``'layers'`` for
            ``'sparsegpt'`` unless over `ranks` (the better scores on SmolLM2-135M and
            all-MiniLM-L6-v2, see benchmarks/vs_llmcompressor.py), False for ``'wanda'``
            with `scope` ``'global'``, True otherwise;
            ``prune_model(config=...)`` defaults it for its call's ranks (with or without
            `process_group`). As `pattern`, a None stays None through
            ``dataclasses.replace``: a copy with another method or scope takes that one's
            defaults, as a Config made with the same fields does.
        progress: a bar on stderr for calibrated runs; None: when stderr is a terminal.
            Given (as `sequential`) with a method that would ignore it, the Config is made
            (``dataclasses.replace`` may yet change its method) but the entry point it is
            given to refuses it, as it refuses the keyword.
        damp: SparseGPT's dampening of the Hessian's diagonal (a share of its mean), a
            finite float >= 0; None: SparseGPT's own (0.1). Method ``'sparsegpt'`` only:
            any other method refuses it rather than ignore it.
        blocksize: SparseGPT's columns updated at a time, an int >= 1; None: SparseGPT's
            own (128). Method ``'sparsegpt'`` only, as `damp`.
        n: 'ln' only: the norm order its channels are ranked by (None: 2).
        dim: 'ln' only: the axis of its channels (None: 0, the output channels).
        owner: the entry point the errors name ('Config' when made by hand; the entry
            point that takes it names itself).
        ranks: whether the pruning runs over data-parallel ranks (for the default of
            `sequential`).

    Raises:
        TypeError: an argument of the wrong type, naming `owner`, the argument and the value.
        ValueError: an argument out of range, naming `owner`, the argument and the value;
            `damp` or `blocksize` given with a method other than ``'sparsegpt'``; scope
            ``'global'`` with a pattern other than unstructured, with ``'sparsegpt'``, or
            with ``'wanda'`` calibrated sequentially (its default: give sequential=False).
    """

    method: str = "l1"
    amount: float = 0.0
    pattern: str | Pattern | None = None
    scope: str = "layer"
    include: tuple[str, ...] = ALL
    exclude: tuple[str, ...] = ()
    sequential: bool | str | None = None
    progress: bool | None = None
    damp: float | None = None
    blocksize: int | None = None
    n: float | str | None = None
    dim: int | None = None
    owner: str = field(default="Config", compare=False)
    ranks: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        owner = self.owner
        validate_pruning_amount_init(self.amount, owner=owner)
        if not isinstance(self.method, str) or self.method not in METHODS:
            raise value_error(
                f"{owner}: invalid method={self.method!r}; expected one of {', '.join(METHODS)}"
            )
        check_scope(self.scope, owner)
        self._check_norm()
        # SparseGPT's settings, checked when made as the rest (not at the first layer), and
        # refused for the methods that would ignore them
        check_settings(self.method, {"damp": self.damp, "blocksize": self.blocksize}, owner)
        if self.damp is not None:
            check_number(self.damp, "damp", owner, "a finite float >= 0",
                         lambda v: 0 <= v < math.inf)  # fmt: skip
        if self.blocksize is not None:
            check_number(self.blocksize, "blocksize", owner, "an int >= 1", lambda v: v >= 1,
                         integral=True)  # fmt: skip
        # Globs given as one str are one glob: kept as tuples.
        object.__setattr__(self, "include", globs(self.include, "include", owner))
        object.__setattr__(self, "exclude", globs(self.exclude, "exclude", owner))
        # `pattern` and `sequential` stay None when not given (``dataclasses.replace`` copies
        # them as they are, so a copy's defaults follow its method); read resolved as
        # `chosen_pattern` and `chosen_sequential`; `sequential` checked before the checks
        # below read it (a 1 or 'yes' is invalid, not sequential calibration)
        layered = isinstance(self.sequential, str) and self.sequential == "layers"
        if self.sequential is not None and not isinstance(self.sequential, bool) and not layered:
            make = type_error if not isinstance(self.sequential, str) else value_error
            raise make(
                f"{owner}: invalid sequential={self.sequential!r}; expected True (block by "
                "block), False (one pass) or 'layers' (block by block, and in each block "
                "layer by layer)"
            )
        chosen = parse_pattern(self.chosen_pattern, owner)
        if isinstance(chosen, NM):  # its amount is the pattern's own
            chosen.check((chosen.m,) * 2, Amount(self.amount, owner))
        ranked = type(chosen) is Unstructured and self.method != "sparsegpt"
        if self.scope == "global" and not ranked:
            raise value_error(
                f"{owner}: scope='global' ranks entries of all layers together, which only "
                f"the unstructured pattern with l1, random, wanda or taylor does; got "
                f"method={self.method!r}, pattern={self.chosen_pattern!r} (expected "
                "scope='layer')"
            )
        if self.scope == "global" and self.method == "wanda" and self.chosen_sequential:
            raise value_error(
                f"{owner}: scope='global' needs every layer's statistics before any is "
                f"pruned, which sequential calibration does not give; got "
                f"sequential={self.sequential!r}, expected sequential=False (the default "
                "for 'wanda' with scope='global')"
            )
        if self.progress is not None and not isinstance(self.progress, bool):
            raise type_error(
                f"{owner}: invalid progress={self.progress!r}; expected True, False or None "
                "(a bar when stderr is a terminal)"
            )

    def _check_norm(self) -> None:
        """Refuse `n` and `dim` but for 'ln', and a bad norm order or axis."""
        if self.n is None and self.dim is None:
            return
        if self.method != "ln":
            raise value_error(
                f"{self.owner}: n and dim apply to method 'ln' only, not {self.method!r}"
            )
        if self.n is not None:
            validate_norm_order(self.n, owner=self.owner)
        if self.dim is not None:
            validate_dim_type(self.dim, owner=self.owner)

    def over_ranks(self, ranks: bool, owner: str) -> Config:
        """This Config for the entry point `owner`, run over data-parallel ranks or not
        (`ranks`): `sequential`, if not given, defaulted for `ranks` (SparseGPT's 'layers'
        alone, True over ranks); as given otherwise.

        Args:
            ranks: whether the call runs over a process group.
            owner: the entry point the errors name.

        Returns:
            The Config the call runs with.
        """
        return replace(self, owner=owner, ranks=ranks)

    @property
    def chosen_pattern(self) -> str | Pattern:
        """`pattern`, or the method's own where None (``registry.default_pattern``)."""
        if self.pattern is None:
            return default_pattern(self.method, self.scope)
        return self.pattern

    @property
    def chosen_sequential(self) -> bool | str:
        """`sequential`, or the method's own for `ranks` where None
        (``registry.default_sequential``)."""
        if self.sequential is None:
            return default_sequential(self.method, self.ranks, self.scope)
        return self.sequential

    @property
    def norm(self) -> float | str:
        """The norm order of 'ln' (`n`, default 2)."""
        return 2 if self.n is None else self.n

    @property
    def axis(self) -> int:
        """The axis of the channels of 'ln' (`dim`, default 0)."""
        return 0 if self.dim is None else self.dim

    @property
    def sparsegpt(self) -> SparseGPT:
        """SparseGPT's settings: `damp` and `blocksize`, SparseGPT's own where None."""
        own = SparseGPT()
        return SparseGPT(
            own.damp if self.damp is None else self.damp,
            own.blocksize if self.blocksize is None else self.blocksize,
        )

    @property
    def entry(self) -> Method:
        """The registry's entry for `method`."""
        return METHODS[self.method]

    @property
    def plain(self) -> bool:
        """Whether the pattern is whole tensors' entries: 'unstructured', by its name or as
        the Pattern ``Unstructured()`` (a subclass may rank otherwise: not plain)."""
        pattern = self.chosen_pattern
        if type(pattern) is Unstructured:
            return True
        return isinstance(pattern, str) and pattern == "unstructured"

    def compared(self) -> dict[str, Any]:
        """The arguments every rank of a process group must give alike."""
        return {
            "method": self.method,
            "amount": self.amount,
            "pattern": self.chosen_pattern,
            "scope": self.scope,
            "include": self.include,
            "exclude": self.exclude,
            "sequential": self.chosen_sequential,
            # SparseGPT's (its own where None): each rank updates its copy with them
            "damp": self.sparsegpt.damp,
            "blocksize": self.sparsegpt.blocksize,
        }


class ModelOptions(TypedDict, total=False):
    """The keywords of ``prune_model`` that are fields of ``Config`` (see there)."""

    method: str
    pattern: str | Pattern | None
    scope: str
    include: Sequence[str] | str
    exclude: Sequence[str] | str
    sequential: bool | str | None
    progress: bool | None
