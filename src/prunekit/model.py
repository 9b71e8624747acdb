"""prune_model: prune a whole model by parameter names, in one call that fails as a whole.

It walks the model with names, selects parameters with the CLI's include/exclude globs,
prunes each where it has to be pruned (a MultiheadAttention's out_proj through the
attention module, which reads it without calling it), prunes a tied parameter (one
Parameter under several names) once and masks it under every name, and returns the
model's Report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from prunekit.core.backend import is_module
from prunekit.core.naming import ORIG, mask_name, pruned_name
from prunekit.core.transaction import Snapshot
from prunekit.functional import custom_from_mask, global_unstructured
from prunekit.io.statedict import METHODS, Entry, select_names
from prunekit.methods import LnStructured
from prunekit.oneshot import CALIBRATED, default_pattern, oneshot
from prunekit.report import Report, report

__all__ = ["SCOPES", "prune_model"]

SCOPES = ("layer", "global")


@dataclass
class _Target:
    """One parameter to prune: where it is installed and every other name it has."""

    name: str  # its name in the model, as the report and the globs see it
    module: nn.Module  # the module the pruning is installed on
    leaf: str  # its name there (dotted for out_proj, installed through the attention)
    holder: nn.Module  # the module that holds the parameter itself
    param: Any
    ties: list[tuple[nn.Module, str, str]] = field(default_factory=list)  # holder, leaf, name
    aliases: list[str] = field(default_factory=list)  # names of the same holder elsewhere

    def holders(self) -> list[tuple[nn.Module, str, str]]:
        """(holder, leaf, name) of each module holding the parameter, this one first."""
        return [(self.holder, self.leaf.rpartition(".")[2], self.name), *self.ties]


def prune_model(
    model: nn.Module,
    amount: float,
    *,
    method: str = "l1",
    pattern: Any = None,
    scope: str = "layer",
    calibration: Iterable[Any] | None = None,
    include: Sequence[str] | str = ("*",),
    exclude: Sequence[str] | str = (),
    process_group: Any = None,
    sequential: bool = True,
    loss: Callable[[Any, Any], Any] | None = None,
    progress: bool | None = None,
) -> Report:
    """Prune the parameters of `model` selected by name; return ``report(model)``.

    `method`: ``'l1'`` (smallest magnitudes), ``'random'``, ``'ln'`` (whole output
    channels, dim 0, by their L2 norm; layer scope only), or, from `calibration` batches
    (tensors, mappings of keyword arguments or tuples for the model's forward):
    ``'wanda'`` (|W| x the L2 norm of each input feature), ``'sparsegpt'`` (OBS with
    updates of the weights left, written into ``<name>_orig``), ``'taylor'`` (|W x grad|
    summed over the batches of ``loss(output, batch)``, default ``output.loss``).
    `pattern`: ``'unstructured'``, ``'row'`` (the same share of each output row),
    ``'N:M'`` (``'2:4'``, ``'4:8'``: keep N of every M along the input dim; `amount`
    must be (M-N)/M) or a Pattern; None (the default): ``'row'`` for ``'wanda'`` in scope
    ``'layer'`` (as Wanda's paper ranks; whole-layer ranking is clearly worse on LLMs),
    ``'unstructured'`` otherwise. `scope`: ``'layer'`` prunes `amount` of each tensor,
    ``'global'`` `amount` of all selected tensors ranked together (unstructured only).
    `sequential`: calibrate block by block, each on the outputs of the pruned blocks
    before it (only one block's statistics in memory). `progress`: a bar on stderr for
    calibrated runs (default: when stderr is a terminal).
    `include`/`exclude` are globs of parameter names, as the CLI's: the default
    ``('*',)`` takes every floating-point parameter of two or more dims (weights, not
    biases or norms), and for the calibrated methods every Linear weight but the output
    head (``get_output_embeddings()``, or a Linear sharing an embedding's weight); any
    other `include` selects by name, any number of dims. Tensors pruned before are
    pruned further (their entries already pruned stay so). A tied parameter is ranked
    once and masked under each of its names: remove() each name to make it permanent.
    `process_group` (a torch.distributed group): for 'l1' and 'random' (scope 'global'
    only) the ranks hold parts of the model, ranked as one (see prunekit.distributed);
    for the calibrated methods every rank holds the whole model and calibrates on its
    own batches, and the statistics (Taylor: saliencies) are reduced over the ranks, so
    every rank gets the masks (and SparseGPT's updates) of one process calibrating on
    all the batches. Every argument, tensor and batch is checked first; if anything
    fails, the model is left exactly as it was.
    """
    if pattern is None:
        pattern = default_pattern(method, scope)
    if method in CALIBRATED or (method in ("l1", "random") and not _plain(pattern)):
        reduce = None
        if process_group is not None:
            reduce = _reducer(method, process_group)
        return _oneshot(
            model,
            amount,
            method,
            pattern,
            scope,
            calibration,
            include,
            exclude,
            sequential,
            loss,
            progress,
            reduce,
        )
    if not _plain(pattern) or calibration is not None:
        raise ValueError(
            f"prune_model: method={method!r} takes no pattern and no calibration; expected "
            f"pattern='unstructured', calibration=None (patterns: l1, random, {CALIBRATED})"
        )
    cls, kwargs = _method(method, scope, amount)
    if process_group is not None:
        if scope != "global":
            raise ValueError(
                f"prune_model: process_group applies to scope='global', not {scope!r}; each "
                "rank prunes its own tensors in scope 'layer'"
            )
        kwargs["process_group"] = process_group
    targets = _targets(model, _patterns(include, "include"), _patterns(exclude, "exclude"))
    snapshots = [Snapshot(m) for m in model.modules()]
    try:
        if scope == "global":
            global_unstructured([(t.module, t.leaf) for t in targets], cls, **kwargs)
        else:
            for target in targets:
                cls.apply(target.module, target.leaf, **kwargs)
        for target in targets:
            mask = getattr(target.holder, mask_name(target.leaf.rpartition(".")[2]))
            for holder, leaf, _ in target.ties:
                custom_from_mask(holder, leaf, mask)
    except BaseException:
        for snapshot in snapshots:
            snapshot.restore()
        raise
    return report(model)


def _plain(pattern: Any) -> bool:
    return isinstance(pattern, str) and pattern == "unstructured"


def _oneshot(
    model: nn.Module,
    amount: Any,
    method: str,
    pattern: Any,
    scope: Any,
    calibration: Any,
    include: Any,
    exclude: Any,
    sequential: Any,
    loss: Any,
    progress: Any,
    reduce: Any,
) -> Report:
    """Calibrated methods and patterns: the one-shot engine on the selected tensors."""
    includes = _patterns(include, "include")
    targets = _targets(model, includes, _patterns(exclude, "exclude"))
    if method in CALIBRATED and includes == ("*",):
        heads = _output_heads(model)
        targets = [
            t
            for t in targets
            if isinstance(t.module, nn.Linear) and t.leaf == "weight" and t.module not in heads
        ]
        if not targets:
            raise ValueError(
                f"prune_model: {type(model).__name__} has no Linear weight to calibrate "
                "besides its output head; expected a model with Linear layers"
            )

    def ties() -> None:
        for target in targets:
            mask = getattr(target.holder, mask_name(target.leaf.rpartition(".")[2]))
            for holder, leaf, _ in target.ties:
                custom_from_mask(holder, leaf, mask)

    oneshot(
        model,
        [(t.module, t.leaf) for t in targets],
        amount,
        method=method,
        pattern=pattern,
        scope=scope,
        calibration=calibration,
        sequential=sequential,
        loss=loss,
        progress=progress,
        then=ties,
        touched=list(model.modules()),
        reduce=reduce,
    )
    return report(model)


def _reducer(method: str, process_group: Any) -> Any:
    """The calibrated methods' reduction of statistics over `process_group`'s ranks."""
    if method not in CALIBRATED:
        raise ValueError(
            f"prune_model: process_group with method={method!r} and a pattern applies to "
            "scope='global' (pattern 'unstructured') only; each rank prunes its own "
            "tensors per layer"
        )
    from prunekit.distributed.group import group_of
    from prunekit.distributed.stats import all_reduce_statistics

    group = group_of(process_group, "prune_model")

    def reduce(statistics: dict[str, Any], weights: dict[str, float]) -> dict[str, Any]:
        return all_reduce_statistics(statistics, group, weight=weights)

    return reduce


def _output_heads(model: nn.Module) -> list[nn.Module]:
    """The output layer(s) users keep dense: the model's ``get_output_embeddings()`` (as
    Hugging Face models name their head), and Linears sharing an embedding's weight."""
    heads: list[nn.Module] = []
    getter = getattr(model, "get_output_embeddings", None)
    if callable(getter):
        found = getter()
        if isinstance(found, nn.Module):
            heads.append(found)
    embedded = {
        id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding | nn.EmbeddingBag)
    }
    heads += [m for m in model.modules() if isinstance(m, nn.Linear) and id(m.weight) in embedded]
    return heads


def _method(method: Any, scope: Any, amount: Any) -> tuple[Any, dict[str, Any]]:
    """The method class and its keyword arguments, after checking the three fit together."""
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(
            f"prune_model: invalid method={method!r}; expected one of "
            f"{', '.join([*METHODS, *CALIBRATED])}"
        )
    if not isinstance(scope, str) or scope not in SCOPES:
        raise ValueError(
            f"prune_model: invalid scope={scope!r}; expected 'layer' (each tensor) or "
            "'global' (all selected tensors ranked together)"
        )
    cls = METHODS[method]
    if cls is LnStructured and scope == "global":
        raise ValueError(
            "prune_model: method='ln' prunes whole channels of each tensor, so scope must be "
            "'layer'; for scope='global' use method 'l1' or 'random'"
        )
    kwargs: dict[str, Any] = {"amount": amount}
    if cls is LnStructured:
        kwargs.update(n=2, dim=0)
    try:
        cls(**kwargs)  # checks the amount before anything is looked at
    except (TypeError, ValueError) as error:
        raise type(error)(f"prune_model: {error}") from None
    return cls, kwargs


def _patterns(value: Any, what: str) -> tuple[str, ...]:
    """Globs as a tuple; a single str is one glob."""
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, Iterable) or not all(isinstance(p, str) for p in value):
        raise TypeError(
            f"prune_model: invalid {what}={value!r}; expected globs of parameter names "
            "(a str or a sequence of str), e.g. ('encoder.*',)"
        )
    return tuple(value)


def _targets(model: Any, include: tuple[str, ...], exclude: tuple[str, ...]) -> list[_Target]:
    """The selected parameters in the model's order, each once, with its other names.

    The globs see every name; a tied parameter must be selected under all its names or none.
    """
    if not is_module(model):
        raise TypeError(
            f"prune_model: invalid model of type {type(model).__name__}; "
            "expected an nn.Module of torch or tensorplay"
        )
    found: dict[int, _Target] = {}
    listed: list[Entry] = []
    for path, module in model.named_modules(remove_duplicate=False):
        for pname, param in module._parameters.items():
            if param is None:
                continue
            leaf = _unpruned_name(module, pname)
            name = f"{path}.{leaf}" if path else leaf
            first = found.get(id(param))
            if first is None:
                found[id(param)] = _locate(model, path, module, leaf, name, param)
            elif any(h is module and n == leaf for h, n, _ in first.holders()):
                first.aliases.append(name)  # a shared module, seen again under another path
            else:
                first.ties.append((module, leaf, name))
            listed.append(Entry(name, param))
    try:
        chosen = set(select_names(listed, () if include == ("*",) else include, exclude))
    except ValueError as error:
        raise ValueError(f"prune_model: {error} (in {type(model).__name__})") from None
    selected = []
    for target in found.values():
        # A shared module is one module under several paths: any of its names selects it.
        own = any(name in chosen for name in [target.name, *target.aliases])
        names = [target.name, *(name for _, _, name in target.ties)]
        hits = [own, *(name in chosen for _, _, name in target.ties)]
        if all(hits):
            selected.append(target)
        elif any(hits):
            picked = [n for n, hit in zip(names, hits, strict=True) if hit]
            raise ValueError(
                f"prune_model: {', '.join(map(repr, names))} are one Parameter (tied), but "
                f"include/exclude select only {picked}; "
                "expected globs that select all of its names or none"
            )
    return selected


def _unpruned_name(module: nn.Module, pname: str) -> str:
    """A parameter's name as the model sees it: ``weight`` for a pruned ``weight_orig``."""
    base = pruned_name(pname, ORIG)
    if base is not None and mask_name(base) in module._buffers:
        return base
    return pname


def _locate(
    model: nn.Module, path: str, module: nn.Module, leaf: str, name: str, param: Any
) -> _Target:
    """Where to install the pruning of ``module.<leaf>``: on the module itself, or, for a
    MultiheadAttention's out_proj, on the attention module with a dotted name."""
    parent_path, _, child = path.rpartition(".")
    if child == "out_proj" and path:
        parent = model.get_submodule(parent_path)
        if _reads_out_proj(parent) and parent._modules.get("out_proj") is module:
            return _Target(name, parent, f"out_proj.{leaf}", module, param)
    return _Target(name, module, leaf, module, param)


def _reads_out_proj(module: nn.Module) -> bool:
    return any(cls.__name__ == "MultiheadAttention" for cls in type(module).__mro__)
