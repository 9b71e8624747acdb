"""The names a pruning gives a tensor's two parts: ``<name>_orig`` and ``<name>_mask``.

Every module, state_dict and checkpoint reader goes through here, so the suffixes are
written once.
"""

from __future__ import annotations

__all__ = ["MASK", "ORIG", "mask_name", "orig_name", "pruned_name"]

ORIG = "_orig"
MASK = "_mask"


def orig_name(name: str) -> str:
    """The Parameter holding the original values of pruned tensor `name`."""
    return name + ORIG


def mask_name(name: str) -> str:
    """The buffer holding the mask of pruned tensor `name`."""
    return name + MASK


def pruned_name(key: str, suffix: str | None = None) -> str | None:
    """The pruned tensor's name if `key` is one of its parts (with `suffix`: that part
    only), else None: ``'fc.weight_mask'`` -> ``'fc.weight'``."""
    for end in (ORIG, MASK) if suffix is None else (suffix,):
        if key.endswith(end) and len(key) > len(end):
            return key[: -len(end)]
    return None
