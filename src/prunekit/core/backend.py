"""Which framework (torch or tensorplay) an object belongs to, and the few operations that differ.

Both frameworks share the PyTorch API, so the rest of the package calls tensor
methods directly and types them as ``torch.Tensor``; a tensorplay tensor passes
through the same code by duck typing. What is not shared lives here.
"""

from __future__ import annotations

import sys
import weakref
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from prunekit.core.errors import type_error

__all__ = [
    "FRAMEWORKS",
    "common_namespace",
    "dtype_name",
    "framework",
    "framework_caveat",
    "is_module",
    "is_tensor",
    "multiply_",
    "namespace",
    "norm",
    "seeded_rand",
]

FRAMEWORKS = ("torch", "tensorplay")


def framework(obj: Any) -> str:
    """Return ``'torch'`` or ``'tensorplay'``: the framework `obj`'s type comes from.

    Subclasses defined elsewhere (a user's ``nn.Module``) count as the framework
    of the class they derive from. Raises TypeError for anything else.
    """
    root = _root(type(obj))
    if root is not None:
        return root
    raise type_error(
        f"invalid object of type {type(obj).__module__}.{type(obj).__qualname__}; "
        "expected a torch or tensorplay tensor or module"
    )


_ROOTS: weakref.WeakKeyDictionary[type, str | None] = weakref.WeakKeyDictionary()


def _root(cls: type) -> str | None:
    """The framework `cls` derives from, or None; remembered per class (calls are frequent)."""
    try:
        return _ROOTS[cls]
    except KeyError:
        pass
    except TypeError:  # a class that cannot be hashed (or weakly referenced): not remembered
        return _find_root(cls)
    root = _ROOTS[cls] = _find_root(cls)
    return root


def _find_root(cls: type) -> str | None:
    modules = (c.__module__.partition(".")[0] for c in cls.__mro__)
    return next((m for m in modules if m in FRAMEWORKS), None)


def namespace(obj: Any) -> ModuleType:
    """Return the top-level package (torch or tensorplay) that `obj` belongs to."""
    if framework(obj) == "torch":
        return torch
    return sys.modules["tensorplay"]


def is_tensor(obj: Any) -> bool:
    """True for a tensor (Parameters included) of either framework."""
    if isinstance(obj, Tensor):
        return True
    root = _root(type(obj))
    return root == "tensorplay" and isinstance(obj, sys.modules["tensorplay"].Tensor)


def is_module(obj: Any) -> bool:
    """True for an ``nn.Module`` of either framework."""
    if isinstance(obj, torch.nn.Module):
        return True
    root = _root(type(obj))
    return root == "tensorplay" and isinstance(obj, sys.modules["tensorplay"].nn.Module)


def dtype_name(dtype: Any) -> str:
    """A dtype's name without its framework: ``'float32'`` for torch's and tensorplay's."""
    return str(dtype).rpartition(".")[2]


def framework_caveat(module: Any) -> str | None:
    """What a pruned `module` cannot be trusted to do on its framework, or None.

    tensorplay 1.0's ConvTranspose2d and ConvTranspose3d cache their weight's
    layout by memory address: a weight tensor computed afresh on every forward
    (as a pruned one is), landing where an earlier one lay, is served the
    earlier values. Unpruned layers are safe: their weight is updated in place.
    """
    if framework(module) != "tensorplay":
        return None
    names = {cls.__name__ for cls in type(module).__mro__ if _from_framework(cls)}
    if names & {"ConvTranspose2d", "ConvTranspose3d"}:
        return (
            "tensorplay 1.0's ConvTranspose2d/3d cache their weight by memory address, so a "
            "weight recomputed on each forward, as a pruned one is, can be served the values "
            "of an earlier one: outputs while pruned may be stale. Make the pruning permanent "
            "with remove() before relying on this layer's outputs"
        )
    return None


def _from_framework(cls: type) -> bool:
    """True if `cls` is defined by torch or tensorplay (not a user's subclass)."""
    return cls.__module__.partition(".")[0] in FRAMEWORKS


def common_namespace(where: str, /, **objects: Any) -> ModuleType:
    """Return the one framework of `objects` (None values skipped); raise if they mix two.

    The keyword names are how the error names the objects, e.g.
    ``common_namespace(where, module=m, importance_scores=s)``.
    """
    seen: dict[str, str] = {}
    for label, obj in objects.items():
        if obj is None:
            continue
        try:
            seen.setdefault(framework(obj), label)
        except TypeError:
            raise type_error(
                f"{where}: invalid {label} of type {type(obj).__name__}; "
                "expected a torch or tensorplay object"
            ) from None
    if len(seen) > 1:
        described = " but ".join(
            f"{label} is a {name} {_kind(objects[label])}" for name, label in seen.items()
        )
        raise type_error(
            f"{where}: cannot mix torch and tensorplay objects in one call: {described}; "
            "expected modules and tensors of one framework"
        )
    if not seen:
        raise type_error(f"{where}: no tensor or module given; expected a torch or tensorplay one")
    return torch if "torch" in seen else sys.modules["tensorplay"]


def _kind(obj: Any) -> str:
    """How an error names `obj`: 'tensor' for any tensor, else its class name."""
    return "tensor" if hasattr(obj, "shape") and hasattr(obj, "dtype") else type(obj).__name__


def multiply_(t: Tensor, other: Tensor) -> Tensor:
    """``t *= other`` in place; returns `t`.

    tensorplay 1.0's ``mul_`` with a tensor argument leaves `t` unchanged (with a
    number it works), so there the product is copied in instead.
    """
    if namespace(t) is torch:
        return t.mul_(other)
    return t.copy_(t * other)


def norm(t: Tensor, p: Any, dims: list[int]) -> Tensor:
    """The norm of `t` over `dims`: order `p` a number, ``'fro'`` or ``'nuc'`` (two dims).

    ``'fro'`` is the 2-norm of the entries over any number of dims, on both
    frameworks (tensorplay's ``norm`` takes numeric orders only). The nuclear
    norm needs a singular value decomposition, which neither framework runs
    below float32; see _nuclear_norm_numpy for tensorplay's.
    """
    ns = namespace(t)
    if p == "nuc":
        if t.dtype not in (ns.float32, ns.float64):
            raise type_error(
                f"n='nuc' takes a singular value decomposition, which cannot run on dtype "
                f"{t.dtype}; expected float32 or float64 values (or another norm order)"
            )
        if ns is torch:
            nuclear: Tensor = torch.linalg.matrix_norm(t, ord="nuc", dim=tuple(dims))
            return nuclear
        return _nuclear_norm_numpy(ns, t, dims)
    order = 2 if p == "fro" else p
    if ns is torch:
        vector: Tensor = torch.linalg.vector_norm(t, order, dim=dims)
        return vector
    # tensorplay's norm() agrees with torch's vector_norm to the last bit more
    # often than its own linalg.vector_norm does, so channel rankings match.
    result: Tensor = ns.norm(t, p=order, dim=dims)
    return result


def _nuclear_norm_numpy(ns: ModuleType, t: Tensor, dims: list[int]) -> Tensor:
    """The nuclear norm over `dims` of tensorplay tensor `t`, computed by numpy.

    tensorplay 1.0 finds LAPACK at its first decomposition by looking for an
    OpenBLAS loaded in the process; once scipy is imported it takes scipy's,
    which lacks the 64-bit interface it needs, and every decomposition fails
    from then on. numpy (a tensorplay dependency) has no such trouble.
    """
    import numpy as np  # noqa: PLC0415 (optional: tensorplay's dependency, not torch's)

    values = np.moveaxis(t.detach().numpy(), dims, (-2, -1))
    singular = np.linalg.svd(values, compute_uv=False)
    result: Tensor = ns.tensor(singular.sum(axis=-1).tolist(), dtype=t.dtype)
    return result


def seeded_rand(ns: ModuleType, count: int, seed: int, device: Any = None) -> Tensor:
    """`count` uniform values in [0, 1) that depend only on `seed`; the global RNG is untouched.

    torch draws from a Generator of its own. tensorplay 1.0 does not reproduce
    draws from a seeded Generator (and its ``Generator.manual_seed`` returns an
    int), so there the global RNG is seeded for the draw and restored after it.
    """
    if ns is torch:
        generator = torch.Generator(device=device).manual_seed(seed)
        return torch.rand(count, generator=generator, device=device)
    state = ns.get_rng_state()
    try:
        ns.manual_seed(seed)
        values: Tensor = ns.rand(count, device=device)
    finally:
        ns.set_rng_state(state)
    return values
