"""Compensation towards a reference: ``prune_channels(..., compensate="reference")``.

Plain compensation (``prunekit.structure.compensation.compensate``) keeps each consumer's
output as it was *given its input in the model pruned so far*: the error that the layers before
it left in that input stays, and in a deep network (a CNN of sixteen blocks) it grows block after
block. Here the target is the output the consumer computed in the reference, the model as
it was before this call, on the same batch. With t the reference's input to the consumer
and x its input in the pruned model (K the columns kept), the kept columns and the bias
are refitted as

    min over W'_K, b'  of  mean || W t + b - W'_K x_K - b' ||^2  (+ damping)

whose solution, written as a change of the current values, is

    [dW_K, db] = (W E[t x~^T] - W_K E[x_K x~^T]) (E[x~ x~^T] + lambda I)^-1,  x~ = [x_K; 1]

(without a bias, no constant column). Where the input is unchanged (t = x) this is the plain
update. Every other Linear or convolution that runs after the first consumer is refitted the
same way with nothing removed, since its input drifted too. Statistics are taken on the two
models in lockstep, for one consumer at a time, each
forward stopped once the consumer has been reached; a convolution other than a pointwise one
is fitted on patches, per group of channels, as the plain update does.

Peak memory beyond the model: the reference (a copy of the model as it was, which the
caller makes), one consumer's two n x n moments (float64 in the solve) and one batch's
inputs of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

import prunekit.calibrate as cal
from prunekit.calibrate import layer_matrices
from prunekit.calibrate.statistics import kept_tokens
from prunekit.core.naming import mask_name, stored_parameter
from prunekit.criteria.hessian import damped_cholesky
from prunekit.structure.compensation import compensate as plain
from prunekit.structure.compensation.damping import by_median
from prunekit.structure.graph.graph import ChannelGroup

__all__ = ["DAMP", "refit_groups", "refit_update", "written"]

DAMP = 0.01
"""Damping of the refit's solve, relative to the median of the diagonal of E[x x^T] (a
convolution's: the mean, ``damping.by_median``). Lighter than plain compensation's
(``prunekit.structure.compensation.compensate.DAMP``, chosen on an LLM's few thousand tokens
for 1536 features): a convolution has a row per output position of every calibration image,
many per feature. Measured on EfficientNet-Lite0, 30 % of every
expansion width, 64 calibration crops, plain compensation: top-1 agreement 48.4 % at 0.3,
59.4 % at 0.01, 57.8 % at 0.001 (``benchmarks/cnn_structure.py``)."""

_OWNER = "prune_channels"
"""The entry point whose calibration a refit is (``compensate='reference'``)."""


def refit_update(
    weight: Tensor,
    hessian: Tensor,
    cross: Tensor,
    kept: Sequence[int],
    means: tuple[Tensor, Tensor] | None = None,
    damp: float | None = None,
    median: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """The change of the kept columns (and bias) that best reproduces the reference output.

    Args:
        weight: (rows, n), the consumer's weight as it was (input features as columns).
        hessian: (n, n), the mean of x x^T over the pruned model's inputs x.
        cross: (n, n), the mean of t x^T, t the reference's input on the same rows.
        kept: the columns of x that stay (the others are not used).
        means: (mean of x, mean of t); given, a constant column is fitted too (the bias).
        damp: added to the diagonal, relative to its median (default ``DAMP``).
        median: False: `damp` relative to the diagonal's mean instead (a convolution's; see
            ``damping.by_median``).

    Returns:
        (rows, len(kept)) to add to ``weight[:, kept]`` and (rows,) to add to the bias (None
        without `means`), float64.
    """
    w = weight.detach().to(torch.float64)
    h = hessian.detach().to(torch.float64)
    c = cross.detach().to(torch.float64)
    columns = list(kept)
    if means is not None:
        mx, mt = (m.detach().to(torch.float64).reshape(-1, 1) for m in means)
        one = torch.ones(1, 1, dtype=torch.float64)
        h = torch.cat([torch.cat([h, mx], 1), torch.cat([mx.T, one], 1)], 0)
        c = torch.cat([c, mt], 1)
        columns.append(h.shape[0] - 1)
    rows = w.shape[0]
    if not kept:
        delta = torch.zeros(rows, len(columns), dtype=torch.float64)
    else:
        k = torch.tensor(columns, dtype=torch.long)
        own = torch.tensor(list(kept), dtype=torch.long)
        right = c[:, k].T @ w.T - h[own][:, k].T @ w[:, own].T  # (|K'|, rows)
        level = DAMP if damp is None else damp
        factor = damped_cholesky(h[k][:, k], level, "compensation", median=median)
        delta = torch.cholesky_solve(right, factor).T
    if means is None:
        return delta, None
    return delta[:, :-1], delta[:, -1]


class _Paired:
    """The moments of one consumer's input in the pruned model (x) against the reference's
    (t), per group of columns: E[x x^T], E[t x^T], E[x], E[t]."""

    def __init__(self, module: nn.Module, patches: bool) -> None:
        self.module = module
        self.patches = patches
        self.rows = 0
        self.xx: Tensor | None = None
        self.tx: Tensor | None = None
        self.sx: Tensor | None = None
        self.st: Tensor | None = None

    def features(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], mask: Tensor | None = None
    ) -> Tensor:
        """(groups, rows, columns) of the consumer's input, float64: only the rows of the
        tokens `mask` keeps (``kept_tokens``; None: every row)."""
        x = layer_matrices.layer_input(self.module, args, kwargs)
        if mask is not None:
            x = kept_tokens(self.module, x, mask)
        if self.patches:
            found = layer_matrices.features(self.module, x)
        else:
            moved = cal.input_features(self.module, x)
            found = moved.reshape(-1, 1, moved.shape[-1])
        return found.detach().to(torch.float64).transpose(0, 1)

    def add(self, x: Tensor, t: Tensor) -> None:
        if x.shape != t.shape:
            raise ValueError(
                f"compensation: {type(self.module).__name__} got inputs of shapes "
                f"{tuple(x.shape)} and {tuple(t.shape)} in the pruned model and its reference; "
                "expected the same (compensate='reference' needs a model whose masked forward "
                "keeps every shape)"
            )
        xx = x.transpose(1, 2) @ x
        tx = t.transpose(1, 2) @ x
        sx, st = x.sum(1), t.sum(1)
        if self.xx is None:
            self.xx, self.tx, self.sx, self.st = xx, tx, sx, st
        else:
            assert self.tx is not None and self.sx is not None and self.st is not None
            self.xx += xx
            self.tx += tx
            self.sx += sx
            self.st += st
        self.rows += x.shape[1]


def _first_input(
    model: nn.Module, module: nn.Module, batch: Any, paired: _Paired, mask: Tensor | None
) -> Tensor:
    """`module`'s input features on `batch` (its first call), the forward stopped there:
    those of the tokens `mask` keeps (None: all)."""
    found: list[Tensor] = []

    def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        found.append(paired.features(args, kwargs, mask))
        raise cal.Stop  # its input is taken: the rest of the forward is not needed

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        cal.run_batch(model, batch)
    except cal.Stop:
        pass
    finally:
        handle.remove()
    if not found:
        raise ValueError(
            f"compensation: a batch ran the model's forward without reaching "
            f"{type(module).__name__}; expected every batch to run every layer pruned"
        )
    return found[0]


def _paired_statistics(
    model: nn.Module, reference: nn.Module, module: nn.Module, twin: nn.Module,
    batches: Sequence[Any], patches: bool,
) -> _Paired:  # fmt: skip
    """The paired moments of `module`'s input and its `twin`'s in `reference` over
    `batches`, the tokens a batch's ``attention_mask`` masks out left out (``batch_masks``)."""
    paired = _Paired(module, patches)
    masks = cal.batch_masks(batches, owner=_OWNER, model=model)
    for index, batch in enumerate(batches):
        try:
            x = _first_input(model, module, batch, paired, masks[index])
            t = _first_input(reference, twin, batch, paired, masks[index])
        except Exception as error:
            raise cal.batch_error(index, error, owner=_OWNER)  # noqa: B904 (its cause is set)
        paired.add(x, t)
    return paired


def refit_groups(
    model: nn.Module,
    reference: nn.Module,
    chosen: Sequence[tuple[ChannelGroup, Sequence[int]]],
    openings: plain.Openings,
    batches: Sequence[Any],
) -> list[str]:
    """Refit every compensable consumer of the `chosen` units (the masks installed), and every
    layer that runs after the first of them (``layers_refitted``), towards `reference`'s
    outputs, in forward order, in place (the tensors ``written`` lists).
    `reference`: a copy of `model` taken before this call's masks. Returns the consumers
    updated, in order."""
    found = plain.consumers(chosen)
    if not found:
        return []
    names = {id(m): n for n, m in model.named_modules()}
    twins = dict(reference.named_modules())
    listed = {id(c.module) for c in found}
    found += [c for c in layers_refitted(model) if id(c.module) not in listed]
    order = plain._forward_order(model, [c.module for c in found], batches[0], _OWNER)
    plain.warn_unrun([c for c in found if id(c.module) in listed], order, names,
                     "compensate='reference'")  # fmt: skip
    reached = [order[i] for i in listed if i in order]
    if not reached:
        return []
    first = min(reached)
    found = sorted((c for c in found if order.get(id(c.module), -1) >= first),
                   key=lambda c: order[id(c.module)])  # fmt: skip
    done: list[str] = []
    with cal.evaluating(model), cal.evaluating(reference), torch.no_grad():
        for one in found:
            name = names[id(one.module)]
            patches = plain._by_patches(one.module)
            paired = _paired_statistics(model, reference, one.module, twins[name], batches,
                                        patches)  # fmt: skip
            moments = (paired.xx, paired.tx, paired.sx, paired.st)
            plain.check_finite([m for m in moments if m is not None], name, "reference")
            if _refit(one, paired, openings):
                done.append(name)
    return done


def layers_refitted(model: nn.Module) -> list[plain._Consumer]:
    """Every layer a reference refit may update besides the consumers of removed units: the
    Linears, Hugging Face Conv1Ds and convolutions (not transposed) of `model`. Those that
    run after the first consumer are refitted too, with nothing removed: their input has
    drifted from the reference's. A layer whose weight another module holds too (a language
    model's head tied to its embedding) is left out: its update would move that module's
    output unchecked (the embedding's, which every block reads)."""
    holders: dict[int, int] = {}  # a Parameter's id -> how many modules hold it
    for module in model.modules():
        for parameter in module._parameters.values():
            if parameter is not None:
                holders[id(parameter)] = holders.get(id(parameter), 0) + 1
    found = []
    for module in model.modules():
        weight = stored_parameter(module, "weight")
        if weight is None or holders.get(id(weight), 0) > 1:
            continue
        conv = isinstance(module, nn.modules.conv._ConvNd) and not module.transposed
        if conv or (isinstance(module, nn.Linear) and weight.dim() == 2):
            found.append(plain._Consumer(module, "weight", 1))
        elif type(module).__name__ == "Conv1D" and weight.dim() == 2:
            found.append(plain._Consumer(module, "weight", 0))
    return found


def written(model: nn.Module) -> list[Tensor]:
    """The tensors ``refit_groups`` may change in place: the weight and bias of every layer
    `layers_refitted` names."""
    found: list[Tensor] = []
    for one in layers_refitted(model):
        found.append(plain._stored(one.module, one.name))
        bias = stored_parameter(one.module, "bias")
        if bias is not None:
            found.append(bias)
    return found


def _refit(one: Any, paired: _Paired, openings: plain.Openings) -> bool:
    """Apply `refit_update` to one consumer, per group of columns."""
    module = one.module
    if paired.rows == 0 or paired.xx is None:
        return False
    assert paired.tx is not None and paired.sx is not None and paired.st is not None
    groups, n = paired.xx.shape[0], paired.xx.shape[-1]
    if (id(module), one.name) in openings.before:
        weight = openings.weight(module, one.name)  # as it was before this call's masks
    else:  # a layer of no chosen group: as it computes (an earlier mask applied)
        weight = getattr(module, one.name).detach().to(torch.float64)
    if paired.patches:
        rows = layer_matrices.matrices(module, weight)
        per = weight.shape[1]
        gone = {p * per + c for p in range(n // per) for c in one.removed}
    else:
        rows = weight.movedim(one.dim, -1).reshape(1, -1, n)
        gone = set(one.removed)
    if rows.shape[-1] != n:
        return False
    mask = getattr(module, mask_name(one.name), None)
    if not isinstance(mask, Tensor):
        alive = torch.ones(groups, n, dtype=torch.bool)
    elif paired.patches:
        alive = layer_matrices.matrices(module, mask).ne(0).any(1)
    else:
        alive = mask.movedim(one.dim, -1).reshape(-1, n).ne(0).any(0).reshape(1, n)
    bias = stored_parameter(module, "bias")
    change = torch.zeros_like(rows)
    shifts = torch.zeros(rows.shape[:2], dtype=torch.float64)
    count = float(paired.rows)
    for g in range(groups):
        kept = [c for c in range(n) if bool(alive[g, c]) and c not in gone]
        means = (paired.sx[g] / count, paired.st[g] / count) if bias is not None else None
        delta, shift = refit_update(rows[g], paired.xx[g] / count, paired.tx[g] / count, kept,
                                    means, median=by_median(module))  # fmt: skip
        change[g][:, kept] = delta
        if shift is not None:
            shifts[g] = shift
    stored = plain._stored(module, one.name)
    with torch.no_grad():
        if paired.patches:
            stored.add_(layer_matrices.from_matrices(module, change, stored.shape).to(stored.dtype))
        else:
            target = stored.movedim(one.dim, -1).view(-1, n)
            target += change[0].to(target.dtype)
        if bias is not None:
            bias.add_(shifts.reshape(-1).to(bias.dtype))
    return True
