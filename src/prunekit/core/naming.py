"""The names a pruning gives a tensor's two parts: ``<name>_orig`` and ``<name>_mask``.

Every module, state_dict and checkpoint reader goes through here, so the suffixes are
written once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import Tensor, nn

__all__ = [
    "MASK",
    "ORIG",
    "Entry",
    "TensorRef",
    "entries",
    "mask_name",
    "orig_name",
    "pruned_name",
    "stored_parameter",
]

TensorRef = tuple[nn.Module, str] | None
"""The (module, name) a tensor being ranked belongs to, where known (None in prune())."""

ORIG = "_orig"
MASK = "_mask"


def orig_name(name: str) -> str:
    """The Parameter holding the original values of pruned tensor `name`."""
    return name + ORIG


def mask_name(name: str) -> str:
    """The buffer holding the mask of pruned tensor `name`."""
    return name + MASK


def stored_parameter(module: nn.Module, name: str) -> nn.Parameter | None:
    """The Parameter holding the values of ``module.<name>``: ``<name>_orig`` where it is
    pruned, else ``<name>`` itself; None where `name` is a buffer, another attribute, or a
    parameter set to None (a Linear's absent bias)."""
    found = module._parameters.get(orig_name(name))
    return found if found is not None else module._parameters.get(name)


def pruned_name(key: str, suffix: str | None = None) -> str | None:
    """The pruned tensor's name if `key` is one of its parts (with `suffix`: that part
    only), else None: ``'fc.weight_mask'`` -> ``'fc.weight'``."""
    for end in (ORIG, MASK) if suffix is None else (suffix,):
        if key.endswith(end) and len(key) > len(end):
            return key[: -len(end)]
    return None


@dataclass(frozen=True)
class Entry:
    """One tensor of a state_dict by its name in the model; `mask` is None if not pruned."""

    name: str
    tensor: Tensor
    mask: Tensor | None = None


def entries(state: Mapping[str, Tensor]) -> list[Entry]:
    """The tensors of `state` in order; a ``<n>_orig``/``<n>_mask`` pair is one entry ``<n>``."""
    result = []
    for key, value in state.items():
        orig_of = pruned_name(key, ORIG)
        mask_of = pruned_name(key, MASK)
        if orig_of is not None and mask_name(orig_of) in state:
            result.append(Entry(orig_of, value, state[mask_name(orig_of)]))
        elif not (mask_of is not None and orig_name(mask_of) in state):
            result.append(Entry(key, value))
    return result
