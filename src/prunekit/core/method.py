"""The mask reparameterization: BasePruningMethod, PruningContainer and their installation.

`apply` turns ``module.<name>`` into ``<name>_orig`` (the same Parameter),
``<name>_mask`` (a buffer) and a forward pre-hook that keeps ``module.<name>``
equal to mask * orig. Everything is computed before the module is touched, so
a call that fails leaves the module exactly as it was.
"""

from __future__ import annotations

import copy
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from prunekit.core.amount import validate_dim
from prunekit.core.attention import watch_out_proj
from prunekit.core.backend import common_namespace, framework_caveat, multiply_, namespace
from prunekit.core.checks import (
    Snapshot,
    check_scores,
    describe,
    prunable_parameter,
    refuse_ties,
    resolve,
    warn_caller,
    with_context,
)

__all__ = [
    "PRUNING_TYPES",
    "BasePruningMethod",
    "PruningBase",
    "PruningContainer",
    "RefreshAfterLoad",
    "RefreshSubmodule",
    "combine_masks",
    "current_values",
    "drop_refresh",
    "find_pruning_hook",
    "forget_load_refresh",
    "install",
    "pruning_hooks",
    "refresh_masked",
]

PRUNING_TYPES = ("unstructured", "structured", "global")


class BasePruningMethod(ABC):
    """Base class of pruning methods; subclasses set PRUNING_TYPE and compute_mask().

    PRUNING_TYPE tells a PruningContainer which entries a later pruning ranks:
    'unstructured' the entries still unpruned, 'structured' the channels (along
    ``self.dim``) not yet fully pruned, 'global' all entries.
    """

    PRUNING_TYPE: ClassVar[str]
    _writes_products: ClassVar[bool] = False
    """Whether _choose can also write each tensor times its mask (its `products`)."""
    _tensor_name: str | None = None
    reuse_masked: bool = True
    """Whether a forward without gradients may reuse ``module.<name>`` (see __call__)."""
    _reuse: tuple[Any, ...] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if getattr(cls.compute_mask, "__isabstractmethod__", False):
            return  # still abstract: the concrete subclass declares the type
        kind = getattr(cls, "PRUNING_TYPE", None)
        if kind is None:
            raise TypeError(f"{cls.__qualname__} must declare PRUNING_TYPE, one of {PRUNING_TYPES}")
        if kind not in PRUNING_TYPES:
            raise ValueError(
                f"{cls.__qualname__}.PRUNING_TYPE={kind!r} is not allowed; "
                f"expected one of {PRUNING_TYPES}"
            )

    def __call__(self, module: nn.Module, inputs: Any) -> None:
        """Forward pre-hook: make ``module.<name>`` equal mask * orig.

        When no gradient is needed (``no_grad``, ``inference_mode``, or neither
        tensor requires grad), the product made by the previous call is reused
        as long as ``<name>_orig``, ``<name>_mask`` and ``module.<name>`` are the
        same objects, with the same storage and version counters: any in-place
        change (an optimizer step, ``load_state_dict``, ``copy_``), a new pruning,
        a dtype or device move makes it recompute. The one change it cannot see
        is a write through ``.data`` (``orig.data.copy_(...)``), which bypasses
        version counters: after one, call ``prunekit.refresh_pruned(model)``, or
        turn reuse off with ``prunekit.forward_reuse(model, False)`` (it sets
        ``reuse_masked`` on each hook).
        """
        name = self._require_name()
        orig = getattr(module, name + "_orig")
        mask = getattr(module, name + "_mask")
        ns = namespace(orig)
        if not self.reuse_masked or (
            ns.is_grad_enabled() and (orig.requires_grad or mask.requires_grad)
        ):
            self._reuse = None
            setattr(module, name, self.apply_mask(module))
            return
        cached = self._reuse
        if (
            cached is not None
            and cached[0] is orig
            and cached[1] is mask
            and module.__dict__.get(name) is cached[2]
            and _state(orig, mask, cached[2]) == cached[3]
        ):
            return
        with ns.inference_mode(False), ns.no_grad():
            masked = self.apply_mask(module)
        setattr(module, name, masked)
        state = _state(orig, mask, masked)
        self._reuse = None if state is None else (orig, mask, masked, state)

    @abstractmethod
    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """Return the mask for scores `t`; entries zero in `default_mask` stay zero."""

    def apply_mask(self, module: nn.Module) -> Tensor:
        """Return mask * orig for the tensor this method prunes in `module`."""
        name = self._require_name()
        mask = getattr(module, name + "_mask")
        orig = getattr(module, name + "_orig")
        result: Tensor = mask.to(dtype=orig.dtype) * orig
        return result

    @classmethod
    def apply(
        cls,
        module: nn.Module,
        name: str,
        *args: Any,
        importance_scores: Tensor | None = None,
        **kwargs: Any,
    ) -> BasePruningMethod:
        """Prune ``module.<name>`` with ``cls(*args, **kwargs)``; return the hook installed.

        If the tensor is already pruned, the new method is composed with the
        old one in a PruningContainer, which is returned instead.
        """
        where = describe(module, name)
        try:
            method = cls(*args, **kwargs)
        except (TypeError, ValueError) as error:
            raise with_context(error, where) from None
        return install(module, name, method, importance_scores)

    def prune(
        self,
        t: Tensor,
        default_mask: Tensor | None = None,
        importance_scores: Tensor | None = None,
    ) -> Tensor:
        """Return `t` pruned by this method, without touching any module."""
        ns = common_namespace(
            f"{type(self).__name__}.prune",
            t=t,
            default_mask=default_mask,
            importance_scores=importance_scores,
        )
        scores = t if importance_scores is None else importance_scores
        if tuple(scores.shape) != tuple(t.shape):
            raise ValueError(
                f"{type(self).__name__}.prune: importance_scores have shape "
                f"{tuple(scores.shape)}; expected the tensor's shape {tuple(t.shape)}"
            )
        if default_mask is None:
            default_mask = ns.ones_like(t)
        return t * self.compute_mask(scores, default_mask=default_mask)

    def _choose(
        self,
        scores: Sequence[Tensor],
        masks: Sequence[Tensor | None],
        keep_dtype: Any = None,
        products: Sequence[Tensor | None] | None = None,
    ) -> Iterator[Tensor] | None:
        """The entries an 'unstructured' method prunes, without gathering them.

        Yields one flat bool selection per tensor of `scores` (True = pruned), all
        ranked together as if concatenated, each only where its mask is 1
        (everywhere for None); with `keep_dtype`, 0/1 of that dtype (1 = kept).
        None when the method has no such shortcut: callers then gather
        ``t[mask == 1]`` and call compute_mask (user-defined methods go that way).

        `products` is for methods with _writes_products: per tensor, None or a flat
        torch tensor of `keep_dtype` to receive the scores times the mask, by the time
        that mask is yielded (only for scores that are the tensor's own values, with
        no mask: then it is ``module.<name>``).
        """
        return None

    def _first_mask(self, scores: Tensor, dtype: Any) -> Tensor | None:
        """``compute_mask(scores, ones)`` in `dtype`, made without building the ones.

        None when the method has no such shortcut (install then builds the ones).
        """
        kept = self._choose([scores], [None], keep_dtype=dtype)
        return None if kept is None else next(kept).reshape(scores.shape)

    def _first_masked(self, scores: Tensor, dtype: Any) -> tuple[Tensor | None, Tensor | None]:
        """``_first_mask`` and, when the method writes it in the same pass, mask * scores
        (contiguous; else None). For scores that are the tensor's own values."""
        if not (self._writes_products and fusable(scores, dtype)):
            return self._first_mask(scores, dtype), None
        product = torch.empty(scores.shape, dtype=dtype)
        kept = self._choose([scores], [None], keep_dtype=dtype, products=[product.view(-1)])
        if kept is None:
            return self._first_mask(scores, dtype), None
        return next(kept).reshape(scores.shape), product

    def remove(self, module: nn.Module) -> None:
        """Make the pruning permanent: write mask * orig into the Parameter ``<name>``.

        The Parameter object is the one that was pruned, so optimizers holding it
        keep working. ``<name>_orig`` and ``<name>_mask`` are dropped; the hook is
        not (functional.remove() drops it).
        """
        name = self._require_name()
        orig = module._parameters.get(name + "_orig")
        mask = module._buffers.get(name + "_mask")
        if orig is None or mask is None:
            raise ValueError(
                f"{describe(module, name)} is not pruned (no {name + '_orig'!r} and "
                f"{name + '_mask'!r}); expected a tensor this method pruned"
            )
        self._reuse = None
        with namespace(orig).no_grad():
            multiply_(orig, mask.to(dtype=orig.dtype))
        module.__dict__.pop(name, None)
        del module._parameters[name + "_orig"]
        del module._buffers[name + "_mask"]
        # setattr, not register_parameter: RNN modules keep their own list of weights.
        setattr(module, name, orig)

    # -- Copying and pickling ----------------------------------------------------------
    # After a forward pass with grad, module.<name> is a non-leaf tensor (mask * orig) in
    # the module's __dict__, which copy.deepcopy refuses (pytorch#37322). install() gives
    # the hook a weak reference to its module; the module's hooks are copied before its
    # attributes, so the hook, when copied, registers mask' * orig' (of the copies) in the
    # memo as the copy of that tensor. Pickling keeps a strong reference instead (pickle
    # handles the cycle), so an unpickled module can be deep-copied as well.

    _module: weakref.ReferenceType[nn.Module] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_module", None)
        state.pop("_reuse", None)  # the reused product is recomputed, never stored
        state["_bound_module"] = self._bound_module()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        module = state.pop("_bound_module", None)
        self.__dict__.update(state)
        if module is not None:
            self._module = weakref.ref(module)
            watch_out_proj(module)  # in a process that loads a pruned out_proj

    def __deepcopy__(self, memo: dict[int, Any]) -> BasePruningMethod:
        module = self._bound_module()
        copied_module = memo.get(id(module)) if module is not None else None
        if module is not None and copied_module is not None:
            _copy_masked_tensor(module, self._require_name(), memo)
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        state = {k: v for k, v in self.__dict__.items() if k not in ("_module", "_reuse")}
        new.__dict__.update(copy.deepcopy(state, memo))
        if copied_module is not None:
            new._module = weakref.ref(copied_module)
        return new

    def _bound_module(self) -> nn.Module | None:
        return self._module() if self._module is not None else None

    def _require_name(self) -> str:
        if self._tensor_name is None:
            raise RuntimeError(
                f"{type(self).__name__} is not attached to a tensor yet; "
                "install it with apply() first"
            )
        return self._tensor_name


PruningBase = BasePruningMethod


class PruningContainer(BasePruningMethod):
    """The successive prunings of one tensor, in the order they were applied.

    Its mask is the last method's mask computed on the part of the tensor the
    previous ones left, as that method's PRUNING_TYPE defines.
    """

    PRUNING_TYPE = "global"

    def __init__(self, *methods: BasePruningMethod) -> None:
        self._pruning_methods: tuple[BasePruningMethod, ...] = ()
        if methods:
            self._tensor_name = methods[0]._tensor_name
        for method in methods:
            self.add_pruning_method(method)

    def add_pruning_method(self, method: BasePruningMethod) -> None:
        """Append `method`, which must prune the same tensor as the container."""
        if not isinstance(method, BasePruningMethod):
            raise TypeError(
                f"PruningContainer: invalid method of type {type(method).__name__}; "
                "expected a BasePruningMethod instance"
            )
        if method._tensor_name != self._tensor_name:
            raise ValueError(
                f"PruningContainer holds methods for {self._tensor_name!r}, "
                f"cannot add one for {method._tensor_name!r}; expected a method pruning "
                f"{self._tensor_name!r}"
            )
        self._pruning_methods += (method,)

    def __len__(self) -> int:
        return len(self._pruning_methods)

    def __iter__(self) -> Iterator[BasePruningMethod]:
        return iter(self._pruning_methods)

    def __getitem__(self, idx: int) -> BasePruningMethod:
        return self._pruning_methods[idx]

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """Combine `default_mask` with the newest method's mask (see combine_masks).

        The result has the dtype of `t`, as torch's container gives it (installed masks
        are made by combine_masks directly and keep the parameter's dtype).
        """
        if not self._pruning_methods:
            raise ValueError("PruningContainer is empty: add a pruning method first")
        mask = combine_masks(self._pruning_methods[-1], t, default_mask)
        return mask if mask.dtype == t.dtype else mask.to(dtype=t.dtype)


def combine_masks(method: BasePruningMethod, t: Tensor, mask: Tensor) -> Tensor:
    """Return a new mask: `mask` further pruned by `method` on scores `t`.

    'unstructured' methods see only the entries where `mask` is 1, 'structured'
    ones only the channels along ``method.dim`` that still hold a 1, 'global'
    ones everything. The result has the dtype of `mask`.
    """
    kind = method.PRUNING_TYPE
    if kind == "global":
        return method.compute_mask(t, default_mask=mask.clone()).to(dtype=mask.dtype)
    if kind == "unstructured":
        kept = method._choose([t], [mask], keep_dtype=mask.dtype)
        if kept is not None:
            return multiply_(next(kept).reshape(t.shape), mask)
    new_mask = mask.clone()
    if kind == "unstructured":
        keep = mask == 1
        partial = method.compute_mask(t[keep], default_mask=mask[keep])
        new_mask[keep] = partial.to(dtype=mask.dtype)
        return new_mask
    if kind == "structured":
        dim = getattr(method, "dim", None)
        if dim is None:
            raise AttributeError(
                f"{type(method).__name__} has PRUNING_TYPE 'structured' but no attribute "
                "'dim' saying which axis holds the channels"
            )
        dim = validate_dim(dim, t.dim(), type(method).__name__)
        others = [d for d in range(t.dim()) if d != dim]
        alive = mask.sum(dim=others) != 0
        index = (slice(None),) * dim + (alive,)
        partial = method.compute_mask(t[index], default_mask=mask[index])
        new_mask[index] = partial.to(dtype=mask.dtype)
        return new_mask
    raise ValueError(f"unknown PRUNING_TYPE {kind!r}; expected one of {PRUNING_TYPES}")


def _state(*tensors: Any) -> tuple[Any, ...] | None:
    """What changes when a tensor's values may have: storage, dtype and version counter.

    None for tensors without a version counter (inference tensors).
    """
    try:
        return tuple((t.data_ptr(), t.dtype, t.device, t._version) for t in tensors)
    except (RuntimeError, AttributeError):
        return None


def _copy_masked_tensor(module: nn.Module, name: str, memo: dict[int, Any]) -> None:
    """Put in `memo` the copy of ``module.<name>``: the copied mask times the copied orig."""
    masked = module.__dict__.get(name)
    orig = module._parameters.get(name + "_orig")
    mask = module._buffers.get(name + "_mask")
    if not isinstance(masked, Tensor) or id(masked) in memo or orig is None or mask is None:
        return
    orig_copy = copy.deepcopy(orig, memo)
    mask_copy = copy.deepcopy(mask, memo)
    result = mask_copy.to(dtype=orig_copy.dtype) * orig_copy
    memo[id(masked)] = result if masked.requires_grad else result.detach()
    memo.setdefault(id(memo), []).append(masked)  # keep the id taken, as copy does


def pruning_hooks(module: nn.Module) -> list[BasePruningMethod]:
    """The pruning hooks installed on `module` itself (not its submodules), in order."""
    return [h for h in module._forward_pre_hooks.values() if isinstance(h, BasePruningMethod)]


def find_pruning_hook(module: nn.Module, name: str) -> tuple[Any, BasePruningMethod | None]:
    """Return (key, hook) of the pruning hook on ``module.<name>``, or (None, None)."""
    found = [
        (key, hook)
        for key, hook in module._forward_pre_hooks.items()
        if isinstance(hook, BasePruningMethod) and hook._tensor_name == name
    ]
    if len(found) > 1:
        raise RuntimeError(
            f"{describe(module, name)} carries {len(found)} pruning hooks; "
            "successive prunings must share one PruningContainer"
        )
    return found[0] if found else (None, None)


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
    the child (MultiheadAttention.out_proj). The mask is computed and checked before the
    module changes; on any error the module keeps its parameters, buffers and hooks.
    """
    owner, leaf = resolve(module, name)
    where = describe(module, name)
    caveat = framework_caveat(owner)
    if caveat is not None:
        warn_caller(f"{where}: {caveat}")
    if owner is not module and (param := owner._parameters.get(leaf)) is not None:
        refuse_ties(module.named_parameters(remove_duplicate=False), name, param, where)
    hook = _install(owner, leaf, method, importance_scores, where, masked)
    if owner is module:
        watch_out_proj(owner)  # MultiheadAttention.out_proj: refreshed when its parent runs
    else:
        path = name.rpartition(".")[0]
        if not any(
            isinstance(h, RefreshSubmodule) and (h.path, h.name) == (path, leaf)
            for h in module._forward_pre_hooks.values()
        ):
            module.register_forward_pre_hook(RefreshSubmodule(path, leaf))
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
    if old is None:
        param = prunable_parameter(module, name, where)
        current = param.detach()
    else:
        default_mask = getattr(module, name + "_mask").detach()
        alive_only = method.PRUNING_TYPE == "unstructured" or importance_scores is not None
        current = current_values(module, name, old, alive_only)
    scores = (
        current if importance_scores is None else check_scores(importance_scores, current, where)
    )
    method._tensor_name = name
    mask: Tensor | None
    try:
        if old is not None:
            mask, masked = combine_masks(method, scores, default_mask), None
        else:
            if masked is None and importance_scores is None:
                mask, masked = method._first_masked(scores, current.dtype)
            else:
                mask = method._first_mask(scores, current.dtype)
            if mask is None:
                ones = namespace(param).ones_like(current)
                mask = method.compute_mask(scores, default_mask=ones)
    except (TypeError, ValueError, IndexError) as error:
        raise with_context(error, where) from None
    mask = _checked_mask(mask, current, where)

    snapshot = Snapshot(module)
    try:
        if old is None:
            hook = method
            del module._parameters[name]
            module.register_parameter(name + "_orig", param)
            module.register_buffer(name + "_mask", mask)
            module.register_forward_pre_hook(method)
        else:
            hook = old if isinstance(old, PruningContainer) else PruningContainer(old)
            hook.add_pruning_method(method)
            module._buffers[name + "_mask"] = mask
            module._forward_pre_hooks[key] = hook
        if masked is None:
            setattr(module, name, hook.apply_mask(module))
        else:
            setattr(module, name, _made(masked, param, mask))
    except BaseException:
        snapshot.restore()
        raise
    hook._module = weakref.ref(module)
    if not any(
        isinstance(h, RefreshAfterLoad) for h in module._load_state_dict_post_hooks.values()
    ):
        module.register_load_state_dict_post_hook(RefreshAfterLoad())  # type: ignore[no-untyped-call]
    return hook


def fusable(t: Tensor, dtype: Any) -> bool:
    """Whether mask * `t` may be made in the selection's pass: a contiguous CPU torch
    tensor of floats of `dtype` (the product's dtype)."""
    return (
        isinstance(t, Tensor)
        and t.device.type == "cpu"
        and t.dtype == dtype
        and t.is_floating_point()
        and t.is_contiguous()
    )


class _Multiplied(torch.autograd.Function):
    """mask * orig made already: the forward hands it over, the backward is mul's."""

    @staticmethod
    def forward(ctx: Any, orig: Tensor, mask: Tensor, made: list[Tensor]) -> Tensor:
        ctx.save_for_backward(mask)
        return made[0]  # in a list, so autograd does not take it for an input

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (mask,) = ctx.saved_tensors
        return grad * mask, None, None


def _made(product: Tensor, orig: Tensor, mask: Tensor) -> Tensor:
    """``module.<name>`` from mask * orig made during the selection: as apply_mask's
    would be, part of the graph when gradients are recorded."""
    if torch.is_grad_enabled() and orig.requires_grad:
        result: Tensor = _Multiplied.apply(orig, mask, [product])  # type: ignore[no-untyped-call]
        return result
    return product


def current_values(
    module: nn.Module, name: str, old: BasePruningMethod, alive_only: bool
) -> Tensor:
    """The values of ``module.<name>``, pruned by `old`, that a new pruning sees.

    mask * orig in general; with `alive_only` (only the entries whose mask is 1
    matter: an 'unstructured' method, or values not ranked at all because importance
    scores are given) ``<name>_orig`` itself, no copy, since there the two agree,
    unless `old` computes its values its own way.
    """
    orig: Tensor = getattr(module, name + "_orig").detach()
    if alive_only and type(old).apply_mask is BasePruningMethod.apply_mask:
        return orig
    values: Tensor = old.apply_mask(module).detach()
    return values


class RefreshAfterLoad:
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


class RefreshSubmodule:
    """Forward pre-hook on a parent: refreshes a pruned tensor of the child at `path`.

    For children whose forward never runs because the parent reads their weights
    directly (MultiheadAttention.out_proj, pytorch#69353): without it the child's masked
    tensor, computed once, is reused by every step and its graph freed after the first
    backward.
    """

    def __init__(self, path: str, name: str) -> None:
        self.path = path
        self.name = name

    def __call__(self, module: nn.Module, inputs: Any) -> None:
        owner = module.get_submodule(self.path)
        _, hook = find_pruning_hook(owner, self.name)
        if hook is not None:
            hook(owner, inputs)


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
        raise ValueError(
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
