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
from prunekit.core.errors import naming, type_error, value_error, with_context
from prunekit.core.naming import ORIG, Entry, mask_name, pruned_name
from prunekit.core.transaction import transaction
from prunekit.functional import custom_from_mask, global_unstructured
from prunekit.io.statedict import select_names
from prunekit.methods import LnStructured
from prunekit.oneshot import calibrates, default_pattern, oneshot
from prunekit.report import Report, report
from prunekit.whole.registry import CALIBRATED, METHODS, OFFLINE, SCOPES, check_scope, find

__all__ = ["SCOPES", "prune_model"]


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
    all the batches. The ranks compare their arguments once each has checked its own,
    and an error on any rank makes every rank raise the same error, each model left as
    it was (see prunekit/distributed/agree.py); no rank waits for the others longer than
    the group's timeout (prunekit.distributed.TorchGroup). Every argument, tensor and
    batch is checked first; if anything fails, the model is left exactly as it was.
    """
    arguments = {
        "method": method,
        "amount": amount,
        "pattern": pattern,
        "scope": scope,
        "include": include,
        "exclude": exclude,
        "sequential": sequential,
        "calibration given": calibration is not None,
        "loss given": loss is not None,
    }
    if process_group is None:
        return _prune(model, calibration, loss, progress, None, arguments)
    from prunekit.distributed.agree import collective

    group = collective(process_group, "prune_model")
    with group.telling():  # an error on this rank reaches the others at their next step
        return _prune(model, calibration, loss, progress, group, arguments)


def _prune(
    model: nn.Module,
    calibration: Any,
    loss: Any,
    progress: Any,
    group: Any,
    arguments: dict[str, Any],
) -> Report:
    """prune_model's work; with `group` (an agree.Collective), the steps of its protocol."""
    method, amount, pattern = arguments["method"], arguments["amount"], arguments["pattern"]
    scope, include, exclude = arguments["scope"], arguments["include"], arguments["exclude"]
    sequential = arguments["sequential"]
    if pattern is None:
        pattern = default_pattern(method, scope)
    if method in CALIBRATED or (method in ("l1", "random") and not _plain(pattern)):
        reduce = None
        if group is not None:
            reduce = _reducer(method, group, arguments)
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
        raise value_error(
            f"prune_model: method={method!r} takes no pattern and no calibration; expected "
            f"pattern='unstructured', calibration=None (patterns: l1, random, {CALIBRATED})"
        )
    cls, kwargs = _method(method, scope, amount)
    if group is not None:
        if scope != "global":
            raise value_error(
                f"prune_model: process_group applies to scope='global', not {scope!r}; each "
                "rank prunes its own tensors in scope 'layer'"
            )
        kwargs["process_group"] = group
    targets = _targets(model, _patterns(include, "include"), _patterns(exclude, "exclude"))
    if group is not None:
        group.start("prune_model", arguments)
    with transaction(model):
        if scope == "global":
            global_unstructured([(t.module, t.leaf) for t in targets], cls, **kwargs)
        else:
            for target in targets:
                with naming(repr(target.name)):  # errors name the path: '1.weight'
                    cls.apply(target.module, target.leaf, **kwargs)
        for target in targets:
            mask = getattr(target.holder, mask_name(target.leaf.rpartition(".")[2]))
            for holder, leaf, _ in target.ties:
                custom_from_mask(holder, leaf, mask)
        if group is not None:
            group.finish()  # a rank failing since the last step: every rank undoes
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
    natural = None
    if method in CALIBRATED:
        heads = _output_heads(model)
        if includes == ("*",) and not any(
            calibrates(m, n.rpartition(".")[2]) and m not in heads
            for m in model.modules()
            for n, _ in m.named_parameters(recurse=False)
        ):
            raise value_error(
                f"prune_model: {type(model).__name__} has no weight matrix to calibrate "
                "besides its output head; expected a model with Linear layers"
            )
        natural = _calibrated(heads)
    targets = _targets(model, includes, _patterns(exclude, "exclude"), natural)

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
        reduce=reduce,
    )
    return report(model)


def _calibrated(heads: list[nn.Module]) -> Callable[[_Target], bool]:
    """The calibrated methods' own targets: weight matrices of the layers they handle,
    the output head aside."""

    def natural(target: _Target) -> bool:
        return calibrates(target.module, target.leaf) and target.holder not in heads

    return natural


def _reducer(method: str, group: Any, arguments: dict[str, Any]) -> Any:
    """The calibrated methods' reduction of statistics over `group`'s ranks; `arguments`
    are compared once oneshot has checked them."""
    if method not in CALIBRATED:
        raise value_error(
            f"prune_model: process_group with method={method!r} and a pattern applies to "
            "scope='global' (pattern 'unstructured') only; each rank prunes its own "
            "tensors per layer"
        )
    from prunekit.distributed.stats import Reducer

    return Reducer(group, "prune_model", arguments)


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
    found = find(method, OFFLINE)
    if found is None or found.pruning is None:
        raise value_error(
            f"prune_model: invalid method={method!r}; expected one of {', '.join(METHODS)}"
        )
    check_scope(scope, "prune_model")
    cls = found.pruning
    if scope not in found.scopes:
        raise value_error(
            "prune_model: method='ln' prunes whole channels of each tensor, so scope must be "
            "'layer'; for scope='global' use method 'l1' or 'random'"
        )
    kwargs: dict[str, Any] = {"amount": amount}
    if cls is LnStructured:
        kwargs.update(n=2, dim=0)
    try:
        cls(**kwargs)  # checks the amount before anything is looked at
    except (TypeError, ValueError) as error:
        raise with_context(error, "prune_model") from None
    return cls, kwargs


def _patterns(value: Any, what: str) -> tuple[str, ...]:
    """Globs as a tuple; a single str is one glob."""
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, Iterable) or not all(isinstance(p, str) for p in value):
        raise type_error(
            f"prune_model: invalid {what}={value!r}; expected globs of parameter names "
            "(a str or a sequence of str), e.g. ('encoder.*',)"
        )
    return tuple(value)


def _targets(
    model: Any,
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    natural: Callable[[_Target], bool] | None = None,
) -> list[_Target]:
    """The selected parameters in the model's order, each once, with its other names.

    `natural` tells the method's own targets, those `include` globs narrow (default: the
    floating-point tensors of two or more dims); see io.statedict.select_names. The globs
    see every name; a tied parameter must be selected under all its names or none.
    """
    if not is_module(model):
        raise type_error(
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
    named = None
    if natural is not None:
        named = [
            name
            for t in found.values()
            if natural(t)
            for name in [t.name, *t.aliases, *(n for _, _, n in t.ties)]
        ]
    try:
        chosen = set(select_names(listed, () if include == ("*",) else include, exclude, named))
    except ValueError as error:
        raise value_error(f"prune_model: {error} (in {type(model).__name__})") from None
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
            raise value_error(
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
