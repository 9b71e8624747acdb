"""Imports of optional dependencies, with an error that says which extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require"]


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import `module`, or raise ImportError saying ``pip install 'prunekit[<extra>]'``."""
    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.split(".", 1)[0]
        raise ImportError(
            f"{purpose} needs the package {top!r}, which is not installed; "
            f"install it with: pip install 'prunekit[{extra}]'"
        ) from None
