"""Which tensors of a model a GradualPruner prunes: include/exclude globs of parameter names.

The selection follows prune_model's arguments (``include=("*",)`` takes every
floating-point parameter of two or more dims, any other `include` selects by name, any
number of dims; `exclude` leaves names out), behind the one function `select_targets`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from prunekit.core.errors import type_error, value_error

__all__ = ["Target", "select_targets"]

ORIG, MASK = "_orig", "_mask"


@dataclass(frozen=True)
class Target:
    """One tensor to prune: its name in the model, and ``(module, leaf)`` where it lives."""

    name: str
    module: nn.Module
    leaf: str


def select_targets(model: nn.Module, include: Any, exclude: Any, owner: str) -> list[Target]:
    """The parameters of `model` that `include` and not `exclude` select, in model order.

    A pruned tensor is found under its own name (``fc.weight``, not ``fc.weight_orig``).
    A glob that matches no parameter, an empty selection and a parameter under two names
    (tied weights) are errors.
    """
    if not isinstance(model, nn.Module):
        raise type_error(
            f"{owner}: invalid model of type {type(model).__name__}; expected a torch nn.Module"
        )
    wanted = _globs(include, "include", owner)
    unwanted = _globs(exclude, "exclude", owner)
    found = _parameters(model, owner)
    names = [name for name, _ in found]
    for what, globs in (("include", wanted), ("exclude", unwanted)):
        for glob in globs:
            if glob != "*" and not any(fnmatch.fnmatchcase(n, glob) for n in names):
                raise value_error(
                    f"{owner}: {what} glob {glob!r} matches no floating-point parameter of "
                    f"{type(model).__name__}; expected globs of its names: {_listing(names)}"
                )
    chosen = []
    for name, (module, leaf, ndim) in found:
        picked = ndim >= 2 if wanted == ("*",) else _matches(name, wanted)
        if picked and not _matches(name, unwanted):
            chosen.append(Target(name, module, leaf))
    if not chosen:
        raise value_error(
            f"{owner}: include={wanted} and exclude={unwanted} leave no parameter of "
            f"{type(model).__name__} to prune; its parameters: {_listing(names)}"
        )
    return chosen


def _parameters(model: nn.Module, owner: str) -> list[tuple[str, tuple[nn.Module, str, int]]]:
    """(name, (module, leaf, dims)) of every floating-point parameter; ties refused."""
    found: list[tuple[str, tuple[nn.Module, str, int]]] = []
    seen: dict[int, str] = {}
    for path, module in model.named_modules(remove_duplicate=False):
        for pname, param in module._parameters.items():
            if param is None or not param.is_floating_point():
                continue
            leaf = pname[: -len(ORIG)] if pname.endswith(ORIG) else pname
            if leaf + MASK not in module._buffers:
                leaf = pname
            name = f"{path}.{leaf}" if path else leaf
            first = seen.get(id(param))
            if first is not None:
                if first == name:
                    continue  # the same module reached twice
                raise value_error(
                    f"{owner}: parameter {name!r} is the same Parameter as {first!r} (tied "
                    "weights); expected each parameter under one name (exclude one of them)"
                )
            seen[id(param)] = name
            found.append((name, (module, leaf, param.dim())))
    return found


def _globs(value: Any, what: str, owner: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, Iterable) or not all(isinstance(v, str) for v in value):
        raise type_error(
            f"{owner}: invalid {what}={value!r}; expected globs of parameter names "
            "(a str or a sequence of str), e.g. ('encoder.*',)"
        )
    return tuple(value)


def _matches(name: str, globs: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, g) for g in globs)


def _listing(names: Sequence[str]) -> str:
    shown = ", ".join(names[:8])
    return shown + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
