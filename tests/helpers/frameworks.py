"""Framework: one framework under test (torch or tensorplay) and the helpers tests share."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch

FRAMEWORK_NAMES = ("torch", "tensorplay")


class Framework:
    """One framework under test, with the few helpers tests need on both.

    ``ns`` is the framework's top-level package; tensors move between
    frameworks through Python lists, which keeps float values exact.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.ns: ModuleType = (
            torch if name == "torch" else pytest.importorskip("tensorplay", minversion="1.0")
        )
        self.nn: Any = self.ns.nn

    def __repr__(self) -> str:
        return self.name

    def dtype(self, name: str) -> Any:
        """The framework's dtype called `name` ('float32', 'float64', ...)."""
        return getattr(self.ns, name)

    def tensor(self, data: Any, dtype: str = "float32") -> Any:
        """A tensor of this framework from nested lists or a tensor of either framework."""
        if hasattr(data, "tolist"):
            data = data.detach().tolist() if hasattr(data, "detach") else data.tolist()
        return self.ns.tensor(data, dtype=self.dtype(dtype))

    def equal(self, a: Any, b: Any) -> bool:
        """Same shape and same values (the framework-neutral torch.equal)."""
        return tuple(a.shape) == tuple(b.shape) and a.tolist() == b.tolist()

    def seed(self, value: int) -> None:
        self.ns.manual_seed(value)

    def randn(self, *shape: int, seed: int = 0) -> Any:
        """Reproducible float32 normal values (drawn with torch, so equal on both frameworks)."""
        generator = torch.Generator().manual_seed(seed)
        return self.tensor(torch.randn(*shape, generator=generator))

    def copy_parameters(self, source: Any, target: Any) -> None:
        """Copy the values of every parameter of module `source` into module `target`."""
        target_params = dict(target.named_parameters())
        for name, param in source.named_parameters():
            value = self.tensor(param, dtype=str(param.dtype).rsplit(".", 1)[-1])
            with self.ns.no_grad():
                target_params[name].copy_(value)
