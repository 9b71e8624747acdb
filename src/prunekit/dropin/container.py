"""PruningContainer: the successive prunings of one tensor, and how a new one combines
with the mask the earlier ones left."""

from __future__ import annotations

from collections.abc import Iterator

from torch import Tensor

from prunekit.core.amount import validate_dim
from prunekit.core.backend import multiply_
from prunekit.core.errors import attribute_error, type_error, value_error
from prunekit.core.naming import TensorRef
from prunekit.dropin.base_method import BasePruningMethod, pruning_type

__all__ = ["PruningContainer", "combine_masks"]


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
