"""The mask reparameterization: BasePruningMethod, PruningContainer and their installation.

`apply` turns ``module.<name>`` into ``<name>_orig`` (the same Parameter),
``<name>_mask`` (a buffer) and a forward pre-hook that keeps ``module.<name>``
equal to mask * orig. Everything is computed before the module is touched, so
a call that fails leaves the module exactly as it was.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from torch import Tensor, nn

from prunekit._backend import namespace

__all__ = [
    "PRUNING_TYPES",
    "BasePruningMethod",
    "PruningBase",
    "PruningContainer",
    "combine_masks",
    "describe",
    "find_pruning_hook",
    "install",
    "with_context",
]

PRUNING_TYPES = ("unstructured", "structured", "global")


def describe(module: Any, name: str) -> str:
    """How errors name a tensor: ``parameter 'weight' of Linear``."""
    return f"parameter {name!r} of {type(module).__name__}"


def with_context(error: Exception, where: str) -> Exception:
    """Return `error` with `where` put in front of its message, if its type allows."""
    if type(error) in (TypeError, ValueError, IndexError, AttributeError):
        return type(error)(f"{where}: {error}")
    return error


class BasePruningMethod(ABC):
    """Base class of pruning methods; subclasses set PRUNING_TYPE and compute_mask().

    PRUNING_TYPE tells a PruningContainer which entries a later pruning ranks:
    'unstructured' the entries still unpruned, 'structured' the channels (along
    ``self.dim``) not yet fully pruned, 'global' all entries.
    """

    PRUNING_TYPE: ClassVar[str]
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
        version counters: after one, call ``prunekit.refresh(module)``, or turn
        reuse off with ``prunekit.forward_reuse(module, False)`` (it sets
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

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles leave the reused product behind."""
        state = self.__dict__.copy()
        state.pop("_reuse", None)
        return state

    def refresh(self, module: nn.Module) -> None:
        """Recompute ``module.<name>`` = mask * orig now, forgetting any reused product."""
        self._reuse = None
        setattr(module, self._require_name(), self.apply_mask(module))

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
        scores = t if importance_scores is None else importance_scores
        if tuple(scores.shape) != tuple(t.shape):
            raise ValueError(
                f"{type(self).__name__}.prune: importance_scores of shape "
                f"{tuple(scores.shape)} do not match the tensor's shape {tuple(t.shape)}"
            )
        if default_mask is None:
            default_mask = namespace(t).ones_like(t)
        return t * self.compute_mask(scores, default_mask=default_mask)

    def _choose(
        self,
        scores: Sequence[Tensor],
        masks: Sequence[Tensor | None],
        keep_dtype: Any = None,
    ) -> Iterator[Tensor] | None:
        """The entries an 'unstructured' method prunes, without gathering them.

        Yields one flat bool selection per tensor of `scores` (True = pruned), all
        ranked together as if concatenated, each only where its mask is 1
        (everywhere for None); with `keep_dtype`, 0/1 of that dtype (1 = kept).
        None when the method has no such shortcut: callers then gather
        ``t[mask == 1]`` and call compute_mask (user-defined methods go that way).
        """
        return None

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
            raise ValueError(f"{describe(module, name)} is not pruned: nothing to remove")
        self._reuse = None
        with namespace(orig).no_grad():
            orig.mul_(mask.to(dtype=orig.dtype))
        module.__dict__.pop(name, None)
        del module._parameters[name + "_orig"]
        del module._buffers[name + "_mask"]
        module.register_parameter(name, orig)

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
                f"PruningContainer accepts BasePruningMethod instances, got {type(method).__name__}"
            )
        if method._tensor_name != self._tensor_name:
            raise ValueError(
                f"PruningContainer holds methods for {self._tensor_name!r}, "
                f"cannot add one for {method._tensor_name!r}"
            )
        self._pruning_methods += (method,)

    def __len__(self) -> int:
        return len(self._pruning_methods)

    def __iter__(self) -> Iterator[BasePruningMethod]:
        return iter(self._pruning_methods)

    def __getitem__(self, idx: int) -> BasePruningMethod:
        return self._pruning_methods[idx]

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """Combine `default_mask` with the newest method's mask (see combine_masks)."""
        if not self._pruning_methods:
            raise ValueError("PruningContainer is empty: add a pruning method first")
        return combine_masks(self._pruning_methods[-1], t, default_mask)


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
            return next(kept).reshape(t.shape).mul_(mask)
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
        ndim = t.dim()
        if not -ndim <= dim < ndim:
            raise IndexError(f"dim={dim} is out of range for a tensor with {ndim} dims")
        dim %= ndim
        others = [d for d in range(ndim) if d != dim]
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
) -> BasePruningMethod:
    """Install `method` on ``module.<name>``, composing with any earlier pruning.

    The mask is computed and checked before the module changes; on any error
    the module keeps its parameters, buffers and hooks untouched.
    """
    where = describe(module, name)
    key, old = find_pruning_hook(module, name)
    method._tensor_name = name
    if old is None:
        param = _parameter(module, name)
        current = param.detach()
        default_mask = namespace(param).ones_like(current)
    else:
        current = old.apply_mask(module).detach()
        default_mask = getattr(module, name + "_mask").detach()
    scores = current if importance_scores is None else _scores(importance_scores, current, where)
    try:
        if old is None:
            mask = method.compute_mask(scores, default_mask=default_mask)
        else:
            mask = combine_masks(method, scores, default_mask)
    except (TypeError, ValueError, IndexError) as error:
        raise with_context(error, where) from None
    mask = _checked_mask(mask, current, where)

    if old is None:
        del module._parameters[name]
        module.register_parameter(name + "_orig", param)
        module.register_buffer(name + "_mask", mask)
        setattr(module, name, method.apply_mask(module))
        module.register_forward_pre_hook(method)
        return method
    container = old if isinstance(old, PruningContainer) else PruningContainer(old)
    container.add_pruning_method(method)
    module._buffers[name + "_mask"] = mask
    module._forward_pre_hooks[key] = container
    setattr(module, name, container.apply_mask(module))
    return container


def _parameter(module: nn.Module, name: str) -> nn.Parameter:
    """Return the Parameter ``module.<name>``, or explain why it cannot be pruned."""
    where = describe(module, name)
    if not isinstance(name, str):
        raise TypeError(f"{where}: the name must be a str, got {type(name).__name__}")
    param = module._parameters.get(name)
    if param is None:
        if name in module._buffers:
            raise TypeError(f"{where} is a buffer; only parameters can be pruned")
        if name.endswith(("_orig", "_mask")):
            raise TypeError(f"{where} belongs to an installed pruning; prune {name[:-5]!r}")
        names = sorted(module._parameters)
        raise AttributeError(f"{where} does not exist; parameters of this module: {names}")
    if not param.is_floating_point():
        raise TypeError(
            f"{where} has dtype {param.dtype}; only floating-point parameters can be pruned"
        )
    return param


def _scores(scores: Any, current: Tensor, where: str) -> Tensor:
    """Check importance scores against the tensor they rank; return them detached."""
    if type(scores).__module__.split(".")[0] != type(current).__module__.split(".")[0]:
        raise TypeError(
            f"{where}: importance_scores must be a tensor of the same framework as the "
            f"parameter, got {type(scores).__name__}"
        )
    if tuple(scores.shape) != tuple(current.shape):
        raise ValueError(
            f"{where}: importance_scores of shape {tuple(scores.shape)} do not match "
            f"the parameter's shape {tuple(current.shape)}"
        )
    if scores.device != current.device:
        raise ValueError(
            f"{where}: importance_scores are on {scores.device}, the parameter on "
            f"{current.device}; move them to the parameter's device"
        )
    result: Tensor = scores.detach()
    return result


def _checked_mask(mask: Any, current: Tensor, where: str) -> Tensor:
    """A computed mask as installed: same shape and dtype as the parameter, detached."""
    if tuple(mask.shape) != tuple(current.shape):
        raise ValueError(
            f"{where}: the pruning method returned a mask of shape {tuple(mask.shape)}, "
            f"expected {tuple(current.shape)}"
        )
    result: Tensor = mask.detach().to(dtype=current.dtype, device=current.device)
    if not result.is_contiguous():
        result = result.contiguous()
    return result
