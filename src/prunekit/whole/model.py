"""prune_model: prune a whole model by parameter names, in one call that fails as a whole.

It selects parameters with the one selector (targets.py: include/exclude globs, an
attention's out_proj, tied weights, the output head the calibrated methods leave dense),
checks its arguments once into a Config, prunes each target in one transaction (the
calibrated methods and patterns through the one-shot engine), masks a tied parameter
under every name, and returns the model's Report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from torch import nn

from prunekit.calibrate.layer_matrices import calibrates
from prunekit.core.errors import naming, type_error, value_error
from prunekit.core.transaction import transaction
from prunekit.distributed.agree import collective
from prunekit.distributed.stats import Reducer
from prunekit.dropin.calls import custom_from_mask, rank_together
from prunekit.dropin.torch_methods import LnStructured
from prunekit.report import Report, report
from prunekit.whole.config import Config
from prunekit.whole.oneshot import run
from prunekit.whole.oneshot_execute import make_permanent
from prunekit.whole.oneshot_plan import Loss
from prunekit.whole.registry import CALIBRATED
from prunekit.whole.targets import (
    ALL,
    Place,
    Target,
    globs,
    output_heads,
    select_targets,
    unpruned_name,
)

__all__ = ["prune_model"]

OWNER = "prune_model"


def prune_model(
    model: nn.Module,
    amount: float,
    *,
    method: str = "l1",
    pattern: Any = None,
    scope: str = "layer",
    calibration: Iterable[Any] | None = None,
    include: Sequence[str] | str = ALL,
    exclude: Sequence[str] | str = (),
    process_group: Any = None,
    sequential: bool | str | None = None,
    loss: Callable[[Any, Any], Any] | None = None,
    progress: bool | None = None,
    keep_masks: bool = True,
) -> Report:
    """Prune the parameters of `model` selected by name; return ``report(model)``.

    Tensors pruned before are pruned further (their entries already pruned stay so). A tied
    parameter is ranked once and masked under each of its names: ``remove()`` each name to
    make it permanent. Every argument, tensor and batch is checked first; if anything fails,
    the model is left exactly as it was.

    Args:
        model: the torch module to prune in place (masks installed as ``prune`` installs
            them: ``<name>_orig``, ``<name>_mask``).
        amount: the fraction to prune, in [0, 1], of each tensor (scope ``'layer'``) or of
            all of them together (``'global'``); for ``'N:M'`` it must be (M-N)/M.
        method: ``'l1'`` (smallest magnitudes), ``'random'``, ``'ln'`` (whole output
            channels, dim 0, by their L2 norm; layer scope only), or, from `calibration`:
            ``'wanda'`` (|W| x the L2 norm of each input feature), ``'sparsegpt'`` (OBS,
            with updates of the weights left, written into ``<name>_orig``), ``'taylor'``
            (|W x grad| summed over the batches of `loss`); the names are
            ``prunekit.whole.registry``'s.
        pattern: ``'unstructured'``, ``'row'`` (the same share of each output row),
            ``'N:M'`` (``'2:4'``, ``'4:8'``: keep N of every M along the input dim) or a
            ``prunekit.Pattern``. None (the default): ``'row'`` for ``'wanda'`` in scope
            ``'layer'`` (as Wanda's paper ranks; whole-layer ranking is clearly worse on
            LLMs), ``'unstructured'`` otherwise.
        scope: ``'layer'`` prunes `amount` of each tensor, ``'global'`` `amount` of all the
            selected tensors ranked together (unstructured only).
        calibration: the batches of the calibrated methods, for the model's forward
            (tensors, mappings of keyword arguments, or tuples of positional ones); None for
            the others.
        include: globs of parameter names, as the CLI's. The default ``('*',)`` takes every
            floating-point parameter of two or more dims (weights, not biases or norms), and
            for the calibrated methods every Linear weight but the output head
            (``get_output_embeddings()``, or a Linear sharing an embedding's weight); any
            other `include` selects by name, any number of dims.
        exclude: globs of parameter names left alone.
        process_group: a torch.distributed group, or None. For ``'l1'`` and ``'random'``
            (scope ``'global'`` only) the ranks hold parts of the model, ranked as one (see
            ``prunekit.distributed``); for the calibrated methods every rank holds the whole
            model and calibrates on its own batches, and the statistics (Taylor:
            saliencies) are reduced over the ranks, so every rank gets the masks (and
            SparseGPT's updates) of one process calibrating on all the batches. An error on
            any rank makes every rank raise it, each model left as it was; no rank waits for
            the others longer than the group's timeout (``prunekit.distributed.TorchGroup``).
        sequential: True calibrates block by block, each on the outputs of the pruned blocks
            before it (one block's statistics in memory). ``'layers'``: in each block too,
            its layers group by group in the order the block calls them (query, key and
            value; the attention's output; gate and up; down), each on the outputs of the
            groups pruned before it, as SparseGPT's paper prunes (each layer runs about once
            a batch, where True runs each block twice; as True for a model without blocks).
            False: one pass of the whole model. None (the default): ``'layers'`` for
            ``'sparsegpt'`` without `process_group` (the better scores on SmolLM2-135M and
            all-MiniLM-L6-v2, see benchmarks/vs_llmcompressor.py), True otherwise.
        loss: for ``'taylor'``, the loss of ``loss(output, batch)`` whose gradients rank the
            entries; None: ``output.loss``.
        progress: a bar on stderr for calibrated runs; None (the default): when stderr is a
            terminal.
        keep_masks: True (the default) leaves the masks installed; False makes each
            tensor's pruning permanent (as ``prunekit.remove``), the one-shot methods layer
            by layer as they go: the model ends with its plain weights, zeros where pruned,
            and never holds the masks and the original values of all its layers at once.

    Returns:
        The Report of the whole model after pruning.

    Raises:
        TypeError: an argument, glob, tensor or batch of the wrong type, naming it (the model
            unchanged).
        ValueError: an argument, glob, tensor or batch out of range or matching nothing,
            naming it (the model unchanged).
    """

    def checked() -> Config:
        return Config(
            method=method,
            amount=amount,
            pattern=pattern,
            scope=scope,
            include=globs(include, "include", OWNER),
            exclude=globs(exclude, "exclude", OWNER),
            sequential=sequential,
            progress=progress,
            owner=OWNER,
            ranks=process_group is not None,
        )

    if not isinstance(keep_masks, bool):
        raise type_error(f"{OWNER}: invalid keep_masks={keep_masks!r}; expected True or False")
    if process_group is None:
        return _prune(model, checked(), calibration, loss, None, keep_masks)
    group = collective(process_group, OWNER)
    with group.telling():  # an error on this rank reaches the others at their next step
        return _prune(model, checked(), calibration, loss, group, keep_masks)


def _prune(
    model: nn.Module,
    config: Config,
    calibration: Any,
    loss: Loss | None,
    group: Any,
    keep_masks: bool = True,
) -> Report:
    """prune_model's work; with `group` (an agree.Collective), the steps of its protocol."""
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
    if not config.plain or calibration is not None:
        raise value_error(
            f"{OWNER}: method={method!r} takes no pattern and no calibration; expected "
            f"pattern='unstructured', calibration=None (patterns: l1, random, {CALIBRATED})"
        )
    pruning = config.entry.pruning
    assert pruning is not None  # l1, random, ln: the registry's methods without data
    if config.scope not in config.entry.scopes:
        raise value_error(
            f"{OWNER}: method={method!r} prunes whole channels of each tensor, so scope must "
            "be 'layer'; for scope='global' use method 'l1' or 'random'"
        )
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
    return report(model)


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
    calibration: Any,
    loss: Loss | None,
    reduce: Any,
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


def _calibrated(heads: list[nn.Module]) -> Callable[[Place], bool]:
    """The calibrated methods' own targets: weight matrices of the layers they handle,
    the output head aside."""

    def natural(place: Place) -> bool:
        return calibrates(place.module, place.leaf) and place.holder not in heads

    return natural


def _reducer(method: str, group: Any, arguments: dict[str, Any]) -> Any:
    """The calibrated methods' reduction of statistics over `group`'s ranks; `arguments`
    are compared once the engine has checked them."""
    if method not in CALIBRATED:
        raise value_error(
            f"{OWNER}: process_group with method={method!r} and a pattern applies to "
            "scope='global' (pattern 'unstructured') only; each rank prunes its own "
            "tensors per layer"
        )
    return Reducer(group, OWNER, arguments)
