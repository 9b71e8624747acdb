"""Installing a pruning on a module and the hooks that keep it current.

install() computes and checks the mask before the module changes, then swaps the
Parameter for ``<name>_orig`` + ``<name>_mask`` + the method as a forward pre-hook inside
one transaction: on any error the module keeps its parameters, buffers and hooks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from prunekit.core.backend import common_namespace, framework_caveat, namespace
from prunekit.core.checks import (
    check_scores,
    owner_of,
    prunable_parameter,
    refuse_ties,
)
from prunekit.core.errors import describe, naming, value_error, warn_caller
from prunekit.core.naming import mask_name, orig_name
from prunekit.core.product import made
from prunekit.core.transaction import transaction
from prunekit.dropin.copying import KeepsHookKey
from prunekit.dropin.hooks import find_pruning_hook, pruning_hooks, pruning_type
from prunekit.dropin.out_proj import RefreshSubmodule, watch_out_proj
from prunekit.select import tuning

if TYPE_CHECKING:  # the method protocol stands above: its apply() installs through here
    from prunekit.dropin.base_method import BasePruningMethod

__all__ = [
    "RefreshAfterLoad",
    "RefreshSubmodule",
    "current_values",
    "drop_refresh",
    "find_pruning_hook",
    "forget_load_refresh",
    "install",
    "pruning_hooks",
    "refresh_masked",
]


def install(
    module: nn.Module,
    name: str,
    method: BasePruningMethod,
    importance_scores: Tensor | None = None,
    masked: Tensor | None = None,
) -> BasePruningMethod:
    """Install `method` on ``module.<name>``, composing with any earlier pruning.

    `masked`, for a first pruning, is mask * orig made already (by the selection).
    A dotted name (``'out_proj.weight'``) prunes a submodule's tensor and refreshes it on
    `module`'s forward: needed where the parent reads the child's weight without calling
    the child (MultiheadAttention.out_proj).
    """
    owner, leaf = owner_of(module, name)
    where = describe(module, name)
    caveat = framework_caveat(owner)
    if caveat is not None:
        warn_caller(f"{where}: {caveat}")
    if owner is not module and (param := owner._parameters.get(leaf)) is not None:
        refuse_ties(module.named_parameters(remove_duplicate=False), name, param, where)
    tensor = getattr(owner, leaf, None)
    with tuning.threads_for(tensor.numel() if isinstance(tensor, Tensor) else None):
        hook = _install(owner, leaf, method, importance_scores, where, masked)
    if owner is module:
        watch_out_proj(owner)  # MultiheadAttention.out_proj: refreshed when its parent runs
    else:
        path = name.rpartition(".")[0]
        if not any(
            isinstance(h, RefreshSubmodule) and (h.path, h.name) == (path, leaf)
            for h in module._forward_pre_hooks.values()
        ):
            refresh = RefreshSubmodule(path, leaf)
            refresh._registered(module.register_forward_pre_hook(refresh).id)
    return hook


def _install(
    module: nn.Module,
    name: str,
    method: BasePruningMethod,
    importance_scores: Tensor | None,
    where: str,
    masked: Tensor | None = None,
) -> BasePruningMethod:
    key, old = find_pruning_hook(module, name)
    mask, masked, param = _new_mask(module, name, method, old, importance_scores, masked, where)
    mask = _checked_mask(mask, param.detach(), where)
    replaced = module._buffers.get(mask_name(name))  # replaced below, never written: no clone
    with transaction([module], untouched=[] if replaced is None else [replaced]):
        if old is None:
            hook = method
            del module._parameters[name]
            module.register_parameter(orig_name(name), param)
            module.register_buffer(mask_name(name), mask)
            method._registered(module.register_forward_pre_hook(method).id)
        else:
            hook = old._composed(method)
            module._buffers[mask_name(name)] = mask
            # Registered anew, as torch does: after any hook registered since the old one.
            del module._forward_pre_hooks[key]
            hook._registered(module.register_forward_pre_hook(hook).id)
        if masked is None:
            setattr(module, name, hook.apply_mask(module))
        else:
            setattr(module, name, made(masked, param, mask))
    hook._bind(module)
    if not any(
        isinstance(h, RefreshAfterLoad) for h in module._load_state_dict_post_hooks.values()
    ):
        after = RefreshAfterLoad()
        handle = module.register_load_state_dict_post_hook(after)  # type: ignore[no-untyped-call]
        after._registered(handle.id)
    return hook


def _new_mask(
    module: nn.Module,
    name: str,
    method: BasePruningMethod,
    old: BasePruningMethod | None,
    importance_scores: Tensor | None,
    masked: Tensor | None,
    where: str,
) -> tuple[Any, Tensor | None, nn.Parameter]:
    """The mask `method` gives ``module.<name>`` (composed with `old`), mask * orig where
    made in the same pass (else None), and the Parameter pruned. Changes nothing."""
    target = (module, name)
    if old is None:
        param = prunable_parameter(module, name, where)
        current = param.detach()
    else:
        param = getattr(module, orig_name(name))
        default_mask = getattr(module, mask_name(name)).detach()
        with naming(where):
            kind = pruning_type(method)
        alive_only = kind == "unstructured" or importance_scores is not None
        current = current_values(module, name, old, alive_only)
    alive = None if old is None else default_mask
    scores = (
        current
        if importance_scores is None
        else check_scores(importance_scores, current, where, alive)
    )
    method._tensor_name = name
    with naming(where):
        if old is not None:
            return method._combined_mask(scores, default_mask, target), None, param
        if masked is None and importance_scores is None:
            mask, masked = method._first_masked(scores, current.dtype, target)
        else:
            mask = method._first_mask(scores, current.dtype, target)
        if mask is None:
            ones = namespace(param).ones_like(current)
            mask = method._compute_mask(scores, ones, target)
    return mask, masked, param


def current_values(
    module: nn.Module, name: str, old: BasePruningMethod, alive_only: bool
) -> Tensor:
    """The values of ``module.<name>``, pruned by `old`, that a new pruning sees.

    mask * orig in general; with `alive_only` (only the entries whose mask is 1
    matter: an 'unstructured' method, or values not ranked at all because importance
    scores are given) ``<name>_orig`` itself, no copy, since there the two agree,
    unless `old` computes its values its own way.
    """
    orig: Tensor = getattr(module, orig_name(name)).detach()
    if alive_only and old._masks_orig():
        return orig
    values: Tensor = old.apply_mask(module).detach()
    return values


class RefreshAfterLoad(KeepsHookKey):
    """load_state_dict post-hook: recompute ``module.<name>`` = mask * orig after a load.

    Without it the attribute keeps the values from before the load until the next forward.
    install() registers one per pruned module; functional.remove() drops it with the last
    pruning of the module.
    """

    def __call__(self, module: nn.Module, incompatible_keys: Any) -> None:
        refresh_masked(module)


def refresh_masked(module: nn.Module) -> None:
    """Recompute ``module.<name>`` = mask * orig for each tensor pruned on `module` itself."""
    for hook in pruning_hooks(module):
        if hook._tensor_name is not None:
            setattr(module, hook._tensor_name, hook.apply_mask(module))


def forget_load_refresh(module: nn.Module) -> None:
    """Drop the RefreshAfterLoad of `module` if no pruning is left on it."""
    if pruning_hooks(module):
        return
    for key, hook in list(module._load_state_dict_post_hooks.items()):
        if isinstance(hook, RefreshAfterLoad):
            del module._load_state_dict_post_hooks[key]


def drop_refresh(module: nn.Module, name: str) -> None:
    """Remove the RefreshSubmodule that install() put on `module` for dotted `name`."""
    path, _, leaf = name.rpartition(".")
    for key, hook in list(module._forward_pre_hooks.items()):
        if isinstance(hook, RefreshSubmodule) and (hook.path, hook.name) == (path, leaf):
            del module._forward_pre_hooks[key]


def _checked_mask(mask: Any, current: Tensor, where: str) -> Tensor:
    """A computed mask as installed: same shape and dtype as the parameter, detached."""
    common_namespace(where, parameter=current, mask=mask)
    if tuple(mask.shape) != tuple(current.shape):
        raise value_error(
            f"{where}: the pruning method returned a mask of shape {tuple(mask.shape)}; "
            f"expected the parameter's shape {tuple(current.shape)}"
        )
    result: Tensor = mask.detach().to(dtype=current.dtype, device=current.device)
    if not result.is_contiguous():
        result = result.contiguous()
    if isinstance(result, Tensor) and result.is_inference():
        # Made under inference_mode: a plain copy, or autograd could never save it.
        with torch.inference_mode(False):
            result = result.clone()
    return result
