"""BasePruningMethod: the contract every pruning method follows, and its forward pre-hook.

`apply` turns ``module.<name>`` into ``<name>_orig`` (the same Parameter), ``<name>_mask``
(a buffer) and a forward pre-hook (the method itself) that keeps ``module.<name>`` equal to
mask * orig (see install.py). PRUNING_TYPE is read when a method is composed with an
earlier pruning, as in torch: a class without it, or with another value, works for a first
pruning and is refused at composition.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.core.amount import validate_dim
from prunekit.core.backend import common_namespace, multiply_, namespace
from prunekit.core.errors import (
    attribute_error,
    describe,
    is_explained,
    naming,
    type_error,
    value_error,
)
from prunekit.core.naming import TensorRef, mask_name, orig_name
from prunekit.core.product import fusable
from prunekit.core.reuse import Reuse
from prunekit.dropin.copying import BoundToModule
from prunekit.dropin.hooks import PRUNING_TYPES, pruning_type
from prunekit.dropin.install import install
from prunekit.dropin.out_proj import watch_out_proj

__all__ = [
    "PRUNING_TYPES",
    "BasePruningMethod",
    "PruningBase",
    "PruningContainer",
    "TensorRef",
    "combine_masks",
    "pruning_type",
]


class BasePruningMethod(BoundToModule, ABC):
    """Base class of pruning methods; subclasses set PRUNING_TYPE and compute_mask().

    PRUNING_TYPE tells a PruningContainer which entries a later pruning ranks:
    'unstructured' the entries still unpruned, 'structured' the channels (along
    ``self.dim``) not yet fully pruned, 'global' all entries.

    Attributes:
        PRUNING_TYPE: ``"unstructured"``, ``"structured"`` or ``"global"``, set by each
            subclass.
        reuse_masked: whether a forward without gradients may reuse the product mask x orig
            it made before (True by default; ``prunekit.forward_reuse`` sets it).
    """

    PRUNING_TYPE: str
    _tensor_name: str | None = None
    reuse_masked: bool = True
    """Whether a forward without gradients may reuse ``module.<name>`` (see __call__)."""
    _reuse: Reuse | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        module = self._bound_module()
        if module is not None:
            watch_out_proj(module)  # in a process that loads a pruned out_proj

    def _composed(self, method: BasePruningMethod) -> PruningContainer:
        """The hook that holds this pruning and `method` after it (a new container)."""
        container = PruningContainer(self)
        container.add_pruning_method(method)
        return container

    def _combined_mask(self, t: Tensor, mask: Tensor, target: TensorRef = None) -> Tensor:
        """`mask` further pruned by this method on scores `t` (see combine_masks)."""
        return combine_masks(self, t, mask, target)

    def _masks_orig(self) -> bool:
        """Whether its masked tensor is mask * orig (``apply_mask`` not overridden)."""
        return type(self).apply_mask is BasePruningMethod.apply_mask

    def __call__(self, module: nn.Module, inputs: object) -> None:
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
        orig = getattr(module, orig_name(name))
        mask = getattr(module, mask_name(name))
        ns = namespace(orig)
        if not self.reuse_masked or (
            ns.is_grad_enabled() and (orig.requires_grad or mask.requires_grad)
        ):
            self._reuse = None
            setattr(module, name, self.apply_mask(module))
            return
        if self._reuse is not None and self._reuse.holds(orig, mask, module.__dict__.get(name)):
            return
        with ns.inference_mode(False), ns.no_grad():
            masked = self.apply_mask(module)
        setattr(module, name, masked)
        self._reuse = Reuse.of(orig, mask, masked)

    @abstractmethod
    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """Return the mask for scores `t`; entries zero in `default_mask` stay zero.

        Args:
            t: the scores: the tensor's values, or the importance scores given for it.
            default_mask: the mask so far (ones for a tensor not pruned yet), shaped like
                `t`.

        Returns:
            A mask of 0s and 1s shaped like `t`, in the dtype of `default_mask`.
        """

    def apply_mask(self, module: nn.Module) -> Tensor:
        """Return mask * orig for the tensor this method prunes in `module`.

        Args:
            module: the module holding ``<name>_orig`` and ``<name>_mask``.

        Returns:
            The masked tensor, in the dtype of ``<name>_orig``.
        """
        name = self._require_name()
        mask = getattr(module, mask_name(name))
        orig = getattr(module, orig_name(name))
        result: Tensor = mask.to(dtype=orig.dtype) * orig
        return result

    @classmethod
    def apply(
        cls,
        module: nn.Module,
        name: str,
        *args: object,
        importance_scores: Tensor | None = None,
        **kwargs: object,
    ) -> BasePruningMethod:
        """Prune ``module.<name>`` with ``cls(*args, **kwargs)``; return the hook installed.

        If the tensor is already pruned, the new method is composed with the
        old one in a PruningContainer, which is returned instead.

        Args:
            module: the module holding the tensor.
            name: the tensor's name in `module` (``'weight'``).
            *args: the method's constructor arguments (``amount``, ...).
            importance_scores: scores to rank by instead of the tensor's values, shaped
                like it; None ranks the values.
            **kwargs: the method's constructor arguments by name.

        Returns:
            The hook installed on `module`: the method, or the PruningContainer that holds
            it.
        """
        method = construct(cls, args, kwargs, describe(module, name))
        return install(module, name, method, importance_scores)

    def prune(
        self,
        t: Tensor,
        default_mask: Tensor | None = None,
        importance_scores: Tensor | None = None,
    ) -> Tensor:
        """Return `t` pruned by this method, without touching any module.

        Args:
            t: the tensor to prune.
            default_mask: the mask so far, shaped like `t`; None: ones.
            importance_scores: scores to rank by instead of `t`'s values, shaped like `t`.

        Returns:
            `t` times the mask computed.

        Raises:
            ValueError: `importance_scores` is not shaped like `t`.
        """
        ns = common_namespace(
            f"{type(self).__name__}.prune",
            t=t,
            default_mask=default_mask,
            importance_scores=importance_scores,
        )
        scores = t if importance_scores is None else importance_scores
        if tuple(scores.shape) != tuple(t.shape):
            raise value_error(
                f"{type(self).__name__}.prune: importance_scores have shape "
                f"{tuple(scores.shape)}; expected the tensor's shape {tuple(t.shape)}"
            )
        if default_mask is None:
            default_mask = ns.ones_like(t)
        return t * self.compute_mask(scores, default_mask=default_mask)

    # -- Shortcuts the built-in methods take (a user's method need not know them) ------

    def _compute_mask(self, t: Tensor, default_mask: Tensor, target: TensorRef) -> Tensor:
        """compute_mask, told which (module, name) the scores belong to where known."""
        return self.compute_mask(t, default_mask)

    def _fuses_products(self) -> bool:
        """Whether _choose can also write each tensor times its mask (its `products`)."""
        return False

    def _choose(
        self,
        scores: Sequence[Tensor],
        masks: Sequence[Tensor | None],
        keep_dtype: Any = None,
        products: Sequence[Tensor | None] | None = None,
        targets: Sequence[TensorRef] | None = None,
    ) -> Iterator[Tensor] | None:
        """The entries an 'unstructured' method prunes, without gathering them.

        Yields one flat bool selection per tensor of `scores` (True = pruned), all
        ranked together as if concatenated, each only where its mask is 1
        (everywhere for None); with `keep_dtype`, 0/1 of that dtype (1 = kept).
        None when the method has no such shortcut: callers then gather
        ``t[mask == 1]`` and call compute_mask (a method that only writes
        compute_mask goes that way; one built from a Criterion does not).

        `products` is for methods whose _fuses_products() is True: per tensor, None or
        a flat torch tensor of `keep_dtype` to receive the scores times the mask, by the
        time that mask is yielded (only for scores that are the tensor's own values,
        with no mask: then it is ``module.<name>``). `targets`: the (module, name) of
        each tensor, for criteria that rank by what they know of it.
        """
        return None

    def _refuse_unrankable(self, t: Tensor, mask: Tensor, target: TensorRef = None) -> None:
        """Where ``_choose`` gave None for `t` because its selection found NaN or infinity
        among the entries that compete: raise the error that names the first, read on the
        tensor's own scores. The default does nothing (the caller then gathers the entries
        that compete and calls compute_mask on them).

        Args:
            t: the tensor's values, or the importance scores given for it.
            mask: its mask so far (1 where its entries still compete).
            target: the tensor's ``(module, name)`` where known.
        """

    def _first_mask(self, scores: Tensor, dtype: Any, target: TensorRef = None) -> Tensor | None:
        """``compute_mask(scores, ones)`` in `dtype`, made without building the ones.

        None when the method has no such shortcut (install then builds the ones).
        """
        kept = self._choose([scores], [None], keep_dtype=dtype, targets=[target])
        return None if kept is None else next(kept).reshape(scores.shape)

    def _first_masked(
        self, scores: Tensor, dtype: Any, target: TensorRef = None
    ) -> tuple[Tensor | None, Tensor | None]:
        """``_first_mask`` and, when the method writes it in the same pass, mask * scores
        (contiguous; else None). For scores that are the tensor's own values."""
        if not (self._fuses_products() and fusable(scores, dtype)):
            return self._first_mask(scores, dtype, target), None
        product = torch.empty(scores.shape, dtype=dtype)
        kept = self._choose(
            [scores], [None], keep_dtype=dtype, products=[product.view(-1)], targets=[target]
        )
        if kept is None:
            return self._first_mask(scores, dtype, target), None
        return next(kept).reshape(scores.shape), product

    def remove(self, module: nn.Module) -> None:
        """Make the pruning permanent: write apply_mask() (mask * orig) into ``<name>``.

        The Parameter object is the one that was pruned, so optimizers holding it
        keep working. ``<name>_orig`` and ``<name>_mask`` are dropped; the hook is
        not (functional.remove() drops it).

        Args:
            module: the module holding the tensor this method pruned.

        Raises:
            ValueError: `module` holds no ``<name>_orig`` and ``<name>_mask``.
        """
        name = self._require_name()
        orig = module._parameters.get(orig_name(name))
        mask = module._buffers.get(mask_name(name))
        if orig is None or mask is None:
            raise value_error(
                f"{describe(module, name)} is not pruned (no {orig_name(name)!r} and "
                f"{mask_name(name)!r}); expected a tensor this method pruned"
            )
        self._reuse = None
        with namespace(orig).no_grad():
            if type(self).apply_mask is BasePruningMethod.apply_mask:
                multiply_(orig, mask.to(dtype=orig.dtype))
            else:  # a method that computes its values its own way: keep them, as torch does
                orig.copy_(self.apply_mask(module))
        module.__dict__.pop(name, None)
        del module._parameters[orig_name(name)]
        del module._buffers[mask_name(name)]
        # setattr, not register_parameter: RNN modules keep their own list of weights.
        setattr(module, name, orig)

    def _require_name(self) -> str:
        if self._tensor_name is None:
            raise RuntimeError(
                f"{type(self).__name__} is not attached to a tensor yet; "
                "install it with apply() first"
            )
        return self._tensor_name


PruningBase = BasePruningMethod
"""Another name of ``BasePruningMethod``, the same class."""


def construct(cls: type[BasePruningMethod], args: Any, kwargs: Any, where: str) -> Any:
    """``cls(*args, **kwargs)``; errors about those arguments name `where`.

    Errors of the call itself (an unknown keyword) and prunekit's own checks get `where`
    in front; anything else a constructor raises travels as it is.
    """
    try:
        with naming(where):
            return cls(*args, **kwargs)
    except TypeError as error:
        tb = error.__traceback__
        if not is_explained(error) and tb is not None and tb.tb_next is None:
            raise type_error(f"{where}: {error}") from None  # the call's own arguments
        raise


class PruningContainer(BasePruningMethod):
    """The successive prunings of one tensor, in the order they were applied.

    Its mask is the last method's mask computed on the part of the tensor the
    previous ones left, as that method's PRUNING_TYPE defines.

    Args:
        *methods: the methods already applied to the tensor, oldest first; all must prune
            the same tensor (``add_pruning_method`` checks each).

    Attributes:
        PRUNING_TYPE: ``"global"``: a pruning added later sees the whole tensor.
    """

    PRUNING_TYPE = "global"

    def __init__(self, *methods: BasePruningMethod) -> None:
        self._pruning_methods: tuple[BasePruningMethod, ...] = ()
        if methods:
            self._tensor_name = methods[0]._tensor_name
        for method in methods:
            self.add_pruning_method(method)

    def add_pruning_method(self, method: BasePruningMethod) -> None:
        """Append `method`, which must prune the same tensor as the container.

        Args:
            method: a pruning method applied to the container's tensor after the others.

        Raises:
            TypeError: `method` is no BasePruningMethod.
            ValueError: `method` prunes another tensor than the container's.
        """
        if not isinstance(method, BasePruningMethod):
            raise type_error(
                f"PruningContainer: invalid method of type {type(method).__name__}; "
                "expected a BasePruningMethod instance"
            )
        if method._tensor_name != self._tensor_name:
            raise value_error(
                f"PruningContainer holds methods for {self._tensor_name!r}, "
                f"cannot add one for {method._tensor_name!r}; expected a method pruning "
                f"{self._tensor_name!r}"
            )
        self._pruning_methods += (method,)

    def _composed(self, method: BasePruningMethod) -> PruningContainer:
        self.add_pruning_method(method)
        return self

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
            raise value_error("PruningContainer is empty: add a pruning method first")
        mask = combine_masks(self._pruning_methods[-1], t, default_mask)
        return mask if mask.dtype == t.dtype else mask.to(dtype=t.dtype)


def combine_masks(
    method: BasePruningMethod, t: Tensor, mask: Tensor, target: TensorRef = None
) -> Tensor:
    """Return a new mask: `mask` further pruned by `method` on scores `t`.

    'unstructured' methods see only the entries where `mask` is 1, 'structured'
    ones only the channels along ``method.dim`` that still hold a 1, 'global'
    ones everything. The result has the dtype of `mask`.
    """
    kind = pruning_type(method)
    if kind == "global":
        return method._compute_mask(t, mask.clone(), target).to(dtype=mask.dtype)
    if kind == "unstructured":
        kept = method._choose([t], [mask], keep_dtype=mask.dtype, targets=[target])
        if kept is not None:
            return multiply_(next(kept).reshape(t.shape), mask)
        # None: scores it could not rank, named on the whole tensor; gathered flat, they
        # could not be scored by a criterion that scores by shape (Taylor's, Wanda's)
        method._refuse_unrankable(t, mask, target)
    new_mask = mask.clone()
    if kind == "unstructured":
        keep = mask == 1
        partial = method._compute_mask(t[keep], mask[keep], target)
        new_mask[keep] = partial.to(dtype=mask.dtype)
        return new_mask
    dim = getattr(method, "dim", None)
    if dim is None:
        raise attribute_error(
            f"{type(method).__name__} has PRUNING_TYPE 'structured' but no attribute "
            "'dim' saying which axis holds the channels"
        )
    dim = validate_dim(dim, t.dim(), type(method).__name__)
    others = [d for d in range(t.dim()) if d != dim]
    alive = mask.sum(dim=others) != 0
    index = (slice(None),) * dim + (alive,)
    partial = method._compute_mask(t[index], mask[index], target)
    new_mask[index] = partial.to(dtype=mask.dtype)
    return new_mask
