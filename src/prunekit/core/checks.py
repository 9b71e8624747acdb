"""Checks of the module and tensors a pruning call is given (wording: see errors.py).

Decisions: a Parameter under two names (tied weights) is refused wherever both names are
visible (one module, one global call, a parent given a dotted name), because pruning one
name would leave the other unmasked. Empty tensors are allowed, as in torch: a fraction
prunes 0 entries and a count must be 0.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.core.backend import common_namespace, is_module, is_tensor, namespace
from prunekit.core.errors import (
    attribute_error,
    describe,
    shown,
    type_error,
    value_error,
)
from prunekit.core.finite import all_finite
from prunekit.core.naming import MASK, ORIG, mask_name, orig_name, pruned_name

__all__ = [
    "as_float",
    "check_binary_mask",
    "check_finite",
    "check_free_names",
    "check_kind",
    "check_module",
    "check_rate",
    "check_scores",
    "check_seed",
    "is_attention_out_proj",
    "owner_of",
    "prunable_parameter",
    "refuse_empty_path",
    "refuse_float16",
    "refuse_meta",
    "refuse_not_finite",
    "refuse_shared",
    "refuse_ties",
]


def is_attention_out_proj(module: Any) -> bool:
    """True for a MultiheadAttention's out_proj, which its parent reads without calling it."""
    return type(module).__name__ == "NonDynamicallyQuantizableLinear"


def check_module(module: Any, name: Any) -> None:
    """`module` must be a module and `name` a str."""
    if not is_module(module):
        raise type_error(
            f"{describe(module, name)}: invalid module of type {type(module).__name__}; "
            "expected an nn.Module of torch or tensorplay"
        )
    if not isinstance(name, str):
        raise type_error(
            f"{describe(module, name)}: invalid name={name!r} of type {type(name).__name__}; "
            "expected a str naming a parameter"
        )


def owner_of(module: nn.Module, name: str) -> tuple[nn.Module, str]:
    """Split a dotted name: ``(mha, 'out_proj.weight')`` -> ``(mha.out_proj, 'weight')``."""
    check_module(module, name)
    if "." not in name:
        return module, name
    path, _, leaf = name.rpartition(".")
    try:
        owner = module.get_submodule(path)
    except AttributeError:
        children = [n for n, _ in module.named_modules() if n]
        raise attribute_error(
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
            raise type_error(
                f"{where} is None (the module was built without it); expected a tensor"
            )
        if name in module._buffers:
            raise type_error(
                f"{where} is a buffer; expected a parameter, one of {sorted(module._parameters)}"
            )
        if orig_name(name) in module._parameters:
            raise value_error(
                f"{where} is already reparameterized by a hook prunekit does not own "
                "(torch.nn.utils.prune?); expected a plain parameter: call that library's "
                "remove() first"
            )
        pruned = pruned_name(name)
        if pruned is not None and (
            orig_name(pruned) in module._parameters or mask_name(pruned) in module._buffers
        ):
            raise type_error(
                f"{where} belongs to an installed pruning; expected the pruned name {pruned!r}"
            )
        if name in module.__dict__ or name in module._modules:
            value = getattr(module, name)
            raise type_error(
                f"{where} is a {type(value).__name__}, not a parameter; "
                f"expected one of {sorted(module._parameters)}"
            )
        raise attribute_error(
            f"{where} does not exist; expected one of the module's parameters "
            f"{sorted(module._parameters)}"
        )
    if not param.is_floating_point():
        raise type_error(
            f"{where} has dtype {param.dtype}; expected a floating-point parameter "
            "(integer, bool and complex parameters cannot be pruned)"
        )
    check_kind(param, where, "the parameter", real=False)
    refuse_ties(module._parameters.items(), name, param, where)
    check_free_names(module, name, where)
    return param


def check_kind(value: Any, where: str, what: str, *, real: bool = True) -> None:
    """A tensor the caller gives (scores, a mask, a weight, a loss, a batch) must hold its
    values densely: refuse a meta tensor (a shape without values), a sparse one (a layout
    ranking and masking do not read) and, with `real`, a complex one (its imaginary part
    would be dropped). Anything that is not a torch tensor is left to the caller's checks.

    Raises:
        ValueError: a meta or sparse tensor, naming `where` and `what`.
        TypeError: a complex tensor where a real one is expected.
    """
    if not isinstance(value, Tensor):
        return
    if value.is_meta:
        raise value_error(
            f"{where}: {what} is a meta tensor (a shape without values); expected a dense "
            "tensor with values"
        )
    if value.layout != torch.strided:
        raise value_error(
            f"{where}: {what} is a sparse tensor ({value.layout}); expected a dense (strided) "
            "tensor: call .to_dense() first"
        )
    if real and value.is_complex():
        raise type_error(
            f"{where}: {what} has dtype {value.dtype}; expected a real dtype (a complex "
            "tensor would lose its imaginary part)"
        )


def refuse_ties(named: Iterable[tuple[str, Any]], name: str, param: Any, where: str) -> None:
    """Raise if `param` is also listed in `named` under another name (tied weights)."""
    for other, p in named:
        if p is param and other != name:
            raise value_error(
                f"{where} is the same Parameter as {other!r} of this module (tied weights); "
                "expected an untied parameter: pruning one name would leave the other unmasked"
            )


def check_free_names(module: nn.Module, name: str, where: str) -> None:
    """``<name>_orig`` and ``<name>_mask`` must not be taken by something else."""
    for suffix in (ORIG, MASK):
        taken = name + suffix
        if hasattr(module, taken):
            raise value_error(
                f"{where}: the module already has an attribute {taken!r}; expected that name "
                "free for the pruning to store the tensor's original values and mask"
            )


def check_scores(scores: Any, current: Tensor, where: str, mask: Tensor | None = None) -> Tensor:
    """Check importance scores against the tensor they rank; return them detached. With the
    tensor's `mask`, NaN only counts where it is 1: pruned entries never compete."""
    if not is_tensor(scores):
        raise type_error(
            f"{where}: invalid importance_scores of type {type(scores).__name__}; "
            f"expected a {type(current).__name__} shaped like the parameter"
        )
    common_namespace(where, parameter=current, importance_scores=scores)
    if scores.is_complex() or scores.dtype == namespace(current).bool:
        raise type_error(
            f"{where}: importance_scores have dtype {scores.dtype}; "
            "expected a real (floating-point or integer) dtype"
        )
    if tuple(scores.shape) != tuple(current.shape):
        raise value_error(
            f"{where}: importance_scores have shape {tuple(scores.shape)}; "
            f"expected the parameter's shape {tuple(current.shape)}"
        )
    if scores.device != current.device:
        raise value_error(
            f"{where}: importance_scores are on device {scores.device}; "
            f"expected the parameter's device {current.device}"
        )
    check_kind(scores, where, "importance_scores")
    result: Tensor = scores.detach()
    if result.is_floating_point():
        competing = result if mask is None else result.masked_fill(mask == 0, 0)
        check_finite(competing, where, "importance_scores", allow_inf=True)
    return result


def check_number(
    value: Any,
    name: str,
    owner: str,
    expected: str,
    allowed: Callable[[float], bool],
    *,
    integral: bool = False,
) -> None:
    """An argument that must be a number: TypeError unless `value` is a real number (an
    integer with `integral`; a bool is neither), ValueError unless ``allowed(value)`` (False
    for NaN, as every comparison is). Both messages name `owner`, `name` and the value, and
    end with `expected` ("a finite float > 0")."""
    kind = numbers.Integral if integral else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind):
        raise type_error(
            f"{owner}: invalid {name}={shown(value)} of type {type(value).__name__}; "
            f"expected {expected}"
        )
    if not allowed(as_float(value)):
        raise value_error(f"{owner}: invalid {name}={shown(value)}; expected {expected}")


SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.manual_seed takes


def check_seed(seed: Any, where: str, what: str = "seed") -> None:
    """Raise unless `seed` is None or an integer torch.manual_seed takes: an int or a numpy
    integer scalar, as check_number's integral arguments (a bool is neither). A caller that
    hands it to ``torch.Generator.manual_seed``, which takes no numpy integer, holds
    ``int(seed)``. The error begins with `where` (if any) and calls the seed `what`.

    Raises:
        TypeError: not an integer; ValueError: out of SEED_RANGE (both name `where` and
            `what`).
    """
    if seed is None:
        return
    low, high = SEED_RANGE
    allowed = f"expected an int in [-2**63, 2**64 - 1] = [{low}, {high}]"
    head = f"{where}: invalid {what}" if where else f"invalid {what}"
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise type_error(f"{head}={shown(seed)} of type {type(seed).__name__}; {allowed}")
    if not low <= int(seed) <= high:
        raise value_error(f"{head}={shown(seed)}, out of range; {allowed}")


def refuse_empty_path(owner: str, name: str, path: str | os.PathLike[str]) -> None:
    """Refuse an empty path: Path('') is the current folder, which an unset variable in
    ``-o "$OUT"`` would make the output (shrink's is replaced whole) or the input read.
    Check the path as given: once made a Path, an empty one reads '.'.

    Args:
        owner: what the error begins with ("ShrinkConfig"; "": nothing, as on the command
            line, where the command is put in front).
        name: the argument the path was given as ("out", "--out").
        path: the path as given.

    Raises:
        ValueError: an empty `path`, naming `owner` and `name`.
    """
    if not os.fspath(path):
        head = f"{owner}: invalid {name}" if owner else f"invalid {name}"
        raise value_error(
            f"{head}={path!r}; expected a path, not an empty one (give '.' for the current folder)"
        )


def refuse_shared(
    model: nn.Module,
    other: nn.Module,
    whose: str,
    head: str,
    tail: str,
    trained: Iterable[Tensor] | None = None,
) -> None:
    """Refuse a second model a call reads while it trains `model` (a teacher, a reference)
    that holds one of the parameters trained: each step would move it too. The one check of
    ``recover`` and ``reconstruct_blocks``, each naming itself and its parameter.

    Args:
        model: the model trained.
        other: the second model.
        whose: what the caller calls `model` ("student", "model").
        head: the error's start: the caller, its parameter and `other` in it
            ("recover: invalid distiller: its teacher").
        tail: the error's end: why, then what is expected ("which is trained here, ...;
            expected a copy ...").
        trained: the parameters trained; None: all of `model`'s.

    Raises:
        ValueError: ``<head> shares the parameter <name> with the <whose> (as its <name in
            other>), <tail>``, for the first shared parameter in `model`'s order.
    """
    held = None if trained is None else {id(p) for p in trained}
    theirs: dict[int, str] = {}
    for name, p in other.named_parameters():
        theirs.setdefault(id(p), name)
    for name, p in model.named_parameters():
        if id(p) in theirs and (held is None or id(p) in held):
            raise value_error(
                f"{head} shares the parameter {name!r} with the {whose} (as its "
                f"{theirs[id(p)]!r}), {tail}"
            )


def as_float(value: Any) -> float:
    """`value` as a float; one too large for a float (an int of hundreds of digits) as the
    infinity of its sign, which the range checks compare as they would it."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def refuse_meta(owner: str, model: nn.Module) -> None:
    """Refuse a model with a parameter or buffer on the meta device (no values to score,
    run or slice), naming the first.

    Raises:
        ValueError: a tensor of `model` on the meta device.
    """
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_meta:
            raise value_error(
                f"{owner}: model's {name} is on the meta device (it has no values); expected "
                "a model with its weights loaded (load_state_dict, from_pretrained)"
            )


def refuse_float16(owner: str, model: nn.Module, trained: Iterable[Tensor]) -> None:
    """Refuse float16 parameters among those a call trains with Adam (or AdamW): their
    squared gradients underflow to 0 in float16, the steps turn to inf and the weights to
    NaN. The message starts with `owner` and names the first one by its name in `model`.

    Raises:
        ValueError: a float16 parameter among `trained`.
    """
    held = {id(p) for p in trained}
    for name, p in model.named_parameters():
        if id(p) in held and p.dtype == torch.float16:
            raise value_error(
                f"{owner}: float16 parameters such as {name!r} cannot be trained here (Adam's "
                "squared gradients underflow to 0 in float16 and its steps turn to inf); "
                "expected float32 or bfloat16 parameters (model.float() first)"
            )


def check_rate(owner: str, lr: float, trained: Iterable[Tensor]) -> None:
    """Refuse a learning rate (checked finite and > 0 already) larger than the parameters
    `trained` hold: the optimizer's step size is stored in their dtype, and torch raises
    an overflow of its own in the middle of a step.

    Raises:
        ValueError: starting with `owner`, naming `lr`, the dtype and its largest value.
    """
    kinds = {p.dtype for p in trained if p.is_floating_point()}
    if not kinds:
        return
    narrowest = min(kinds, key=lambda kind: torch.finfo(kind).max)
    largest = torch.finfo(narrowest).max
    if as_float(lr) > largest:
        raise value_error(
            f"{owner}: invalid lr={shown(lr)}; expected a finite float > 0 that the "
            f"parameters trained ({narrowest}) hold: at most {largest:.4g}"
        )


def refuse_not_finite(owner: str, model: nn.Module, trained: Iterable[Tensor], when: str,
                      hint: str) -> None:  # fmt: skip
    """Refuse a training run whose last update left a parameter among `trained` holding
    NaN or inf (a learning rate too large, or NaN from the batches): an earlier update's
    shows in the next loss, which the run refuses. Only those the last step updated (with
    a gradient) are read: one the forward never uses is none of the run's doing.

    Raises:
        ValueError: starting with `owner`, naming the parameter (its name in `model`),
            `when` ("step 3, the last,") and ending with `hint`.
    """
    held = {id(p) for p in trained}
    for name, p in model.named_parameters():
        if id(p) in held and p.grad is not None and not all_finite(p.detach()):
            bad = p.detach()[~torch.isfinite(p.detach())].reshape(-1)[0]
            raise value_error(
                f"{owner}: {when} left the parameter {name!r} holding {float(bad)}; expected "
                f"finite parameters ({hint})"
            )


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
    raise value_error(
        f"{where}: the {what} hold {count} value(s) that cannot be ranked, e.g. {value} at "
        f"index {first}; expected {allowed}"
    )


def check_binary_mask(mask: Any, where: str) -> None:
    """A user mask must be a tensor holding only 0 and 1 (or False and True)."""
    if not hasattr(mask, "shape") or not hasattr(mask, "dtype"):
        raise type_error(
            f"{where}: invalid mask of type {type(mask).__name__}; "
            "expected a tensor of 0s and 1s shaped like the parameter"
        )
    if getattr(mask, "is_complex", lambda: False)():
        raise type_error(
            f"{where}: invalid mask of dtype {mask.dtype}; expected a real (bool, integer or "
            "floating-point) tensor of 0s and 1s (a complex one would lose its imaginary part)"
        )
    check_kind(mask, where, "the mask")
    bad = (mask != 0) & (mask != 1)
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        value = mask[first].item()
        raise value_error(
            f"{where}: the mask holds {int(bad.sum())} value(s) other than 0 and 1, "
            f"e.g. {value!r} at index {first}; expected only 0 and 1 (or False and True)"
        )
