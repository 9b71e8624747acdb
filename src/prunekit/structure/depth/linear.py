"""A removed span of blocks replaced by one linear map, folded into the block before it.

In a pre-norm residual block the last projection (an MLP's ``down_proj``) is added to the
residual stream: ``h_out = y + m`` with ``m = down_proj(...)``. Following ReplaceMe
(Shopkhoev et al., 2025), the span ``[s, e)`` is replaced by a map ``T`` (hidden x hidden)
applied to that ``m`` of block ``s - 1``: ``y + m T`` should be what the span gave, so ``T``
solves the least-squares problem ``min ||m T - (h_e - y)||^2 + ridge ||T||^2`` over the
calibration tokens (normal equations in float64, the ridge relative to the mean of
``diag(m^T m)``). Then ``down_proj(x) T`` is ``down_proj`` with weight ``T^T W`` and bias
``b T``: the fold is exact, the model keeps its classes, shapes and config, and adds no
parameter. What is approximate is the fit itself (a linear stand-in for the span).

The fold needs the block before the span to add that projection to its output as it is.
Before fitting, this is checked on the first batch: doubling the projection's output must
add it once more to the block's output. A post-norm block (BERT's: LayerNorm after the
residual add) fails the check, and the replacement is refused for it; so is a span that
starts at the first block (no block before it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from prunekit.calibrate import cacheless, evaluating
from prunekit.core.errors import value_error
from prunekit.core.naming import mask_name, orig_name, stored_parameter
from prunekit.structure.depth.blocks import BlockList, hidden_in, hidden_out
from prunekit.structure.depth.states import rows, run_one, token_mask

__all__ = [
    "Replacement",
    "drop",
    "fit_map",
    "fold",
    "fold_problem",
    "install",
    "is_projection",
    "replacement_of",
    "solve",
]

_REPLACE = "_prunekit_replace"


@dataclass
class Replacement:
    """The map a Linear's output goes through until ``fold`` makes it part of its weight."""

    handle: RemovableHandle
    map: Tensor  # hidden x hidden, float64


def replacement_of(linear: nn.Module) -> Replacement | None:
    found = getattr(linear, _REPLACE, None)
    return found if isinstance(found, Replacement) else None


def install(linear: nn.Module, map: Tensor) -> None:
    """Make `linear`'s output go through `map` (until ``fold``)."""

    def hook(module: nn.Module, args: Any, output: Tensor) -> Tensor:
        return output @ map.to(dtype=output.dtype, device=output.device)

    setattr(linear, _REPLACE, Replacement(linear.register_forward_hook(hook), map))


def drop(module: nn.Module) -> None:
    """Undo ``install`` (nothing if `module` has no map)."""
    found = replacement_of(module)
    if found is not None:
        found.handle.remove()
        delattr(module, _REPLACE)


def is_projection(module: nn.Module) -> bool:
    """An nn.Linear, or Hugging Face's Conv1D (GPT-2: a Linear with its weight in x out)."""
    return isinstance(module, nn.Linear) or (
        type(module).__name__ == "Conv1D" and getattr(module, "weight", None) is not None
    )


def _out_dim(linear: nn.Module) -> int:
    """The dimension of `linear`'s weight that the map mixes (its outputs): 0 for a Linear
    (out x in), 1 for Conv1D (in x out)."""
    return 0 if isinstance(linear, nn.Linear) else 1


def fold_problem(linear: nn.Module, name: str) -> str | None:
    """Why `linear`'s map cannot be folded exactly into its pruned (masked) weight or bias,
    else None. The map mixes the outputs, so a mask folds through it only where it is the
    same for every output: ``T^T (W * M) = (T^T W) * M`` when each input's mask entries agree
    across the outputs (an input channel pruned whole); a bias must then be unmasked."""
    mask = getattr(linear, mask_name("weight"), None)
    if isinstance(mask, Tensor):
        dim = _out_dim(linear)
        first = mask.select(dim, 0).unsqueeze(dim)
        if not bool((mask == first).all()):
            return (
                f"{name}.weight is pruned with a mask that differs between its outputs (the "
                "hidden width, or single weights), which a map mixing those outputs cannot "
                "keep; expected only whole input channels pruned there"
            )
    bias_mask = getattr(linear, mask_name("bias"), None)
    if isinstance(bias_mask, Tensor) and not bool((bias_mask != 0).all()):
        return f"{name}.bias is pruned, and a map mixing the outputs cannot keep its mask"
    return None


def fold(linear: nn.Module) -> None:
    """Make `linear`'s map part of its weight and bias (new Parameters) and drop the hook.
    A pruned tensor takes the map in ``<name>_orig`` (its mask stays; see `fold_problem`,
    which must have found nothing) and its masked value is made again."""
    found = replacement_of(linear)
    assert found is not None
    weight = stored_parameter(linear, "weight")
    assert weight is not None
    mapped = weight.double() @ found.map if _out_dim(linear) else found.map.T @ weight.double()
    _replace(linear, "weight", mapped.to(weight.dtype), weight.requires_grad)
    bias = stored_parameter(linear, "bias")
    if bias is not None:
        values = (bias.double() @ found.map.to(bias.device)).to(bias.dtype)
        _replace(linear, "bias", values, bias.requires_grad)
    found.handle.remove()
    delattr(linear, _REPLACE)


def _replace(linear: nn.Module, name: str, values: Tensor, grad: bool) -> None:
    """Give ``linear.<name>`` new values: a new Parameter (in ``<name>_orig`` and the masked
    value made again where it is pruned)."""
    if orig_name(name) in linear._parameters:
        linear._parameters[orig_name(name)] = nn.Parameter(values, requires_grad=grad)
        mask = getattr(linear, mask_name(name))
        setattr(linear, name, mask.to(dtype=values.dtype) * linear._parameters[orig_name(name)])
    else:
        setattr(linear, name, nn.Parameter(values, requires_grad=grad))


def solve(gram: Tensor, cross: Tensor, ridge: float) -> Tensor:
    """``argmin ||M T - R||^2 + lam ||T||^2`` from ``M^T M`` and ``M^T R`` (float64), where
    ``lam = ridge x mean(diag(M^T M))``; the least-norm solution where it is singular."""
    damp = ridge * float(gram.diagonal().mean()) if gram.numel() else 0.0
    damped = gram + damp * torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    solution: Tensor = torch.linalg.lstsq(damped, cross, driver="gelsd").solution
    return solution


def _last_projection(block: nn.Module, hidden: Tensor, seen: list[tuple[nn.Module, Tensor]],
                     where: str, owner: str) -> tuple[nn.Module, Tensor]:  # fmt: skip
    """The projection of `block` that finished last with an output of the hidden state's
    shape."""
    for linear, output in reversed(seen):
        if output.shape == hidden.shape:
            return linear, output
    raise value_error(
        f"{owner}: replace='linear' folds the map into the last projection of {where} "
        f"({type(block).__name__}), which has no nn.Linear (or Conv1D) giving the hidden width "
        f"{hidden.shape[-1]}; expected replace=False for this model"
    )


def fit_map(
    model: nn.Module,
    blocks: BlockList,
    start: int,
    end: int,
    batches: Sequence[Any],
    ridge: float,
    owner: str,
) -> tuple[nn.Module, Tensor]:
    """Fit the map replacing blocks ``[start, end)`` (start >= 1) on `batches`; return the
    Linear of block ``start - 1`` it folds into, and the map. The model is unchanged."""
    before = blocks.modules[start - 1]
    where = blocks.path(start - 1)
    last = blocks.modules[end - 1]
    linears = [m for m in before.modules() if is_projection(m)]
    seen: list[tuple[nn.Module, Tensor]] = []
    caught: dict[str, Any] = {}

    def on_linear(module: nn.Module, args: Any, output: Any) -> None:
        if isinstance(output, Tensor):
            seen.append((module, output.detach()))

    def on_before(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        caught["call"] = (args, cacheless(kwargs))
        caught["before"] = hidden_out(output)

    def on_last(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        caught["target"] = hidden_out(output)

    handles = [m.register_forward_hook(on_linear) for m in linears]
    handles.append(before.register_forward_hook(on_before, with_kwargs=True))
    handles.append(last.register_forward_hook(on_last, with_kwargs=True))
    gram = cross = None
    chosen: nn.Module | None = None
    try:
        with evaluating(model), torch.no_grad():
            for index, batch in enumerate(batches):
                seen.clear()
                run_one(model, batch, index, owner)
                out, target = caught["before"], caught["target"]
                linear, m = _last_projection(before, out, seen, where, owner)
                if index == 0:
                    chosen = linear
                    _check_additive(before, linear, caught["call"], m, out, where, owner)
                mask = token_mask(batch, index, owner, out, model)
                rm = rows(m, mask)
                rr = rows(target, mask) - (rows(out, mask) - rm)
                gram = rm.T @ rm if gram is None else gram + rm.T @ rm
                cross = rm.T @ rr if cross is None else cross + rm.T @ rr
    finally:
        for handle in handles:
            handle.remove()
    assert chosen is not None and gram is not None and cross is not None
    return chosen, solve(gram, cross, ridge)


def _check_additive(block: nn.Module, linear: nn.Module, call: Any, m: Tensor, out: Tensor,
                    where: str, owner: str) -> None:  # fmt: skip
    """Doubling `linear`'s output must add `m` once more to `block`'s output."""
    args, kwargs = call
    handle = linear.register_forward_hook(lambda module, a, output: output * 2)
    try:
        doubled = hidden_out(block(*args, **kwargs))
    finally:
        handle.remove()
    assert doubled is not None and hidden_in(args, kwargs) is not None
    error = float((doubled.double() - out.double() - m.double()).abs().max())
    scale = float(m.double().abs().max()) * 1e-3 + float(out.double().abs().max()) * 1e-5
    if not error <= scale:
        raise value_error(
            f"{owner}: replace='linear' needs {where} ({type(block).__name__}) to add the "
            f"output of its last projection to the residual stream as it is (a pre-norm "
            f"block); its output changed by {error:.3g} more than that projection's (a norm "
            "after the residual add?); expected replace=False for this model"
        )
