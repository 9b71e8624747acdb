"""prune_model: prune a whole model by parameter names, in one call that fails as a whole.

It selects parameters with the one selector (targets.py: include/exclude globs, an
attention's out_proj, tied weights, the output head the calibrated methods leave dense),
checks its arguments once into a Config, prunes each target in one transaction (the
calibrated methods and patterns through the one-shot engine), masks a tied parameter
under every name, and returns the model's Report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from torch import nn

from prunekit.calibrate.layer_matrices import calibrates
from prunekit.core.errors import naming, type_error, value_error, warn_caller
from prunekit.core.transaction import transaction
from prunekit.distributed.agree import Collective, collective
from prunekit.distributed.stats import Reducer
from prunekit.dropin.calls import custom_from_mask, rank_together
from prunekit.dropin.torch_methods import LnStructured, Pruning
from prunekit.report import Report, check_countable, report
from prunekit.whole.config import Config, ModelOptions
from prunekit.whole.oneshot import run
from prunekit.whole.oneshot_execute import make_permanent
from prunekit.whole.oneshot_plan import Loss
from prunekit.whole.registry import CALIBRATED, check_calibration_options, check_method_scope
from prunekit.whole.targets import (
    ALL,
    Place,
    Target,
    globs,
    matches,
    output_heads,
    select_targets,
    unpruned_name,
)

if TYPE_CHECKING:  # Unpack is in typing from Python 3.11 on
    from typing_extensions import Unpack

__all__ = ["prune_model"]

OWNER = "prune_model"


def prune_model(
    model: nn.Module,
    amount: float | None = None,
    *,
    calibration: Iterable[object] | None = None,
    loss: Loss | None = None,
    process_group: object = None,
    keep_masks: bool = True,
    config: Config | None = None,
    **options: Unpack[ModelOptions],
) -> Report:
    """Prune the parameters of `model` selected by name; return ``report(model)``.

    Tensors pruned before are pruned further (their entries already pruned stay so). A tied
    parameter is ranked once and masked under each of its names: ``remove()`` each name to
    make it permanent (``'sparsegpt'`` refuses one: its update fits one layer's inputs).
    Every argument, tensor and batch is checked first; if anything fails, the model is left
    exactly as it was. What to prune and how is a ``prunekit.whole.Config``, which says what
    each option means.

    Args:
        model: the torch module to prune in place (masks installed as ``prune`` installs
            them: ``<name>_orig``, ``<name>_mask``).
        amount: the fraction to prune, in [0, 1] (``Config.amount``); None with `config`.
        calibration: the batches of the calibrated methods, for the model's forward
            (tensors, mappings of keyword arguments, or tuples of positional ones); None for
            the others.
        loss: for ``'taylor'``, the loss of ``loss(output, batch)`` whose gradients rank the
            entries; None: ``output.loss``.
        process_group: a torch.distributed group, or None. For ``'l1'`` and ``'random'``
            (scope ``'global'`` only) the ranks hold parts of the model, ranked as one (see
            ``prunekit.distributed``); for the calibrated methods every rank holds the whole
            model and calibrates on its own batches, and the statistics are reduced over the
            ranks, so every rank gets the masks (and SparseGPT's updates) of one process
            calibrating on all the batches. An error on any rank makes every rank raise it,
            each model left as it was (waits bounded: ``prunekit.distributed.TorchGroup``).
        keep_masks: True (the default) leaves the masks installed; False makes each
            tensor's pruning permanent (as ``prunekit.remove``), the one-shot methods layer
            by layer as they go, never holding the masks and original values of all layers.
        config: every option at once, a ``Config`` (then neither `amount` nor `**options`).
        **options: the other options of ``Config`` by name: `method` (default ``'l1'``),
            `pattern`, `scope`, `include`, `exclude`, `sequential`, `progress` (these two
            for the calibrated methods only: refused with the others, which ignore them;
            `sequential` refused with ``'taylor'`` too, which never goes block by block;
            refused alike in a `config`).

    Returns:
        The Report of the whole model after pruning.

    Raises:
        TypeError: an argument, glob, tensor or batch of the wrong type, or an unknown
            keyword, naming it (the model unchanged).
        ValueError: an argument, glob, tensor or batch out of range or matching nothing, or
            a `config` beside `amount` or keywords, or `calibration` or `loss` beside a
            method that uses no data, naming it (the model unchanged).
    """
    if not isinstance(keep_masks, bool):
        raise type_error(f"{OWNER}: invalid keep_masks={keep_masks!r}; expected True or False")
    if process_group is None:
        checked = _config(amount, config, options, ranks=False)
        return _prune(model, checked, calibration, loss, None, keep_masks)
    group = collective(process_group, OWNER)
    with group.telling():  # an error on this rank reaches the others at their next step
        checked = _config(amount, config, options, ranks=True)
        return _prune(model, checked, calibration, loss, group, keep_masks)


def _config(amount: float | None, config: object, options: ModelOptions, ranks: bool) -> Config:
    """The Config of a call: `config` alone (named for prune_model), or one made of `amount`
    and `options`."""
    unknown = [k for k in options if k not in ModelOptions.__optional_keys__]
    if unknown:  # as Python words it for a keyword the signature lacks
        raise TypeError(f"prune_model() got an unexpected keyword argument {unknown[0]!r}")
    if config is None:
        check_calibration_options(
            options.get("method", "l1"), options.get("sequential"), options.get("progress"), OWNER
        )
        if amount is None:
            raise type_error(
                f"{OWNER}: amount=None; expected the fraction to prune, a float in [0, 1], "
                "or config=prunekit.whole.Config(...)"
            )
        return Config(
            method=options.get("method", "l1"),
            amount=amount,
            pattern=options.get("pattern"),
            scope=options.get("scope", "layer"),
            include=globs(options.get("include", ALL), "include", OWNER),
            exclude=globs(options.get("exclude", ()), "exclude", OWNER),
            sequential=options.get("sequential"),
            progress=options.get("progress"),
            owner=OWNER,
            ranks=ranks,
        )
    if not isinstance(config, Config):
        raise type_error(
            f"{OWNER}: invalid config={config!r}; expected a prunekit.whole.Config, or None"
        )
    if amount is not None or options:
        given = ([f"amount={amount!r}"] if amount is not None else []) + [f"{k}=" for k in options]
        raise value_error(
            f"{OWNER}: config= holds every option, but {', '.join(given)} came beside it; "
            "expected config=dataclasses.replace(config, ...) or the keywords alone"
        )
    # a Config is made before its method is final (dataclasses.replace may change it), so
    # what its method would ignore is refused here, where it is used, as for the keywords
    check_calibration_options(config.method, config.sequential, config.progress, OWNER)
    return config.over_ranks(ranks, OWNER)  # sequential, if defaulted, defaulted for ranks


def _prune(
    model: nn.Module,
    config: Config,
    calibration: Iterable[object] | None,
    loss: Loss | None,
    group: Collective | None,
    keep_masks: bool = True,
) -> Report:
    """prune_model's work; with `group`, the steps of its protocol."""
    check_countable(model)  # the report it returns counts every tensor: before any change
    method = config.method
    arguments = {
        **config.compared(),
        "calibration given": calibration is not None,
        "loss given": loss is not None,
        "keep_masks": keep_masks,
    }
    if method in CALIBRATED or (method in ("l1", "random") and not config.plain):
        reduce = None
        if group is not None:
            reduce = _reducer(method, group, arguments)
        _oneshot(model, config, calibration, loss, reduce, keep_masks)
        return report(model)
    if calibration is not None or loss is not None:  # as the engine words it: never ignored
        raise value_error(
            f"{OWNER}: method={method!r} uses no calibration data; expected "
            f"calibration=None and loss=None (calibrated methods: {', '.join(CALIBRATED)})"
        )
    if not config.plain:
        raise value_error(
            f"{OWNER}: method={method!r} takes no pattern; expected pattern='unstructured' "
            f"(patterns: l1, random, {', '.join(CALIBRATED)})"
        )
    _prune_plain(model, config, group, arguments, keep_masks)
    return report(model)


def _prune_plain(
    model: nn.Module,
    config: Config,
    group: Collective | None,
    arguments: dict[str, object],
    keep_masks: bool,
) -> None:
    """The methods without data ('l1', 'random', 'ln'), on every tensor selected, in one
    transaction."""
    pruning, kwargs = _plain_method(config, group)
    targets = select_targets(model, config.include, config.exclude, OWNER)
    if group is not None:
        group.start(OWNER, arguments)
    with transaction(model) as recorded:
        if config.scope == "global":
            pairs = [(t.first.module, t.first.leaf) for t in targets]
            paths = {m: p for p, m in model.named_modules()}  # errors name '1.weight'
            rank_together(pairs, pruning, None, kwargs, paths, OWNER)
        else:
            for target in targets:
                with naming(repr(target.name)):  # errors name the path: '1.weight'
                    pruning.apply(target.first.module, target.first.leaf, **kwargs)
        if keep_masks:
            _mask_ties(targets)
        else:  # a tied name holds the same Parameter, made permanent once
            make_permanent([(t.first.module, t.first.leaf) for t in targets], recorded)
        if group is not None:
            group.finish()  # a rank failing since the last step: every rank undoes


def _plain_method(config: Config, group: Collective | None) -> tuple[type[Pruning], dict[str, Any]]:
    """The registry's pruning method of `config` and the keyword arguments of its apply."""
    pruning = config.entry.pruning
    assert pruning is not None  # l1, random, ln: the registry's methods without data
    check_method_scope(config.method, config.scope, OWNER)
    kwargs: dict[str, Any] = {"amount": config.amount}
    if pruning is LnStructured:
        kwargs.update(n=config.norm, dim=config.axis)
    if group is not None:
        if config.scope != "global":
            raise value_error(
                f"{OWNER}: process_group applies to scope='global', not {config.scope!r}; "
                "each rank prunes its own tensors in scope 'layer'"
            )
        kwargs["process_group"] = group
    return pruning, kwargs


def _mask_ties(targets: Sequence[Target]) -> None:
    """Mask each tied name of a target as its first name is masked."""
    for target in targets:
        mask = target.first.mask()
        assert mask is not None
        for place in target.ties:
            custom_from_mask(place.holder, place.own, mask)


def _oneshot(
    model: nn.Module,
    config: Config,
    calibration: Iterable[object] | None,
    loss: Loss | None,
    reduce: Reducer | None,
    keep_masks: bool = True,
) -> None:
    """Calibrated methods and patterns: the one-shot engine on the selected tensors."""
    natural = None
    if config.method in CALIBRATED:
        heads = output_heads(model)
        if config.include == ALL and not any(
            calibrates(m, unpruned_name(m, n)) and m not in heads  # weight_orig: weight
            for m in model.modules()
            for n, _ in m.named_parameters(recurse=False)
        ):
            raise value_error(
                f"{OWNER}: {type(model).__name__} has no weight matrix to calibrate "
                "besides its output head; expected a model with Linear layers"
            )
        natural = _calibrated(heads)
    targets = select_targets(model, config.include, config.exclude, OWNER, natural)
    if config.method == "sparsegpt":
        _refuse_tied_updates(model, targets)
    run(
        model,
        [(t.first.module, t.first.leaf) for t in targets],
        config,
        calibration,
        loss,
        then=(lambda: _mask_ties(targets)) if keep_masks else None,
        reduce=reduce,
        keep_masks=keep_masks,
    )
    if config.method in CALIBRATED and config.include == ALL:
        _tell_fused(model, config)


def _refuse_tied_updates(model: nn.Module, targets: Sequence[Target]) -> None:
    """Refuse SparseGPT on a Parameter tied across layers: its update keeps the first
    layer's output on that layer's inputs, and moves the others' (which read other inputs)
    unchecked, worse than the same masks without an update."""
    paths = {m: p for p, m in model.named_modules()}
    for target in targets:
        if not target.ties:
            continue
        names = [f"{paths[p.holder]}.{p.own}".lstrip(".") for p in target.places]
        raise value_error(
            f"{OWNER}: method='sparsegpt' updates the weights it keeps so that one layer's "
            f"output on its own inputs changes least, but {', '.join(map(repr, names))} are "
            "one Parameter (tied), read by layers with other inputs, whose outputs the "
            f"update would move unchecked; expected exclude={names!r} (pruned by another "
            "call), or method='wanda' (masks only, no update)"
        )


def _tell_fused(model: nn.Module, config: Config) -> None:
    """Warn once, naming them, of the floating-point Parameters of 3 dims (fused experts:
    one matrix per expert along the first dim) that the calibrated methods, which prune
    Linear weights only, left dense, `config.exclude` aside; a 1-D convolution's weight is
    no such tensor."""
    found, seen = [], set()
    for path, module in model.named_modules():
        if isinstance(module, nn.Conv1d | nn.ConvTranspose1d):
            continue
        for leaf, param in module.named_parameters(recurse=False):
            if id(param) in seen or param.dim() != 3 or not param.is_floating_point():
                continue
            seen.add(id(param))
            name = f"{path}.{unpruned_name(module, leaf)}" if path else unpruned_name(module, leaf)
            if not any(matches(name, glob) for glob in config.exclude):
                found.append(name)
    if not found:
        return
    shown = ", ".join(repr(n) for n in found[:8]) + (
        f", ... ({len(found)} in all)" if len(found) > 8 else ""
    )
    warn_caller(
        f"{OWNER}: method={config.method!r} prunes Linear weights only, and left dense the "
        f"weights of 3 dims (fused experts, one matrix per expert): {shown}; prune them by "
        "magnitude with prune_model(model, amount, method='l1', include=[their names]), "
        "remove whole experts with prune_channels, or leave them out with exclude to "
        "silence this"
    )


def _calibrated(heads: list[nn.Module]) -> Callable[[Place], bool]:
    """The calibrated methods' own targets: weight matrices of the layers they handle,
    the output head aside."""

    def natural(place: Place) -> bool:
        return calibrates(place.module, place.leaf) and place.holder not in heads

    return natural


def _reducer(method: str, group: Collective, arguments: dict[str, object]) -> Reducer:
    """The calibrated methods' reduction of statistics over `group`'s ranks; `arguments`
    are compared once the engine has checked them."""
    if method not in CALIBRATED:
        raise value_error(
            f"{OWNER}: process_group with method={method!r} and a pattern applies to "
            "scope='global' (pattern 'unstructured') only; each rank prunes its own "
            "tensors per layer"
        )
    return Reducer(group, OWNER, arguments)
