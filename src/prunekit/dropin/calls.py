"""The functional API: one call per method, global pruning, remove() and is_pruned()."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import torch
import torch.nn.utils.prune as torch_prune
from torch import Tensor, nn

from prunekit.core.backend import common_namespace, namespace
from prunekit.core.checks import check_finite, check_scores, owner_of, prunable_parameter
from prunekit.core.errors import (
    attribute_error,
    describe,
    naming,
    type_error,
    value_error,
)
from prunekit.core.naming import mask_name, orig_name
from prunekit.core.product import fusable
from prunekit.core.transaction import transaction
from prunekit.dropin.across_ranks import rank_across
from prunekit.dropin.base_method import (
    PRUNING_TYPES,
    BasePruningMethod,
    PruningContainer,
    construct,
)
from prunekit.dropin.hooks import find_pruning_hook, pruning_hooks, torch_pruned
from prunekit.dropin.install import current_values, drop_refresh, forget_load_refresh, install
from prunekit.dropin.torch_methods import (
    CustomFromMask,
    Identity,
    L1Unstructured,
    LnStructured,
    Pruning,
    RandomStructured,
    RandomUnstructured,
)

__all__ = [
    "custom_from_mask",
    "forward_reuse",
    "global_unstructured",
    "identity",
    "is_pruned",
    "l1_unstructured",
    "ln_structured",
    "random_structured",
    "random_unstructured",
    "remove",
]

M = TypeVar("M", bound=nn.Module)


def identity(module: M, name: str) -> M:
    """Install the reparameterization on ``module.<name>`` without pruning anything.

    Args:
        module: the module holding the parameter.
        name: the parameter's name (``"weight"``, or dotted: ``"attn.out_proj.weight"``).

    Returns:
        `module`, with ``<name>_orig``, ``<name>_mask`` (all ones) and the hook.

    Raises:
        TypeError: `module` is not a module, ``module.<name>`` is not a floating-point
            Parameter (a buffer, say), or an argument has the wrong type.
        AttributeError: `module` has no parameter `name` (a dotted name reaches a
            submodule's).
        ValueError: a bad value; the message names the module, the parameter, the value and what
            is allowed. The module is then left exactly as it was.
    """
    Identity.apply(module, name)
    return module


def random_unstructured(module: M, name: str, amount: float) -> M:
    """Prune `amount` entries of ``module.<name>`` chosen at random.

    Args:
        module: the module holding the parameter.
        name: the parameter's name.
        amount: a fraction in [0, 1] of the entries still unpruned, or a count.

    Returns:
        `module`, pruned.

    Raises:
        TypeError: `module` is not a module, ``module.<name>`` is not a floating-point
            Parameter (a buffer, say), or an argument has the wrong type.
        AttributeError: `module` has no parameter `name` (a dotted name reaches a
            submodule's).
        ValueError: a bad value (an amount out of range, a count above the entries left); the
            message names the module, the parameter, the value and what is allowed. The module is
            then left exactly as it was.
    """
    RandomUnstructured.apply(module, name, amount)
    return module


def l1_unstructured(
    module: M, name: str, amount: float, importance_scores: Tensor | None = None
) -> M:
    """Prune the `amount` entries of ``module.<name>`` with the smallest absolute score.

    Args:
        module: the module holding the parameter.
        name: the parameter's name.
        amount: a fraction in [0, 1] of the entries still unpruned, or a count.
        importance_scores: scores shaped like the parameter that rank its entries instead
            of its values.

    Returns:
        `module`, pruned.

    Raises:
        TypeError: `module` is not a module, ``module.<name>`` is not a floating-point
            Parameter (a buffer, say), or an argument has the wrong type.
        AttributeError: `module` has no parameter `name` (a dotted name reaches a
            submodule's).
        ValueError: a bad value (an amount out of range, a count above the entries left, scores
            of another shape or not finite); the message names the module, the parameter, the value
            and what is allowed. The module is then left exactly as it was.
    """
    L1Unstructured.apply(module, name, amount, importance_scores=importance_scores)
    return module


def random_structured(module: M, name: str, amount: float, dim: int) -> M:
    """Prune `amount` random channels of ``module.<name>`` along `dim`.

    Args:
        module: the module holding the parameter.
        name: the parameter's name.
        amount: a fraction in [0, 1] of the channels not yet fully pruned, or a count.
        dim: the axis whose slices are the channels (0: output channels).

    Returns:
        `module`, pruned.

    Raises:
        TypeError: `module` is not a module, ``module.<name>`` is not a floating-point
            Parameter (a buffer, say), or an argument has the wrong type.
        AttributeError: `module` has no parameter `name` (a dotted name reaches a
            submodule's).
        ValueError: a bad value (an amount out of range, a count above the channels left); the
            message names the module, the parameter, the value and what is allowed. The module is
            then left exactly as it was.
        IndexError: `dim` is not an axis of the tensor.
    """
    RandomStructured.apply(module, name, amount, dim)
    return module


def ln_structured(
    module: M,
    name: str,
    amount: float,
    n: float | str,
    dim: int,
    importance_scores: Tensor | None = None,
) -> M:
    """Prune the `amount` channels of ``module.<name>`` along `dim` with the smallest L`n` norm.

    Args:
        module: the module holding the parameter.
        name: the parameter's name.
        amount: a fraction in [0, 1] of the channels not yet fully pruned, or a count.
        n: the norm's order: a positive number, ``inf``, ``-inf``, ``'fro'`` or ``'nuc'``.
        dim: the axis whose slices are the channels (0: output channels).
        importance_scores: scores shaped like the parameter whose norms rank the channels.

    Returns:
        `module`, pruned.

    Raises:
        TypeError: `module` is not a module, ``module.<name>`` is not a floating-point
            Parameter (a buffer, say), or an argument has the wrong type.
        AttributeError: `module` has no parameter `name` (a dotted name reaches a
            submodule's).
        ValueError: a bad value (an amount out of range, a count above the channels left, a norm
            order not listed above); the message names the module, the parameter, the value and what
            is allowed. The module is then left exactly as it was.
        IndexError: `dim` is not an axis of the tensor.
    """
    LnStructured.apply(module, name, amount, n, dim, importance_scores=importance_scores)
    return module


def custom_from_mask(module: M, name: str, mask: Tensor) -> M:
    """Prune ``module.<name>`` where `mask` is 0.

    Args:
        module: the module holding the parameter.
        name: the parameter's name.
        mask: 0s and 1s shaped like the parameter; composed with any earlier mask.

    Returns:
        `module`, pruned.

    Raises:
        TypeError: `module` is not a module, ``module.<name>`` is not a floating-point
            Parameter (a buffer, say), or an argument has the wrong type.
        AttributeError: `module` has no parameter `name` (a dotted name reaches a
            submodule's).
        ValueError: a bad value (a mask of another shape, or holding other values than 0 and 1);
            the message names the module, the parameter, the value and what is allowed. The module
            is then left exactly as it was.
    """
    CustomFromMask.apply(module, name, mask)
    return module


def remove(module: M, name: str) -> M:
    """Make the pruning of ``module.<name>`` permanent and drop its hook.

    The Parameter gets mask * orig (zeros included); ``<name>_orig``, ``<name>_mask`` and
    the hook go.

    Args:
        module: the module holding the pruned parameter.
        name: the parameter's name (dotted names reach a submodule's).

    Returns:
        `module`.

    A tensor pruned by torch.nn.utils.prune itself is made permanent by its ``remove``.

    Raises:
        ValueError: ``module.<name>`` is not pruned (the message lists the tensors that are).
        AttributeError: `name` does not lead to a submodule of `module`.
    """
    owner, leaf = owner_of(module, name)
    key, hook = find_pruning_hook(owner, leaf)
    if hook is None and leaf in torch_pruned(owner):
        torch_remove: Any = torch_prune.remove  # untyped in torch
        torch_remove(owner, leaf)
        return module
    if hook is None:
        pruned = sorted(h._tensor_name for h in pruning_hooks(owner) if h._tensor_name is not None)
        raise value_error(
            f"{describe(module, name)} is not pruned, so there is nothing to remove; "
            f"expected one of the pruned tensors of this module: {pruned}"
        )
    hook.remove(owner)
    del owner._forward_pre_hooks[key]
    forget_load_refresh(owner)
    if owner is not module:
        drop_refresh(module, name)
    return module


def is_pruned(module: nn.Module) -> bool:
    """Whether `module` or any submodule carries a pruning hook (prunekit's, or
    torch.nn.utils.prune's own).

    Args:
        module: any module.

    Returns:
        True if a pruning hook is installed anywhere in `module`.
    """
    return any(pruning_hooks(sub) or torch_pruned(sub) for sub in module.modules())


def global_unstructured(
    parameters: Iterable[tuple[nn.Module, str]],
    pruning_method: type[BasePruningMethod],
    importance_scores: dict[tuple[nn.Module, str], Tensor] | None = None,
    **kwargs: object,
) -> None:
    """Prune the listed tensors jointly: `amount` (in kwargs) counts over all of them.

    `pruning_method` must be an unstructured method class. Entries pruned
    before stay pruned, and a fractional amount is a fraction of the entries
    still unpruned across all tensors. Each tensor gets its share through
    CustomFromMask, composed with any earlier pruning. Every tensor is checked
    before any is pruned; if one fails, none is.

    ``process_group=`` (a torch.distributed group, in kwargs so the signature stays
    torch's) ranks the tensors every rank of the group lists as one model: see
    prunekit.dropin.across_ranks.global_unstructured.

    Args:
        parameters: ``(module, name)`` pairs of the tensors to rank together.
        pruning_method: an unstructured method class (``L1Unstructured``,
            ``RandomUnstructured``, ``Pruning``, or your own).
        importance_scores: scores per pair, shaped like its tensor, ranked instead of its
            values.
        **kwargs: the method's arguments (``amount=``, ``criterion=`` for ``Pruning``), and
            ``process_group=``.

    Raises:
        TypeError: `pruning_method` is not an unstructured method class, or a pair does not
            name a floating-point Parameter.
        ValueError: a bad amount, a tensor listed twice or tied to another listed one,
            scores of the wrong shape; nothing is pruned.
    """
    rank_together(parameters, pruning_method, importance_scores, kwargs)


def rank_together(
    parameters: Iterable[tuple[nn.Module, str]],
    pruning_method: type[BasePruningMethod],
    importance_scores: dict[tuple[nn.Module, str], Tensor] | None,
    kwargs: dict[str, Any],
    paths: Mapping[nn.Module, str] | None = None,
    caller: str = "global_unstructured",
) -> None:
    """global_unstructured's work, for prunekit's whole-model calls too: with `paths` (each
    module's path in the model), an error about one tensor names it by its path
    (``'a.weight', parameter 'weight' of Linear``, see describe), as their per-layer scope
    does. Errors start with `caller`, the function the user called, across ranks
    (``process_group=``) too."""
    if kwargs.get("process_group") is not None:
        rest = {k: v for k, v in kwargs.items() if k != "process_group"}
        group = kwargs["process_group"]
        rank_across(parameters, pruning_method, importance_scores, group, rest, caller, paths)
        return
    kwargs.pop("process_group", None)
    if not isinstance(parameters, Iterable):
        raise type_error(
            f"{caller}: invalid parameters of type {type(parameters).__name__}; "
            "expected an iterable of (module, name) pairs"
        )
    params = list(parameters)
    importance_scores = _scores_given(importance_scores, caller)
    method = _global_method(pruning_method, kwargs, caller)
    if not params:
        return
    scores, masks, dtypes, wheres = _global_targets(params, importance_scores, paths or {}, caller)
    targets = [owner_of(module, name) for module, name in params]
    # Kept entries as 1s of the parameters' dtype: they become the mask buffers as they are.
    keep_dtype = dtypes[0] if len(set(dtypes)) == 1 else None
    products = _products(method, params, scores, masks, importance_scores, keep_dtype)
    with naming(caller):
        kept = method._choose(
            scores,
            masks,
            keep_dtype=keep_dtype,
            products=[None if p is None else p.view(-1) for p in products]
            if any(p is not None for p in products)
            else None,
            targets=targets,
        )
        if kept is None:
            products = [None] * len(products)
            if isinstance(method, Pruning) and method._own_mask():
                _name_nonfinite(method, scores, masks, wheres, targets)
            methods = [CustomFromMask(k) for k in _global_generic(method, scores, masks)]
        else:
            # One tensor at a time: the model is never concatenated nor copied.
            methods = [
                CustomFromMask._trusted((k if keep_dtype else ~k).reshape(t.shape))
                for k, t in zip(kept, scores, strict=True)
            ]
    del scores, masks, kept
    touched = [m for module, name in params for m in (module, owner_of(module, name)[0])]
    with transaction(touched):
        for (module, name), share, product in zip(params, methods, products, strict=True):
            install(module, name, share, masked=product)


def _scores_given(
    importance_scores: dict[tuple[nn.Module, str], Tensor] | None, caller: str
) -> dict[tuple[nn.Module, str], Tensor]:
    """The importance scores given (None: none), checked to be a dict."""
    if importance_scores is None:
        return {}
    if not isinstance(importance_scores, dict):
        raise type_error(
            f"{caller}: invalid importance_scores of type "
            f"{type(importance_scores).__name__}; expected a dict keyed by (module, name)"
        )
    return importance_scores


def _name_nonfinite(
    method: Pruning,
    scores: list[Tensor],
    masks: list[Tensor | None],
    wheres: list[str],
    targets: list[tuple[nn.Module, str]],
) -> None:
    """The method found NaN or infinity (its one check) in the criterion's scores: name the
    tensor that holds it (its values may be finite: Wanda's, Taylor's)."""
    criterion = method.criterion
    for ranked, mask, where, target in zip(scores, masks, wheres, targets, strict=True):
        if not criterion._values_are_scores:
            ranked = criterion._checked_scores(ranked, target)
        if mask is not None:  # pruned entries do not compete: never ranked
            ns = namespace(ranked)
            ranked = ns.where(mask == 1, ranked, ns.zeros_like(ranked))
        check_finite(ranked, where, "scores")


def _products(
    method: BasePruningMethod,
    params: list[tuple[nn.Module, str]],
    scores: list[Tensor],
    masks: list[Tensor | None],
    importance_scores: dict[tuple[nn.Module, str], Tensor],
    keep_dtype: Any,
) -> list[Tensor | None]:
    """Where the method can write module.<name> (mask * orig) in its pass, room for it:
    tensors pruned for the first time, ranked by their own values."""
    if not method._fuses_products() or keep_dtype is None:
        return [None] * len(params)
    return [
        torch.empty(t.shape, dtype=keep_dtype)
        if mask is None and pair not in importance_scores and fusable(t, keep_dtype)
        else None
        for t, mask, pair in zip(scores, masks, params, strict=True)
    ]


def _global_generic(
    method: BasePruningMethod, scores: list[Tensor], masks: list[Tensor | None]
) -> list[Tensor]:
    """Rank all tensors as one concatenated vector through a PruningContainer.

    The path of user-defined methods, which only know how to rank one tensor.
    """
    ns = namespace(scores[0])
    flat_scores, flat_masks = [], []
    for t, mask in zip(scores, masks, strict=True):
        # Entries whose mask is not 1 do not compete, so their values never matter.
        flat_scores.append(t.reshape(-1))
        flat_masks.append(ns.ones_like(flat_scores[-1]) if mask is None else mask.reshape(-1))
    container = PruningContainer()
    container._tensor_name = method._tensor_name = "global"
    container.add_pruning_method(method)
    merged = ns.cat(flat_scores)
    final = container.compute_mask(merged, ns.cat(flat_masks).to(dtype=merged.dtype))
    keeps, offset = [], 0
    for t in scores:
        keeps.append(final[offset : offset + t.numel()].reshape(t.shape))
        offset += t.numel()
    return keeps


def _global_method(pruning_method: Any, kwargs: dict[str, Any], caller: str) -> BasePruningMethod:
    """Check that `pruning_method` is a method class; build it from `kwargs` and check that
    it is 'unstructured' (read from the instance, as torch does)."""
    if not (isinstance(pruning_method, type) and issubclass(pruning_method, BasePruningMethod)):
        raise type_error(
            f"{caller}: invalid pruning_method={pruning_method!r}; expected a "
            "BasePruningMethod subclass with PRUNING_TYPE 'unstructured', e.g. L1Unstructured"
        )
    method: BasePruningMethod = construct(pruning_method, (), kwargs, caller)
    if not hasattr(method, "PRUNING_TYPE"):
        raise attribute_error(
            f"{caller}: pruning_method={pruning_method.__name__} declares no "
            f"PRUNING_TYPE; expected 'unstructured' (one of {PRUNING_TYPES})"
        )
    if method.PRUNING_TYPE != "unstructured":
        raise type_error(
            f"{caller}: pruning_method={pruning_method.__name__} has PRUNING_TYPE "
            f"{method.PRUNING_TYPE!r}; expected an 'unstructured' method, e.g. L1Unstructured"
        )
    return method


def _global_targets(
    params: list[Any],
    importance_scores: dict[tuple[nn.Module, str], Tensor],
    paths: Mapping[nn.Module, str],
    caller: str,
) -> tuple[list[Tensor], list[Tensor | None], list[Any], list[str]]:
    """Check every listed tensor; return the scores that rank it, its mask (None: unpruned),
    its dtype and its description for messages (with its path where `paths` has it).

    Nothing is copied: where a tensor is pruned its scores are ``<name>_orig``, equal
    to the current values wherever the mask is 1, the only entries that compete.
    """
    scores: list[Tensor] = []
    masks: list[Tensor | None] = []
    dtypes: list[Any] = []
    wheres: list[str] = []
    seen: dict[int, str] = {}
    first: tuple[str, Tensor] | None = None
    device = None
    for entry in params:
        if not (isinstance(entry, tuple) and len(entry) == 2):
            raise type_error(
                f"{caller}: invalid entry {entry!r} in parameters; expected (module, name) pairs"
            )
        module, name = entry
        where = describe(module, name, paths.get(module) if paths else None)
        current, mask, param = _current(module, name, where)
        label = f"parameters[{len(scores)}] ({where})"
        if first is None:
            first = (label, current)
        else:
            common_namespace(caller, **{first[0]: first[1], label: current})
        if id(param) in seen:
            raise value_error(
                f"{where} is the same Parameter as {seen[id(param)]}, listed before (tied "
                "weights or a repeated entry); expected each parameter once"
            )
        seen[id(param)] = where
        if device is None:
            device = current.device
        elif current.device != device:
            raise value_error(
                f"{where} is on device {current.device}; expected all listed parameters "
                f"on one device, the first is on {device}"
            )
        given = importance_scores.get((module, name))
        ranked = current if given is None else check_scores(given, current, where, mask)
        scores.append(ranked)
        wheres.append(where)
        masks.append(mask)
        dtypes.append(current.dtype)
    return scores, masks, dtypes, wheres


def _current(
    module: nn.Module, name: str, where: str
) -> tuple[Tensor, Tensor | None, nn.Parameter]:
    """Values of ``module.<name>`` right wherever its mask is 1, that mask, and the Parameter.

    For a pruned tensor the values are ``<name>_orig`` itself (no copy is made) unless
    its hook computes them another way; an unpruned tensor has no mask (None).
    """
    owner, leaf = owner_of(module, name)
    _, hook = find_pruning_hook(owner, leaf)
    if hook is not None:
        orig: nn.Parameter = getattr(owner, orig_name(leaf))
        mask = getattr(owner, mask_name(leaf)).detach()
        return current_values(owner, leaf, hook, alive_only=True), mask, orig
    param = prunable_parameter(owner, leaf, where)
    return param.detach(), None, param


def forward_reuse(module: M, enabled: bool) -> M:
    """Allow or forbid gradient-free forwards of `module` to reuse masked tensors.

    Applies to every pruning hook in `module` and its submodules (prunings added
    later start with reuse on). See BasePruningMethod.__call__ for what reuse sees.

    Args:
        module: a model, pruned or not.
        enabled: True to let forwards under ``torch.no_grad()`` reuse mask * orig while
            neither changed; False to recompute it at every forward.

    Returns:
        `module`.
    """
    for sub in module.modules():
        for hook in pruning_hooks(sub):
            hook.reuse_masked = bool(enabled)
            hook._reuse = None
    return module
