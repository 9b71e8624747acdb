"""Which framework a tensor or module belongs to, and that framework's namespace."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import torch

__all__ = ["namespace"]


def namespace(obj: Any) -> ModuleType:
    """Return the top-level package (torch or tensorplay) that `obj`'s type comes from."""
    root = type(obj).__module__.split(".", 1)[0]
    if root == "torch":
        return torch
    if root == "tensorplay":
        return sys.modules["tensorplay"]
    raise TypeError(
        f"expected a torch or tensorplay tensor or module, got {type(obj).__module__}."
        f"{type(obj).__qualname__}"
    )
