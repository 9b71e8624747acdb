"""The functional API: one call per method, global pruning, remove() and is_pruned()."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from torch import Tensor, nn

from prunekit._backend import namespace
from prunekit.base import (
    BasePruningMethod,
    PruningContainer,
    describe,
    find_pruning_hook,
    with_context,
)
from prunekit.methods import (
    CustomFromMask,
    Identity,
    L1Unstructured,
    LnStructured,
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
    "refresh",
    "remove",
]

M = TypeVar("M", bound=nn.Module)


def identity(module: M, name: str) -> M:
    """Install the reparameterization on ``module.<name>`` without pruning anything."""
    Identity.apply(module, name)
    return module


def random_unstructured(module: M, name: str, amount: float) -> M:
    """Prune `amount` entries of ``module.<name>`` chosen at random."""
    RandomUnstructured.apply(module, name, amount)
    return module


def l1_unstructured(
    module: M, name: str, amount: float, importance_scores: Tensor | None = None
) -> M:
    """Prune the `amount` entries of ``module.<name>`` with the smallest absolute score."""
    L1Unstructured.apply(module, name, amount, importance_scores=importance_scores)
    return module


def random_structured(module: M, name: str, amount: float, dim: int) -> M:
    """Prune `amount` random channels of ``module.<name>`` along `dim`."""
    RandomStructured.apply(module, name, amount, dim)
    return module


def ln_structured(
    module: M,
    name: str,
    amount: float,
    n: Any,
    dim: int,
    importance_scores: Tensor | None = None,
) -> M:
    """Prune the `amount` channels of ``module.<name>`` along `dim` with the smallest L`n` norm."""
    LnStructured.apply(module, name, amount, n, dim, importance_scores=importance_scores)
    return module


def custom_from_mask(module: M, name: str, mask: Tensor) -> M:
    """Prune ``module.<name>`` where `mask` is 0."""
    CustomFromMask.apply(module, name, mask)
    return module


def remove(module: M, name: str) -> M:
    """Make the pruning of ``module.<name>`` permanent and drop its hook.

    Raises ValueError if the tensor is not pruned.
    """
    key, hook = find_pruning_hook(module, name)
    if hook is None:
        pruned = sorted(
            h._tensor_name
            for h in module._forward_pre_hooks.values()
            if isinstance(h, BasePruningMethod) and h._tensor_name is not None
        )
        raise ValueError(
            f"{describe(module, name)} is not pruned, so there is nothing to remove; "
            f"pruned tensors of this module: {pruned}"
        )
    hook.remove(module)
    del module._forward_pre_hooks[key]
    return module


def is_pruned(module: nn.Module) -> bool:
    """True if `module` or any submodule carries a pruning hook."""
    return any(
        isinstance(hook, BasePruningMethod)
        for sub in module.modules()
        for hook in sub._forward_pre_hooks.values()
    )


def global_unstructured(
    parameters: Iterable[tuple[nn.Module, str]],
    pruning_method: type[BasePruningMethod],
    importance_scores: dict[tuple[nn.Module, str], Tensor] | None = None,
    **kwargs: Any,
) -> None:
    """Prune the listed tensors jointly: `amount` (in kwargs) counts over all of them.

    `pruning_method` must be an unstructured method class. Entries pruned
    before stay pruned, and a fractional amount is a fraction of the entries
    still unpruned across all tensors. Each tensor gets its share through
    CustomFromMask, composed with any earlier pruning.
    """
    if not isinstance(parameters, Iterable):
        raise TypeError(
            "global_unstructured: parameters must be an iterable of (module, name) pairs, "
            f"got {type(parameters).__name__}"
        )
    params = list(parameters)
    if importance_scores is None:
        importance_scores = {}
    if not isinstance(importance_scores, dict):
        raise TypeError(
            "global_unstructured: importance_scores must be a dict keyed by (module, name), "
            f"got {type(importance_scores).__name__}"
        )
    method = pruning_method(**kwargs)
    if method.PRUNING_TYPE != "unstructured":
        raise TypeError(
            f"global_unstructured: {pruning_method.__name__} has PRUNING_TYPE "
            f"{method.PRUNING_TYPE!r}; only 'unstructured' methods can prune globally"
        )
    if not params:
        return
    scores: list[Tensor] = []
    masks: list[Tensor | None] = []
    for module, name in params:
        values, mask = _values(module, name)
        given = importance_scores.get((module, name))
        if given is not None and tuple(given.shape) != tuple(values.shape):
            raise ValueError(
                f"{describe(module, name)}: importance_scores of shape {tuple(given.shape)} "
                f"do not match the parameter's shape {tuple(values.shape)}"
            )
        scores.append(values if given is None else given.detach())
        masks.append(mask)
    try:
        chosen = method._choose(scores, masks)
        if chosen is None:
            keeps = _global_generic(method, scores, masks)
        else:
            # One tensor at a time: no copy of the model is ever made.
            keeps = [~pick.reshape(t.shape) for pick, t in zip(chosen, scores, strict=True)]
    except (TypeError, ValueError, IndexError) as error:
        raise with_context(error, "global_unstructured") from None
    del scores, masks
    for module, name in params:
        CustomFromMask.apply(module, name, keeps.pop(0))


def _global_generic(
    method: BasePruningMethod, scores: list[Tensor], masks: list[Tensor | None]
) -> list[Tensor]:
    """Rank all tensors as one concatenated vector through a PruningContainer."""
    ns = namespace(scores[0])
    flat_scores, flat_masks = [], []
    for t, mask in zip(scores, masks, strict=True):
        # Entries where the mask is not 1 do not compete, so their values never matter.
        flat_scores.append(t.reshape(-1))
        flat_masks.append(ns.ones_like(flat_scores[-1]) if mask is None else mask.reshape(-1))
    container = PruningContainer()
    container._tensor_name = method._tensor_name = "global"
    container.add_pruning_method(method)
    final = container.compute_mask(ns.cat(flat_scores), ns.cat(flat_masks).to(flat_scores[0].dtype))
    keeps, offset = [], 0
    for t in scores:
        keeps.append(final[offset : offset + t.numel()].reshape(t.shape))
        offset += t.numel()
    return keeps


def _values(module: nn.Module, name: str) -> tuple[Tensor, Tensor | None]:
    """Values of ``module.<name>`` that are right wherever its mask (None if unpruned) is 1.

    For a pruned tensor that is ``<name>_orig`` itself, so nothing is copied.
    """
    _, hook = find_pruning_hook(module, name)
    if hook is not None:
        mask = getattr(module, name + "_mask").detach()
        if type(hook).apply_mask is BasePruningMethod.apply_mask:
            return getattr(module, name + "_orig").detach(), mask
        return hook.apply_mask(module).detach(), mask
    param = module._parameters.get(name) if isinstance(name, str) else None
    if param is None:
        raise AttributeError(
            f"{describe(module, name)} does not exist; parameters of this module: "
            f"{sorted(module._parameters)}"
        )
    return param.detach(), None


def refresh(module: M) -> M:
    """Recompute ``<name>`` = mask * orig for every pruned tensor in `module` and its submodules.

    Needed only after writing to ``<name>_orig`` or ``<name>_mask`` through
    ``.data``, which forward reuse cannot detect (see BasePruningMethod.__call__).
    """
    for sub in module.modules():
        for hook in list(sub._forward_pre_hooks.values()):
            if isinstance(hook, BasePruningMethod):
                hook.refresh(sub)
    return module


def forward_reuse(module: M, enabled: bool) -> M:
    """Allow or forbid gradient-free forwards of `module` to reuse masked tensors.

    Applies to every pruning hook in `module` and its submodules; prunings added
    later start with reuse on.
    """
    for sub in module.modules():
        for hook in sub._forward_pre_hooks.values():
            if isinstance(hook, BasePruningMethod):
                hook.reuse_masked = bool(enabled)
                hook._reuse = None
    return module
