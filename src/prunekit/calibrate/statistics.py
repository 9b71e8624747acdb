"""Streaming statistics of the inputs of Linear-like layers, gathered by forward hooks: running
sums updated batch by batch, never a list of activations; layers that read the same input
share one accumulator."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from prunekit.calibrate import layer_matrices
from prunekit.calibrate.reduce import Reduce, agree
from prunekit.core.errors import type_error, value_error
from prunekit.core.example_inputs import token_mask

T = TypeVar("T", bound=tuple[Any, ...])

_PANEL = 256


"""Columns of X^T X one matrix product adds (`_Accumulator.add`)."""


class _Accumulator:
    """Running statistics of one input: sum of squares per feature, mean of X^T X, sum per
    feature; with `groups` > 1, one of each per group of features (a leading dim). Sums run
    in float64 from batch to batch; within one batch, in float32 (the input's precision),
    the squares in float64 where finite inputs' float32 sum overflows.

    X^T X (one group) is summed on and below its diagonal only, in panels of `_PANEL`
    columns (for 1536 features, 60 % of the products, 30 % less time); `full_hessian`
    copies the lower triangle onto the upper. The lower triangle is the whole product's
    to the bit (each entry is the same sum of the same products), and Cholesky factors
    read only that triangle."""

    def __init__(
        self,
        features: int,
        norms: bool,
        hessian: bool,
        sums: bool = False,
        groups: int = 1,
        *,
        equal: bool = False,
    ) -> None:
        self.rows = 0
        self.equal = equal  # rows weighed by `row_weights` in the mean of X^T X and the sums
        self.groups = groups
        lead = (groups,) if groups > 1 else ()
        self.squares = torch.zeros((*lead, features), dtype=torch.float64) if norms else None
        self.sums = torch.zeros((*lead, features), dtype=torch.float64) if sums else None
        self.hessian = torch.zeros((*lead, features, features)) if hessian else None
        self.lower = False  # whether only the lower triangle of `hessian` is up to date
        self.last: Tensor | None = None  # the input seen in this batch, if any
        self.version: int | None = None  # its version then: changed in place, it is another

    def saw(self, x: Tensor) -> bool:
        """Whether `x` is the input seen last, with the values it had then (a residual
        stream added to in place, ``x += ...``, is the same tensor holding another input)."""
        return self.last is x and self.version == _version(x)

    def add(self, x: Tensor) -> None:
        """Add the rows of `x`, (rows, groups, features)."""
        flat = x.detach().to(dtype=torch.float32)
        if self.groups == 1:
            flat = flat[:, 0]
        new = self.rows + flat.shape[0]
        # One batch's rows are summed in float32 (a reduction with dtype=float64 converts
        # each entry, about 10x slower), the batches in float64.
        if self.squares is not None:
            squares = flat.square().sum(dim=0)
            if not bool(torch.isfinite(squares).all()) and bool(torch.isfinite(flat).all()):
                squares = flat.double().square().sum(dim=0)  # finite, past float32's squares
            self.squares += squares
        if self.equal and (self.sums is not None or self.hessian is not None):
            weights = row_weights(flat).view(-1, *(1,) * (flat.dim() - 1))
            if self.sums is not None:
                self.sums += (flat * weights).sum(dim=0)
            flat = flat * weights.sqrt()  # X^T W X as (W^1/2 X)^T (W^1/2 X)
        elif self.sums is not None:
            self.sums += flat.sum(dim=0)
        if self.hessian is not None and new:
            beta, alpha = self.rows / new, 1.0 / new
            if self.groups == 1:
                features = flat.shape[1]
                for first in range(0, features, _PANEL):
                    last = min(features, first + _PANEL)
                    self.hessian[first:last, :last].addmm_(
                        flat[:, first:last].T, flat[:, :last], beta=beta, alpha=alpha
                    )
                self.lower = True
            else:
                grouped = flat.transpose(0, 1)  # (groups, rows, features)
                self.hessian = torch.baddbmm(
                    self.hessian, grouped.transpose(1, 2), grouped, beta=beta, alpha=alpha
                )
        self.rows = new

    def full_hessian(self) -> Tensor:
        """The mean of X^T X, its upper triangle copied from the lower where only that
        was summed."""
        assert self.hessian is not None
        if self.lower:
            below = self.hessian.tril(-1)
            self.hessian.tril_().add_(below.T)
            self.lower = False
        return self.hessian


_LARGEST_WEIGHT = 100.0
"""The largest weight `row_weights` gives a row, relative to a row of the median energy."""


def row_weights(rows: Tensor) -> Tensor:
    """A weight for each row of `rows` (rows first) so that every row counts by its error
    relative to its own size: the median row energy (sum of squares) over the row's own, at
    most ``_LARGEST_WEIGHT`` (a row of zeros gets that), scaled so that the weights average 1
    (a mean of weighted rows stays a mean, the bias's constant input included). A few rows
    far above the median (attention sinks, whose outputs can hold most of a layer's output
    energy) then no longer decide a least-squares fit. Rows that are not finite, or all
    zero, leave the weights at 1 (the statistics then show what they hold)."""
    energy = rows.square().flatten(1).sum(1)
    typical = energy.median() if energy.numel() else energy.new_zeros(())
    if not bool(typical > 0):
        typical = energy.mean() if energy.numel() else typical
    if not bool(torch.isfinite(energy).all()) or not bool(typical > 0):
        return torch.ones_like(energy)
    weights = (typical / energy).clamp(max=_LARGEST_WEIGHT)
    return weights / weights.mean()


class Stop(Exception):
    """Raised by a hook to end a forward once it ran as far as needed (InputStatistics with
    `early`, the capture of a block's inputs, a grouped run, the refit's first input); the
    code that started the forward catches it."""


def named(module: nn.Module, names: Mapping[nn.Module, str] | None) -> str:
    """How a calibration error names `module`: ``module 'a.b' (Linear)`` where `names` (each
    module's path in the model) holds it, else its class."""
    path = None if names is None else names.get(module)
    kind = type(module).__name__
    return kind if path is None else f"module {path or '(the model)'!r} ({kind})"


def called_twice(module: nn.Module, names: Mapping[nn.Module, str] | None) -> ValueError:
    """The error for a calibrated `module` run on a second input in one forward."""
    return value_error(
        f"calibration: {named(module, names)} was called more than once per batch (the "
        "same module run on two inputs in one forward); expected each calibrated layer to "
        "run once per forward: exclude it, or give each use its own module"
    )


class InputStatistics:
    """Forward pre-hooks on `modules` that accumulate their inputs' statistics: `norms` (the
    L2 norm of each input feature, for Wanda) and/or `hessian` (the mean of X^T X over the
    rows of the input, for SparseGPT) and/or `means` (the mean of each input feature). The
    features of a Linear are its input's last dim; of a convolution, its input channels, or
    with `patches` the columns of its weight as criteria.layers sees them (patches of the
    input, per group). With `equal`, the mean of X^T X and the means weigh each row by
    ``row_weights`` (a fit on them weighs each row's error relative to its size). Use as a
    context manager; call ``new_batch()`` before each batch.

    With `early`, a run whose statistics are complete ends there: when the first batch
    called every module (once each: a second call is refused), each later batch raises
    `Stop` as soon as every module has taken its input, before the last one computes and
    before whatever the model runs after it. The statistics are those of the whole run; a
    run whose code swallows `Stop` goes on and takes nothing more in that batch.

    ``new_batch(mask)`` names the batch's tokens that count (``batch_masks``): a layer
    whose input is token-shaped, ``(*mask.shape, features)`` or ``(mask.numel(),
    features)``, takes only the rows of the tokens kept; a layer whose rows are not the
    batch's tokens (a convolution, a routed expert's gathered tokens, a pooled input)
    takes all its rows, as no row of it can be told to be a masked token.

    `names`: each module's path in the model, which an error about a module names (else
    its class)."""

    def __init__(
        self,
        modules: Sequence[nn.Module],
        *,
        norms: bool,
        hessian: bool,
        means: bool = False,
        patches: bool = False,
        early: bool = False,
        equal: bool = False,
        names: Mapping[nn.Module, str] | None = None,
    ) -> None:
        self.modules = list(modules)
        self.names = names
        self._want = (norms, hessian, means)
        self._equal = equal
        self._patches = patches
        self._of: dict[nn.Module, _Accumulator] = {}
        self._handles: list[Any] = []
        self._batch = 0
        self._early = early
        self._called: set[nn.Module] = set()  # this batch's
        self._stopped = False
        self._distinct = len(set(self.modules))
        self._failed: Exception | None = None  # by the last take, raised if the call returns
        self._mask: Tensor | None = None  # this batch's tokens that count; None: all

    def __enter__(self) -> InputStatistics:
        for module in self.modules:
            self._handles.append(module.register_forward_pre_hook(self._take, with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._taken))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for acc in self._of.values():
            acc.last = None

    def new_batch(self, mask: Tensor | None = None) -> None:
        """Start a batch; `mask`: its tokens that count (bool, the tokens' shape, as
        ``batch_masks`` gives it), None: every row of every input counts."""
        self._mask = mask
        if self._batch == 1 and len(self._called) < self._distinct:
            self._early = False  # a module the first batch did not call may run later
        self._batch += 1
        self._called.clear()
        self._stopped = False
        self._failed = None
        for acc in self._of.values():
            acc.last = None

    def _take(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._stopped:
            return  # the run went on past Stop: its statistics are complete
        try:
            self.take(module, args, kwargs)
        except Exception as error:  # the module judges its input first: see _taken
            self._failed = error
            return
        self._called.add(module)
        if self._early and self._batch > 1 and len(self._called) == self._distinct:
            self._stopped = True
            raise Stop

    def _taken(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        """After a call: the error the input met in `take`, now that the module took it."""
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    def take(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Add the input of one call of `module` (its arguments), as the hooks do: for a
        caller that runs hooks of its own (on `module`, in `modules` or not)."""
        x = layer_matrices.layer_input(module, args, kwargs) if self._patches else args[0]
        acc = self._of.get(module)
        shares = not (self._patches and isinstance(module, nn.modules.conv._ConvNd))
        if acc is None:
            found = next((a for a in self._of.values() if a.saw(x)), None) if shares else None
            if found is not None and found.groups == 1:  # another layer saw this input already
                self._of[module] = found
                return
            features = self._features(module, x)
            acc = _Accumulator(
                features.shape[-1], *self._want, groups=features.shape[1], equal=self._equal
            )
            self._of[module] = acc
        elif acc.saw(x):
            return  # another Linear of the group saw this input already
        elif acc.last is not None:
            if not any(a is acc for m, a in self._of.items() if m is not module):
                raise called_twice(module, self.names)
            raise value_error(
                f"calibration: {named(module, self.names)} shared its input with another "
                "layer in the first batch but not in this one; expected each batch to run the "
                "model the same way"
            )
        acc.add(self._features(module, x))
        acc.last, acc.version = x, _version(x)

    def _features(self, module: nn.Module, x: Tensor) -> Tensor:
        if self._mask is not None:
            x = kept_tokens(module, x, self._mask)
        if self._patches:
            return layer_matrices.features(module, x)
        moved = input_features(module, x)
        return moved.reshape(-1, 1, moved.shape[-1])

    def seen(self, module: nn.Module) -> bool:
        return module in self._of and self._of[module].rows > 0

    def norms(self, module: nn.Module) -> Tensor:
        """The L2 norm of each input feature of `module` over all calibration rows: one
        per feature, or (groups, features) for a grouped convolution's patches. float64,
        the root of the float64 sums: Wanda's ranking is not moved by a float32 rounding."""
        squares = self._of[module].squares
        assert squares is not None
        return squares.sqrt()

    def hessian(self, module: nn.Module) -> Tensor:
        """The mean of X^T X over the calibration rows of `module`'s input: (features,
        features), or (groups, features, features) for a grouped convolution's patches."""
        return self._of[module].full_hessian()

    def variances(self, module: nn.Module) -> Tensor:
        """The variance of each input feature of `module` over the calibration rows (float64;
        from the norms and the means, both gathered)."""
        rows = max(self.rows(module), 1)
        squares = self.norms(module).square()
        return (squares / rows - self.means(module).square()).clamp_min(0)

    def means(self, module: nn.Module) -> Tensor:
        """The mean of each input feature of `module` over the calibration rows (float64)."""
        acc = self._of[module]
        assert acc.sums is not None
        return acc.sums / max(acc.rows, 1)

    def sharing(self, targets: Sequence[T]) -> list[list[T]]:
        """`targets` ((module, name) pairs, or anything whose first item is a module seen
        here) grouped by the input they read: one group per statistic, in the order of
        their first member (query, key and value together; gate and up)."""
        groups: dict[int, list[T]] = {}
        for target in targets:
            groups.setdefault(id(self._of[target[0]]), []).append(target)
        return list(groups.values())

    def rows(self, module: nn.Module) -> int:
        """How many rows (tokens, pixels) of `module`'s input the statistics hold."""
        return self._of[module].rows

    def reduce(self, reduce: Reduce, error: BaseException | None = None) -> None:
        """Replace every statistic by its sum (norms) or row-weighted mean (Hessians) over
        the ranks; raise on every rank if any rank's calibration failed (`error` here).

        A module seen on every rank keeps the inputs it shares here (the same on all);
        one seen only on some (an expert no token of a rank reached) is reduced on its
        own, with no rows where unseen.
        """
        seen = torch.tensor([1.0] + [float(self.seen(m)) for m in self.modules])
        counts = agree(reduce, error, seen.double()).tolist()
        ranks, counts = counts[0], counts[1:]
        groups: dict[str, list[nn.Module]] = {}
        local: dict[str, _Accumulator] = {}
        first: dict[int, str] = {}  # accumulator id -> its key
        for index, module in enumerate(self.modules):
            if not counts[index]:
                continue  # seen by no rank: left unseen (the caller names it)
            acc = self._of.get(module) if self.seen(module) else None
            if counts[index] == ranks and acc is not None:
                key = first.setdefault(id(acc), str(index))
            else:
                key = str(index)
            if key not in local:
                local[key] = acc or self._empty(module)
            groups.setdefault(key, []).append(module)
        statistics: dict[str, Tensor] = {}
        weights: dict[str, float] = {}
        for key, acc in local.items():
            statistics[f"{key}.rows"] = torch.tensor([float(acc.rows)], dtype=torch.float64)
            if acc.squares is not None:
                statistics[f"{key}.squares"] = acc.squares
            if acc.hessian is not None:
                statistics[f"{key}.hessian"] = acc.full_hessian()
                weights[f"{key}.hessian"] = float(acc.rows)
            if acc.sums is not None:
                statistics[f"{key}.sums"] = acc.sums
        summed = reduce(statistics, weights) if statistics else {}
        for key, modules in groups.items():
            acc = _Accumulator(0, False, False, groups=local[key].groups)
            acc.rows = int(summed[f"{key}.rows"][0])
            acc.squares = summed.get(f"{key}.squares")
            acc.hessian = summed.get(f"{key}.hessian")
            acc.sums = summed.get(f"{key}.sums")
            for module in modules:
                self._of[module] = acc

    def _empty(self, module: nn.Module) -> _Accumulator:
        """The statistics of no rows, for a module this rank never ran."""
        if self._patches:
            groups, columns = layer_matrices.width(module)
            return _Accumulator(columns, *self._want, groups=groups, equal=self._equal)
        return _Accumulator(_width(module), *self._want, equal=self._equal)

    def accumulators(self) -> int:
        """How many distinct inputs are held (shared ones once)."""
        return len({id(a) for a in self._of.values()})


class TokenCall(dict[str, object]):
    """A block's captured call as keyword arguments (its ``attention_mask``, if any, the
    block's own), run as a batch of the block alone, with `tokens`: the token mask of the
    calibration batch it came from (``batch_masks``' entry; None: every token counts),
    which ``batch_masks`` gives for it."""

    def __init__(self, kwargs: Mapping[str, object], tokens: Tensor | None) -> None:
        super().__init__(kwargs)
        self.tokens = tokens


def batch_masks(
    batches: Sequence[object],
    numbers: Sequence[int] | None = None,
    owner: str = "calibration",
    *,
    model: nn.Module | None = None,
) -> list[Tensor | None]:
    """Each batch's tokens that count, for ``InputStatistics.new_batch``: True where a
    batch's ``attention_mask`` is nonzero (``core.example_inputs.token_mask``: a
    mapping's, or a tuple's item that `model`'s forward names so);
    a ``TokenCall``'s own `tokens`; None for a batch without a mask, for one whose mask
    keeps every token (its statistics are then those of no mask, gathered as fast), and
    for a mask of more dims than (batch, tokens) (a block's own attention mask, as a
    block's captured call holds it: no token mask).

    Args:
        batches: the calibration batches.
        numbers: each batch's index in the caller's calibration, as an error names it
            (default: its place in `batches`).
        owner: the entry point an error names.
        model: the model the batches are given to, whose forward names the items of a
            tuple or list batch (None: such a batch has no mask).

    Returns:
        One bool tensor (or None) per batch.

    Raises:
        ValueError: a batch's mask is not shaped like its ``input_ids`` (token_mask).
    """
    found: list[Tensor | None] = []
    for place, batch in enumerate(batches):
        if isinstance(batch, TokenCall):
            found.append(batch.tokens)
            continue
        kept = token_mask(batch, place if numbers is None else numbers[place], owner, model)
        if kept is not None and (kept.dim() > 2 or bool(kept.all())):
            kept = None  # more dims than (batch, tokens): a block's own attention mask
        found.append(kept)
    return found


def kept_tokens(module: nn.Module, x: Tensor, mask: Tensor) -> Tensor:
    """The rows of `x` (`module`'s input) of the tokens `mask` keeps (``token_rows``); a
    MultiheadAttention without ``batch_first`` reads its query, and its out_proj the
    heads' output, as (tokens, batch, features) (``layer_matrices.tokens_first``), so the
    mask is read transposed there. A convolution's input is `x` itself (its rows are
    positions of a map, not the batch's tokens)."""
    if isinstance(module, nn.modules.conv._ConvNd):
        return x
    if x.dim() == 3 and layer_matrices.tokens_first(module):
        mask = mask.T  # its input is (tokens, batch, features)
    return token_rows(x, mask)


def token_rows(x: Tensor, mask: Tensor | None) -> Tensor:
    """The rows of `x` of the tokens `mask` keeps, where `x` is one row per token:
    ``(*mask.shape, features)`` (the tokens kept, as ``(kept, features)``; a mask of
    (tokens,) and `x` of (tokens, features) too: one sequence, unbatched), or
    ``(mask.numel(), features)`` (the tokens flattened, in order). Else `x` itself: rows
    that are not the batch's tokens (a routed expert's gathered tokens, a pooled output),
    where no row can be told to be a masked one, and `x` without a mask.

    Args:
        x: a layer's input or a block's output, features last.
        mask: True for each token kept (a batch's ``batch_masks`` entry), or None: all.

    Returns:
        The kept rows, as ``(kept, features)``, or `x` as it is.
    """
    if mask is None or x.dim() < 2:
        return x
    if tuple(x.shape[:-1]) == tuple(mask.shape):
        return x[mask.to(device=x.device)]
    if x.dim() == 2 and x.shape[0] == mask.numel() and mask.dim() > 1:
        return x[mask.to(device=x.device).reshape(-1)]
    return x


def _width(module: nn.Module) -> int:
    """The input width of a Linear or convolution (in_features or in_channels)."""
    features = getattr(module, "in_features", getattr(module, "in_channels", None))
    if not isinstance(features, int):
        raise type_error(
            f"calibration: {type(module).__name__} has no in_features; expected Linear layers"
        )
    return features


def _version(x: Tensor) -> int | None:
    """`x`'s version counter (moved by each change in place); None for an inference tensor,
    which keeps none."""
    return None if x.is_inference() else x._version


def input_features(module: nn.Module, x: Tensor) -> Tensor:
    """The input with its features last: a convolution's channels are moved there."""
    if isinstance(module, nn.modules.conv._ConvNd):
        return x.movedim(x.dim() - len(module.kernel_size) - 1, -1)
    return x
