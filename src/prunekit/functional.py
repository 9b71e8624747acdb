"""The functional API: one call per method, global pruning, remove() and is_pruned()."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from torch import Tensor, nn

from prunekit._backend import common_namespace, namespace
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
    scores, masks, shapes = [], [], []
    for module, name in params:
        current, mask = _current(module, name)
        given = importance_scores.get((module, name))
        common_namespace(describe(module, name), parameter=current, importance_scores=given)
        if given is not None and tuple(given.shape) != tuple(current.shape):
            raise ValueError(
                f"{describe(module, name)}: importance_scores of shape {tuple(given.shape)} "
                f"do not match the parameter's shape {tuple(current.shape)}"
            )
        scores.append((current if given is None else given.detach()).reshape(-1))
        masks.append(mask.reshape(-1).to(dtype=current.dtype))
        shapes.append(current.shape)
    ns = common_namespace(
        "global_unstructured",
        **{f"{type(m).__name__}.{name} (parameters[{i}])": m for i, (m, name) in enumerate(params)},
    )
    container = PruningContainer()
    container._tensor_name = method._tensor_name = "global"
    container.add_pruning_method(method)
    try:
        final = container.compute_mask(ns.cat(scores), ns.cat(masks))
    except (TypeError, ValueError, IndexError) as error:
        raise with_context(error, "global_unstructured") from None
    offset = 0
    for (module, name), shape, flat in zip(params, shapes, masks, strict=True):
        part = final[offset : offset + flat.numel()].reshape(shape)
        CustomFromMask.apply(module, name, part)
        offset += flat.numel()


def _current(module: nn.Module, name: str) -> tuple[Tensor, Tensor]:
    """The current (masked) values of ``module.<name>`` and its mask, both detached."""
    _, hook = find_pruning_hook(module, name)
    if hook is not None:
        return hook.apply_mask(module).detach(), getattr(module, name + "_mask").detach()
    param = module._parameters.get(name) if isinstance(name, str) else None
    if param is None:
        raise AttributeError(
            f"{describe(module, name)} does not exist; parameters of this module: "
            f"{sorted(module._parameters)}"
        )
    return param.detach(), namespace(param).ones_like(param.detach())
