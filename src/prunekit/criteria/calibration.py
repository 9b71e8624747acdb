"""Calibration: streaming statistics of Linear inputs gathered by forward hooks, gradients
for Taylor, and the sequential driver that calibrates a model one block at a time.

Statistics are running sums, updated batch by batch: never a list of activations. Linears
that read the same input tensor (query, key and value; gate and up) share one accumulator,
found by identity in the first batch. In sequential mode the model runs once up to its
first block, whose inputs are kept; then each block is calibrated on them, pruned, and run
again to give the next block's inputs: only one block's statistics exist at a time.

Across data-parallel ranks, each calibrating on its own batches, a `Reduce` (given from
above: prunekit.distributed.stats.Reducer over a process group) sums the statistics where
they are made, at the end of `calibrate` and `block_statistics`: every rank then holds
those of all the batches. An error a rank meets in calibration is held until that
reduction, where `Reduce.settle` makes every rank raise it (the protocol of
prunekit/distributed/agree.py). This module imports nothing of torch.distributed.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import CodeType
from typing import Any, Protocol, TypeVar

import torch
from torch import Tensor, nn

from prunekit.core.checks import check_kind
from prunekit.core.errors import type_error, value_error
from prunekit.core.naming import stored_parameter
from prunekit.criteria import weight_matrices

__all__ = [
    "InputStatistics",
    "Reduce",
    "Stop",
    "Wanted",
    "agree",
    "block_list",
    "cacheless",
    "calls_back",
    "capture_block_inputs",
    "evaluating",
    "gradient_targets",
    "output_loss",
    "parameter",
    "requiring_grad",
    "run_batch",
    "run_block",
]

Inputs = tuple[tuple[Any, ...], dict[str, Any]]
"""The positional and keyword arguments one block was called with, for one batch."""

T = TypeVar("T", bound=tuple[Any, ...])

_CACHES = ("past_key_value", "past_key_values", "layer_past")


class Reduce(Protocol):
    """Statistics reduced over data-parallel ranks, and the ranks told of each other's
    failures (prunekit.distributed.stats.Reducer over a process group)."""

    def __call__(
        self, statistics: dict[str, Tensor], weights: dict[str, float]
    ) -> dict[str, Tensor]:
        """The statistics summed over the ranks, as new tensors; a name given a weight is
        averaged instead, ``sum(w_r * s_r) / sum(w_r)``. Every rank calls it with the same
        names, shapes and dtypes."""

    def settle(self, error: BaseException | None) -> None:
        """Every rank learns whether any failed (`error` on this one): if one did, every
        rank raises the same error."""


def agree(reduce: Reduce, error: BaseException | None, more: Tensor | None = None) -> Tensor:
    """Every rank learns whether any failed, and raises then (the same error on every
    rank); else returns `more` (float64) summed over the ranks."""
    reduce.settle(error)
    if more is None:
        return torch.zeros(0, dtype=torch.float64)
    return reduce({"calibration.counts": more.to(torch.float64)}, {})["calibration.counts"]


def run_batch(model: nn.Module, batch: Any) -> Any:
    """``model(batch)`` for a tensor, ``model(**batch)`` for a mapping (a tokenizer's output),
    ``model(*batch)`` for a tuple or list."""
    if isinstance(batch, Tensor):
        return model(batch)
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, tuple | list):
        return model(*batch)
    raise type_error(
        f"calibration: invalid batch of type {type(batch).__name__}; expected a tensor, a "
        "mapping of keyword arguments or a tuple of positional arguments for the model"
    )


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """Run the block with every submodule in eval mode (no dropout); modes restored after."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, mode in modes:
            module.training = mode


_PANEL = 256
"""Columns of X^T X one matrix product adds (`_Accumulator.add`)."""


class _Accumulator:
    """Running statistics of one input: sum of squares per feature, mean of X^T X, sum per
    feature; with `groups` > 1, one of each per group of features (a leading dim). Sums run
    in float64 from batch to batch; within one batch, in float32 (the input's precision).

    X^T X (one group) is summed on and below its diagonal only, in panels of `_PANEL`
    columns (for 1536 features, 60 % of the products, 30 % less time); `full_hessian`
    copies the lower triangle onto the upper. The lower triangle is the whole product's
    to the bit (each entry is the same sum of the same products), and Cholesky factors
    read only that triangle."""

    def __init__(
        self, features: int, norms: bool, hessian: bool, sums: bool = False, groups: int = 1
    ) -> None:
        self.rows = 0
        self.groups = groups
        lead = (groups,) if groups > 1 else ()
        self.squares = torch.zeros((*lead, features), dtype=torch.float64) if norms else None
        self.sums = torch.zeros((*lead, features), dtype=torch.float64) if sums else None
        self.hessian = torch.zeros((*lead, features, features)) if hessian else None
        self.lower = False  # whether only the lower triangle of `hessian` is up to date
        self.last: Tensor | None = None  # the input seen in this batch, if any

    def add(self, x: Tensor) -> None:
        """Add the rows of `x`, (rows, groups, features)."""
        flat = x.detach().to(dtype=torch.float32)
        if self.groups == 1:
            flat = flat[:, 0]
        new = self.rows + flat.shape[0]
        # One batch's rows are summed in float32 (a reduction with dtype=float64 converts
        # each entry, about 10x slower), the batches in float64.
        if self.squares is not None:
            self.squares += flat.square().sum(dim=0)
        if self.sums is not None:
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


class Stop(Exception):
    """Raised by a hook to end a forward once it ran as far as needed (InputStatistics with
    `early`, the capture of a block's inputs, a grouped run, the refit's first input); the
    code that started the forward catches it."""


class InputStatistics:
    """Forward pre-hooks on `modules` that accumulate their inputs' statistics: `norms` (the
    L2 norm of each input feature, for Wanda) and/or `hessian` (the mean of X^T X over the
    rows of the input, for SparseGPT) and/or `means` (the mean of each input feature). The
    features of a Linear are its input's last dim; of a convolution, its input channels, or
    with `patches` the columns of its weight as criteria.layers sees them (patches of the
    input, per group). Use as a context manager; call ``new_batch()`` before each batch.

    With `early`, a run whose statistics are complete ends there: when the first batch
    called every module (once each: a second call is refused), each later batch raises
    `Stop` as soon as every module has taken its input, before the last one computes and
    before whatever the model runs after it. The statistics are those of the whole run; a
    run whose code swallows `Stop` goes on and takes nothing more in that batch."""

    def __init__(
        self,
        modules: Sequence[nn.Module],
        *,
        norms: bool,
        hessian: bool,
        means: bool = False,
        patches: bool = False,
        early: bool = False,
    ) -> None:
        self.modules = list(modules)
        self._want = (norms, hessian, means)
        self._patches = patches
        self._of: dict[nn.Module, _Accumulator] = {}
        self._handles: list[Any] = []
        self._batch = 0
        self._early = early
        self._called: set[nn.Module] = set()  # this batch's
        self._stopped = False
        self._distinct = len(set(self.modules))
        self._failed: Exception | None = None  # by the last take, raised if the call returns

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

    def new_batch(self) -> None:
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
        x = weight_matrices.layer_input(module, args, kwargs) if self._patches else args[0]
        acc = self._of.get(module)
        shares = not (self._patches and isinstance(module, nn.modules.conv._ConvNd))
        if acc is None:
            found = next((a for a in self._of.values() if a.last is x), None) if shares else None
            if found is not None and found.groups == 1:  # another layer saw this input already
                self._of[module] = found
                return
            features = self._features(module, x)
            acc = _Accumulator(features.shape[-1], *self._want, groups=features.shape[1])
            self._of[module] = acc
        elif acc.last is x:
            return  # another Linear of the group saw this input already
        elif acc.last is not None:
            if not any(a is acc for m, a in self._of.items() if m is not module):
                raise value_error(
                    f"calibration: {type(module).__name__} was called more than once per "
                    "batch (the same module run on two inputs in one forward); expected "
                    "each calibrated layer to run once per forward: "
                    "exclude it, or give each use its own module"
                )
            raise value_error(
                f"calibration: {type(module).__name__} shared its input with another layer "
                "in the first batch but not in this one; expected each batch to run the "
                "model the same way"
            )
        acc.add(self._features(module, x))
        acc.last = x

    def _features(self, module: nn.Module, x: Tensor) -> Tensor:
        if self._patches:
            return weight_matrices.features(module, x)
        moved = _features(module, x)
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
            groups, columns = weight_matrices.width(module)
            return _Accumulator(columns, *self._want, groups=groups)
        return _Accumulator(_width(module), *self._want)

    def accumulators(self) -> int:
        """How many distinct inputs are held (shared ones once)."""
        return len({id(a) for a in self._of.values()})


def _width(module: nn.Module) -> int:
    """The input width of a Linear or convolution (in_features or in_channels)."""
    features = getattr(module, "in_features", getattr(module, "in_channels", None))
    if not isinstance(features, int):
        raise type_error(
            f"calibration: {type(module).__name__} has no in_features; expected Linear layers"
        )
    return features


def _features(module: nn.Module, x: Tensor) -> Tensor:
    """The input with its features last: a convolution's channels are moved there."""
    if isinstance(module, nn.modules.conv._ConvNd):
        return x.movedim(x.dim() - len(module.kernel_size) - 1, -1)
    return x


def block_list(model: nn.Module, owners: Sequence[nn.Module]) -> tuple[str, nn.ModuleList] | None:
    """The model's sequence of blocks: the ModuleList of two or more modules of one class
    that holds the most of `owners` (the modules to prune); None if none holds any."""
    wanted = {id(m) for m in owners}
    best: tuple[int, str, nn.ModuleList] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) < 2:
            continue
        if len({type(child) for child in module}) != 1:
            continue
        held = sum(1 for child in module for sub in child.modules() if id(sub) in wanted)
        if held and (best is None or held > best[0]):
            best = (held, name, module)
    return None if best is None else (best[1], best[2])


def cacheless(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A block's keyword arguments without its key/value cache, so it can run again."""
    kwargs = dict(kwargs)
    for key in _CACHES:
        if key in kwargs:
            kwargs[key] = None
    if "use_cache" in kwargs:
        kwargs["use_cache"] = False
    return kwargs


def _cache_positions(module: nn.Module) -> set[int]:
    """The positions at which `module`'s forward takes a key/value cache (GPT-2's blocks
    take ``past_key_values`` second): a cache given there is dropped as one by keyword."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):  # no signature to read
        return set()
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    found: set[int] = set()
    for index, param in enumerate(params):
        if param.kind not in positional:
            break
        if param.name in _CACHES:
            found.add(index)
    return found


def capture_block_inputs(
    model: nn.Module, block: nn.Module, batches: Sequence[Any]
) -> list[Inputs]:
    """Run the model on each batch up to `block` and keep what `block` was called with
    (caches dropped); nothing after the block runs."""
    captured: list[Inputs] = []

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        cached = _cache_positions(module)
        args = tuple(None if i in cached else a for i, a in enumerate(args))
        captured.append((args, cacheless(kwargs)))
        raise Stop

    handle = block.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        for index, batch in enumerate(batches):
            try:
                run_batch(model, batch)
            except Stop:
                continue
            except Exception as error:
                raise _batch_error(index, error)  # noqa: B904 (the cause is set on a new error)
            raise value_error(
                f"calibration: batch {index} ran the model's forward without reaching its "
                f"blocks ({type(block).__name__}); expected a model that calls them"
            )
    finally:
        handle.remove()
    return captured


def _check_loss(value: Any, index: int) -> None:
    """Raise unless `value`, what the caller's loss returned on batch `index`, is a tensor
    a gradient can flow back from: one floating element, computed from the model."""
    if not isinstance(value, Tensor):
        found = f"a {type(value).__name__} ({value!r:.60})"
    elif value.numel() != 1:
        found = f"a tensor of shape {tuple(value.shape)}"
    elif not value.is_floating_point():
        found = f"a tensor of dtype {value.dtype}"
    elif not value.requires_grad:
        found = "a tensor that does not require grad (detached, or not computed from the output)"
    elif value.is_meta:
        found = "a meta tensor (a shape without a value)"
    else:
        return
    raise value_error(
        f"calibration: loss(output, batch) returned {found} on batch {index}; expected "
        "loss to return a scalar floating tensor that requires grad (computed from the "
        "model's output)"
    )


def _check_finite_loss(value: Tensor, index: int, model: nn.Module, batch: Any) -> None:
    """Raise if the loss on batch `index` is NaN or infinite while the model's parameters and
    the batch are finite: the loss is then the cause, and its gradients would make every
    score unrankable. Where they are not finite, the scores' own check names the tensor."""
    if bool(torch.isfinite(value.detach()).all()):
        return
    tensors = [*model.parameters(), *_tensors(batch, 0)]
    if all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point()):
        raise value_error(
            f"calibration: loss(output, batch) is {float(value.detach())} on batch {index}, "
            "with finite parameters and inputs; expected a finite loss (its gradients would "
            "make every score unrankable)"
        )


def _tensors(value: Any, depth: int) -> list[Tensor]:
    """The tensors of a batch, in mappings, lists and tuples a few levels deep."""
    if isinstance(value, Tensor):
        return [value.detach()]
    if depth >= 3:
        return []
    items = value.values() if isinstance(value, Mapping) else value
    if not isinstance(value, Mapping | list | tuple):
        return []
    return [t for item in items for t in _tensors(item, depth + 1)]


def _batch_error(index: int, error: Exception, what: str = "model") -> Exception:
    """The error to raise for `error`, met on batch `index`: an error prunekit explained
    already, or one raised in prunekit's own code (a bug, not the caller's), as it is;
    else the caller's `what` ('model' or 'loss') is named as the one that failed."""
    if getattr(error, "_prunekit_explained", False) or _raised_by_prunekit(error):
        return error
    if what == "loss":
        found = value_error(
            f"calibration: the loss raised on batch {index}: {type(error).__name__}: "
            f"{error}; expected loss(output, batch) to return a scalar tensor"
        )
    else:
        found = value_error(
            f"calibration: the model cannot take batch {index}: {type(error).__name__}: "
            f"{error}; expected batches the model's forward accepts"
        )
    found.__cause__ = error
    return found


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

_THROUGH: set[CodeType] = set()
"""The code of prunekit's functions that stand in a model's own call and call on into the
model (a wrapped forward): an error passing through them is not prunekit's."""


def calls_back(function: Callable[..., Any]) -> None:
    """Mark `function` as standing in the model's call and calling on into it: an error
    raised further in (by the model) is the model's, not prunekit's."""
    _THROUGH.add(function.__code__)


def _raised_by_prunekit(error: BaseException) -> bool:
    """Whether `error` came from prunekit's own code run inside the model's call (a hook of
    prunekit's, torch calling back into it) rather than from the caller's model or loss."""
    left = False  # the traceback went from prunekit into other code (torch, the model)
    trace = error.__traceback__
    while trace is not None:
        code = trace.tb_frame.f_code
        if code in _THROUGH and trace.tb_next is not None:
            trace = trace.tb_next  # passed through on its way into the model
            continue
        ours = os.path.abspath(code.co_filename).startswith(_PACKAGE)
        if ours and left:
            return True
        left = left or not ours
        trace = trace.tb_next
    return False


def run_block(block: nn.Module, inputs: Inputs) -> Inputs:
    """Call `block` and return the inputs of the next one: the same arguments with the
    hidden states (the first positional one, or ``hidden_states=``) replaced."""
    args, kwargs = inputs
    out = block(*args, **kwargs)
    hidden = out[0] if isinstance(out, tuple | list) else out
    if args:
        return (hidden, *args[1:]), kwargs
    if "hidden_states" in kwargs:
        return args, {**kwargs, "hidden_states": hidden}
    raise value_error(
        f"calibration: cannot tell which argument of {type(block).__name__} carries the "
        "hidden states; expected a first positional argument or hidden_states= (or pass "
        "sequential=False)"
    )


def batch_list(calibration: Any, owner: str) -> list[Any]:
    """`calibration` as a list of batches; refused (the message names `owner`) unless it is
    a non-empty iterable other than a tensor, a mapping (one batch of keyword arguments: a
    tokenizer's output) or a string."""
    one = isinstance(calibration, Tensor | Mapping | str | bytes)  # one batch, or no batches
    if one or not isinstance(calibration, Iterable):
        raise type_error(
            f"{owner}: invalid calibration of type {type(calibration).__name__}; "
            "expected an iterable of batches (a list of tensors, say)"
        )
    batches = list(calibration)
    if not batches:
        raise value_error(f"{owner}: calibration holds no batch; expected at least one")
    for index, batch in enumerate(batches):
        _check_batch(batch, f"{owner}: calibration batch {index}", "", 0)
    return batches


def _check_batch(value: Any, where: str, path: str, depth: int) -> None:
    """Refuse a tensor of a batch that holds no values (meta): a forward on it computes
    nothing that can be ranked. Looks into mappings, lists and tuples, a few levels deep."""
    if isinstance(value, Tensor):
        if value.is_meta:
            check_kind(value, where, f"the tensor{' at ' + path if path else ''}", real=False)
        return
    if depth >= 3:
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            _check_batch(item, where, f"{path}[{key!r}]", depth + 1)
    elif isinstance(value, list | tuple):
        for k, item in enumerate(value):
            _check_batch(item, where, f"{path}[{k}]", depth + 1)


@dataclass(frozen=True)
class Wanted:
    """Which statistics of their inputs the modules gather (see InputStatistics)."""

    norms: bool
    hessian: bool
    means: bool = False
    patches: bool = False

    def gather(self, modules: Sequence[nn.Module], *, early: bool = False) -> InputStatistics:
        """Statistics of these kinds for `modules`, gathered while the returned context is
        entered (`early`: see InputStatistics)."""
        return InputStatistics(
            modules,
            norms=self.norms,
            hessian=self.hessian,
            means=self.means,
            patches=self.patches,
            early=early,
        )


def calibrate(
    model: nn.Module,
    batches: Sequence[Any],
    modules: Sequence[nn.Module],
    wanted: Wanted,
    *,
    reduce: Reduce | None = None,
    numbers: Sequence[int] | None = None,
) -> InputStatistics:
    """One pass of the whole model over `batches`, the `wanted` statistics for `modules`
    (with `reduce`: of every rank's batches). After the first batch, each run ends once
    every module has taken its input (InputStatistics' `early`). `numbers`: each batch's
    index in the caller's calibration (an error names it), where a subset is run."""
    with evaluating(model), torch.no_grad(), wanted.gather(modules, early=True) as stats:
        run = lambda batch: run_batch(model, batch)  # noqa: E731
        failed = _run_each(stats, batches, run, reduce, numbers)
    return _finish(stats, reduce, failed)


def block_statistics(
    block: nn.Module,
    inputs: Sequence[Inputs],
    modules: Sequence[nn.Module],
    wanted: Wanted,
    *,
    reduce: Reduce | None = None,
    failed: BaseException | None = None,
    numbers: Sequence[int] | None = None,
) -> InputStatistics:
    """The `wanted` statistics for `modules` (inside `block`) from running `block` on
    `inputs` (with `reduce`: of every rank's inputs). `failed`, an error this rank met
    before (the block is not run then), is raised here once every rank has learnt of it.
    After the first input, each run ends once every module has taken its input. `numbers`:
    each input's batch index in the calibration (an error names it), where a subset runs."""
    with wanted.gather(modules, early=True) as stats:
        if failed is None:
            run = lambda call: block(*call[0], **call[1])  # noqa: E731
            failed = _run_each(stats, inputs, run, reduce, numbers)
    return _finish(stats, reduce, failed)


def _run_each(
    stats: InputStatistics, items: Iterable[Any], run: Callable[[Any], object],
    reduce: Reduce | None, numbers: Sequence[int] | None = None,
) -> BaseException | None:  # fmt: skip
    """Run each item as a batch of `stats`. An error names its batch (its entry of
    `numbers` where given); with `reduce` it is returned (every rank must learn of it in
    the reduction) instead of raised."""
    try:
        for index, item in enumerate(items):
            stats.new_batch()
            try:
                run(item)
            except Stop:
                pass  # every module took its input: the rest of the run is not needed
            except Exception as error:
                number = index if numbers is None else numbers[index]
                raise _batch_error(number, error)  # noqa: B904 (the cause is set on a new error)
    except Exception as error:
        if reduce is None:
            raise
        return error
    return None


def _finish(
    stats: InputStatistics, reduce: Reduce | None, failed: BaseException | None
) -> InputStatistics:
    """Reduce the statistics over the ranks (raising an error any rank met), or raise this
    rank's own error."""
    if reduce is not None:
        stats.reduce(reduce, failed)
    elif failed is not None:
        raise failed
    return stats


def next_inputs(block: nn.Module, inputs: Sequence[Inputs]) -> list[Inputs]:
    """`block`'s outputs for each batch, as the next block's inputs."""
    found = []
    for index, one in enumerate(inputs):
        try:
            found.append(run_block(block, one))
        except Exception as error:
            raise _batch_error(index, error)  # noqa: B904 (the cause is set on a new error)
    return found


def gradients(
    model: nn.Module,
    batches: Sequence[Any],
    params: Sequence[tuple[nn.Parameter, Callable[[], Tensor]]],
    loss: Callable[[Any, Any], Tensor],
    step: Callable[[int, Tensor, Tensor], None],
    *,
    end_batch: Callable[[], None] | None = None,
) -> None:
    """Backward of `loss` for each batch; for each of `params` (a Parameter and a function
    giving the tensor it stands for), ``step(i, values, grad)``, then ``end_batch()``.
    Only `params` get gradients; every requires_grad flag and .grad is as before
    afterwards."""
    wanted = [p for p, _ in params]
    with requiring_grad(model, wanted, restore_grads=True), evaluating(model), torch.enable_grad():
        for index, batch in enumerate(batches):
            try:
                output = run_batch(model, batch)
            except Exception as error:
                raise _batch_error(index, error)  # noqa: B904 (the cause is set on a new error)
            try:
                value = loss(output, batch)
            except Exception as error:
                raise _batch_error(index, error, "loss")  # noqa: B904 (the cause is set on a new error)
            _check_loss(value, index)
            _check_finite_loss(value, index, model, batch)
            value.backward()  # type: ignore[no-untyped-call]
            for i, (p, current) in enumerate(params):
                if p.grad is not None:
                    step(i, current().detach(), p.grad)
                p.grad = None
            if end_batch is not None:
                end_batch()


@contextmanager
def requiring_grad(
    model: nn.Module, params: Iterable[nn.Parameter], *, restore_grads: bool = False
) -> Iterator[None]:
    """Only `params` require grad while entered: no other parameter of `model` does (no
    graph is built through them). Every flag is put back on exit, after an error too.

    With `restore_grads`, `params` also start with no ``.grad``, and every ``.grad`` (of
    `model`'s parameters and of `params`) is put back on exit as it was on entry."""
    wanted = list(params)
    chosen = {id(p) for p in wanted}
    every = list({id(p): p for p in (*model.parameters(), *wanted)}.values())
    saved = [(p, p.requires_grad, p.grad) for p in every]
    try:
        for p in every:
            p.requires_grad_(id(p) in chosen)
            if restore_grads and id(p) in chosen:
                p.grad = None
        yield
    finally:
        for p, flag, grad in saved:
            p.requires_grad_(flag)
            if restore_grads:
                p.grad = grad


def parameter(module: nn.Module, name: str) -> nn.Parameter:
    """The Parameter behind ``module.<name>``, whose gradient `gradients` takes:
    ``<name>_orig`` where pruned."""
    param = stored_parameter(module, name)
    assert param is not None, f"{type(module).__name__} has no parameter {name}"
    return param


def gradient_targets(
    targets: Iterable[tuple[nn.Module, str]],
) -> list[tuple[nn.Parameter, Callable[[], Tensor]]]:
    """What `gradients` takes for the tensors ``module.<name>``: the Parameter behind each
    and a function giving the tensor as the model computes with it (masked where pruned)."""
    return [(parameter(module, name), _reader(module, name)) for module, name in targets]


def _reader(module: nn.Module, name: str) -> Callable[[], Tensor]:
    def read() -> Tensor:
        value: Tensor = getattr(module, name)
        return value

    return read


def output_loss(owner: str, argument: str) -> Callable[[Any, Any], Tensor]:
    """The loss `gradients` takes when the caller gives none: the model output's ``.loss``.
    Its error names `owner` and its `argument` (such as ``method='taylor'``)."""

    def loss(output: Any, batch: Any) -> Tensor:
        value = getattr(output, "loss", None)
        if not isinstance(value, Tensor):
            raise value_error(
                f"{owner}: {argument} needs a loss and the model's output has no .loss; "
                "expected loss=lambda output, batch: <a scalar tensor>"
            )
        return value

    return loss
