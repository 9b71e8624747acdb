"""Checks of the module and tensors a pruning call is given, and the rollback of a failed call.

Every error reads ``<where>: <what is wrong, with the bad value>; expected <what is allowed>``,
where ``<where>`` names the module and the parameter (see describe()).
Warnings point at the user's line, however deep the call (see warn_caller()).

Decisions: a Parameter under two names (tied weights) is refused wherever both names are
visible (one module, one global call, a parent given a dotted name), because pruning one
name would leave the other unmasked. Empty tensors are allowed, as in torch: a fraction
prunes 0 entries and a count must be 0.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterable
from typing import Any

from torch import Tensor, nn

from prunekit.core.backend import common_namespace, is_module, is_tensor, namespace
from prunekit.select import all_finite

__all__ = [
    "Snapshot",
    "check_binary_mask",
    "check_finite",
    "check_free_names",
    "check_module",
    "check_scores",
    "describe",
    "is_attention_out_proj",
    "prunable_parameter",
    "refuse_ties",
    "resolve",
    "warn_caller",
    "with_context",
]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # prunekit/


def describe(module: Any, name: Any) -> str:
    """How errors name a tensor: ``parameter 'weight' of Linear``."""
    return f"parameter {name!r} of {type(module).__name__}"


def with_context(error: Exception, where: str) -> Exception:
    """Return `error` with `where` put in front of its message, if its type allows."""
    if type(error) in (TypeError, ValueError, IndexError, AttributeError):
        return type(error)(f"{where}: {error}")
    return error


def warn_caller(message: str) -> None:
    """Warn, pointing at the first line outside prunekit: the user's call, however deep."""
    frame = sys._getframe(1)
    level = 2  # stacklevel 2 is this function's caller
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(
        _PACKAGE
    ):
        frame = frame.f_back
        level += 1
    warnings.warn(message, UserWarning, stacklevel=level)


def is_attention_out_proj(module: Any) -> bool:
    """True for a MultiheadAttention's out_proj, which its parent reads without calling it."""
    return type(module).__name__ == "NonDynamicallyQuantizableLinear"


def check_module(module: Any, name: Any) -> None:
    """`module` must be a module and `name` a str."""
    if not is_module(module):
        raise TypeError(
            f"{describe(module, name)}: invalid module of type {type(module).__name__}; "
            "expected an nn.Module of torch or tensorplay"
        )
    if not isinstance(name, str):
        raise TypeError(
            f"{describe(module, name)}: invalid name={name!r} of type {type(name).__name__}; "
            "expected a str naming a parameter"
        )


def resolve(module: nn.Module, name: str) -> tuple[nn.Module, str]:
    """Split a dotted name: ``(mha, 'out_proj.weight')`` -> ``(mha.out_proj, 'weight')``."""
    check_module(module, name)
    if "." not in name:
        return module, name
    path, _, leaf = name.rpartition(".")
    try:
        owner = module.get_submodule(path)
    except AttributeError:
        children = [n for n, _ in module.named_modules() if n]
        raise AttributeError(
            f"{describe(module, name)}: there is no submodule {path!r}; expected one of {children}"
        ) from None
    return owner, leaf


def prunable_parameter(module: nn.Module, name: str, where: str | None = None) -> nn.Parameter:
    """Return the Parameter ``module.<name>``, or explain why it cannot be pruned.

    Its names ``<name>_orig`` and ``<name>_mask`` must be free too (see check_free_names).
    """
    where = where or describe(module, name)
    param = module._parameters.get(name)
    if param is None:
        if name in module._parameters:
            raise TypeError(f"{where} is None (the module was built without it); expected a tensor")
        if name in module._buffers:
            raise TypeError(
                f"{where} is a buffer; expected a parameter, one of {sorted(module._parameters)}"
            )
        if name + "_orig" in module._parameters:
            raise ValueError(
                f"{where} is already reparameterized by a hook prunekit does not own "
                "(torch.nn.utils.prune?); expected a plain parameter: call that library's "
                "remove() first"
            )
        if name.endswith(("_orig", "_mask")):
            raise TypeError(
                f"{where} belongs to an installed pruning; expected the pruned name {name[:-5]!r}"
            )
        if name in module.__dict__ or name in module._modules:
            value = getattr(module, name)
            raise TypeError(
                f"{where} is a {type(value).__name__}, not a parameter; "
                f"expected one of {sorted(module._parameters)}"
            )
        raise AttributeError(
            f"{where} does not exist; expected one of the module's parameters "
            f"{sorted(module._parameters)}"
        )
    if not param.is_floating_point():
        raise TypeError(
            f"{where} has dtype {param.dtype}; expected a floating-point parameter "
            "(integer, bool and complex parameters cannot be pruned)"
        )
    refuse_ties(module._parameters.items(), name, param, where)
    check_free_names(module, name, where)
    return param


def refuse_ties(named: Iterable[tuple[str, Any]], name: str, param: Any, where: str) -> None:
    """Raise if `param` is also listed in `named` under another name (tied weights)."""
    for other, p in named:
        if p is param and other != name:
            raise ValueError(
                f"{where} is the same Parameter as {other!r} of this module (tied weights); "
                "expected an untied parameter: pruning one name would leave the other unmasked"
            )


def check_free_names(module: nn.Module, name: str, where: str) -> None:
    """``<name>_orig`` and ``<name>_mask`` must not be taken by something else."""
    for suffix in ("_orig", "_mask"):
        taken = name + suffix
        if hasattr(module, taken):
            raise ValueError(
                f"{where}: the module already has an attribute {taken!r}; expected that name "
                "free for the pruning to store the tensor's original values and mask"
            )


def check_scores(scores: Any, current: Tensor, where: str) -> Tensor:
    """Check importance scores against the tensor they rank; return them detached."""
    if not is_tensor(scores):
        raise TypeError(
            f"{where}: invalid importance_scores of type {type(scores).__name__}; "
            f"expected a {type(current).__name__} shaped like the parameter"
        )
    common_namespace(where, parameter=current, importance_scores=scores)
    if scores.is_complex() or scores.dtype == namespace(current).bool:
        raise TypeError(
            f"{where}: importance_scores have dtype {scores.dtype}; "
            "expected a real (floating-point or integer) dtype"
        )
    if tuple(scores.shape) != tuple(current.shape):
        raise ValueError(
            f"{where}: importance_scores have shape {tuple(scores.shape)}; "
            f"expected the parameter's shape {tuple(current.shape)}"
        )
    if scores.device != current.device:
        raise ValueError(
            f"{where}: importance_scores are on device {scores.device}; "
            f"expected the parameter's device {current.device}"
        )
    if scores.is_floating_point():
        check_finite(scores, where, "importance_scores", allow_inf=True)
    result: Tensor = scores.detach()
    return result


def check_finite(t: Tensor, where: str, what: str, allow_inf: bool = False) -> None:
    """Raise ValueError if `t` holds NaN (or infinity, unless allowed): they cannot be ranked."""
    if not t.is_floating_point() or all_finite(t):
        return
    ns = namespace(t)
    bad = ns.isnan(t) if allow_inf else ~ns.isfinite(t)
    count = int(bad.sum())
    if count == 0:
        return
    first = tuple(int(i) for i in bad.nonzero()[0])
    value = float(t.detach()[first])
    allowed = "values that are not NaN" if allow_inf else "finite values"
    raise ValueError(
        f"{where}: the {what} hold {count} value(s) that cannot be ranked, e.g. {value} at "
        f"index {first}; expected {allowed}"
    )


def check_binary_mask(mask: Any, where: str) -> None:
    """A user mask must be a tensor holding only 0 and 1 (or False and True)."""
    if not hasattr(mask, "shape") or not hasattr(mask, "dtype"):
        raise TypeError(
            f"{where}: invalid mask of type {type(mask).__name__}; "
            "expected a tensor of 0s and 1s shaped like the parameter"
        )
    bad = (mask != 0) & (mask != 1)
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        value = mask[first].item()
        raise ValueError(
            f"{where}: the mask holds {int(bad.sum())} value(s) other than 0 and 1, "
            f"e.g. {value!r} at index {first}; expected only 0 and 1 (or False and True)"
        )


class Snapshot:
    """What a pruning call may change on a module, to put back exactly if the call fails."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.parameters = dict(module._parameters)
        self.buffers = dict(module._buffers)
        self.hooks = dict(module._forward_pre_hooks)
        self.load_hooks = dict(module._load_state_dict_post_hooks)
        self.tensors = {k: v for k, v in module.__dict__.items() if is_tensor(v)}
        self.methods = {
            key: hook._pruning_methods
            for key, hook in self.hooks.items()
            if hasattr(hook, "_pruning_methods")
        }
        flat = module.__dict__.get("_flat_weights")
        self.flat_weights = list(flat) if isinstance(flat, list) else None

    def restore(self) -> None:
        """Put back the dicts' contents (same dict objects, same order) and attributes."""
        m = self.module
        m._parameters.clear()
        m._parameters.update(self.parameters)
        m._buffers.clear()
        m._buffers.update(self.buffers)
        m._forward_pre_hooks.clear()
        m._forward_pre_hooks.update(self.hooks)
        m._load_state_dict_post_hooks.clear()
        m._load_state_dict_post_hooks.update(self.load_hooks)
        for name in [k for k, v in m.__dict__.items() if is_tensor(v)]:
            if name not in self.tensors:
                del m.__dict__[name]
        m.__dict__.update(self.tensors)
        for key, methods in self.methods.items():
            hook: Any = self.hooks[key]
            hook._pruning_methods = methods
        if self.flat_weights is not None:
            m.__dict__["_flat_weights"][:] = self.flat_weights
