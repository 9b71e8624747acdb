"""``rotate_hidden``: the residual (hidden) width of a decoder cut by rotation.

Folding. Each RMSNorm computes ``g * x / rms(x)``; its weight ``g`` is multiplied into the
input columns of the linear layers that read its output (q/k/v, gate/up, the head), and the
norm's weight becomes 1. The stream then enters every reader only through ``x / rms(x)``,
which an orthogonal ``Q`` leaves alone: ``||x Q|| = ||x||``.

Rotation. One ``Q`` for the whole stream: the embedding's rows become ``E Q``, every reader's
weight ``W Q`` (it sees ``x Q``), every writer's (o_proj, down_proj) ``Q^T W`` and its bias
``Q^T b`` (it writes into the rotated stream), so the residual adds stay plain adds: the
model stays one of its family, where a ``Q`` per block (SliceGPT's) would put a matrix
``Q_i^T Q_{i+1}`` on every residual connection. ``Q``'s columns are the principal directions
of the calibration tokens at every norm's input, by decreasing eigenvalue
(``prunekit.structure.rotation.pca``). Before anything is removed the rotated model computes
what the model did, up to float rounding.

Slicing. The last directions go: with ``Q_k`` the first ``k`` columns, the embedding is
``E Q_k``, readers ``W Q_k``, writers ``Q_k^T W``: the stream is ``k`` wide. What changes is
exactly this: every writer's (and the embedding's) component along the dropped directions is
zero, in the stream and so in each norm's statistics. An RMSNorm over ``k`` channels divides
by ``sqrt(||x||^2 / k + eps)``, the rotated one by ``sqrt(||x||^2 / d + eps)``; the norms get
``eps x d / k`` and a weight of ``sqrt(d / k)``, which makes the two the same, so the sliced
model computes exactly what the rotated model computes with the dropped directions masked
(zeroed) in the embedding and the writers' outputs. The approximation is only that masking.
With ``compensate=True`` each reader is refitted instead (``refit_map``): over the kept
directions, the damped least-squares fit of what it read along all of them at its norm's input
on the calibration tokens; the sliced model is then no longer the masked one.

A head tied to the embedding cannot stay tied: the final norm's weight is folded into the head
and not into the embedding. The head gets its own copy (``config.tie_word_embeddings`` becomes
False), which adds vocabulary x ``k`` parameters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from prunekit.calibrate import batch_list
from prunekit.core.checks import check_number, refuse_meta
from prunekit.core.errors import shown, type_error, value_error, warn_caller
from prunekit.core.transaction import transaction
from prunekit.structure.rotation.family import OWNER, Stream, find_stream
from prunekit.structure.rotation.pca import principal_directions, second_moments


@dataclass(frozen=True)
class RotationReport:
    """What rotate_hidden did: the widths, the share of energy kept, the parameters.

    Attributes:
        width_before: the hidden width before.
        width_after: the hidden width kept.
        energy: the share of the calibration tokens' second moment (the sum of eigenvalues)
            along the directions kept, in (0, 1].
        params_before: the model's parameters before (a tied head counted once).
        params_after: after (an untied head counted apart).
        untied: whether the head was tied to the embedding and got its own weight.
    """

    width_before: int
    width_after: int
    energy: float
    params_before: int
    params_after: int
    untied: bool


def rotate_hidden(
    model: nn.Module,
    calibration: Iterable[object],
    hidden: float = 0.0,
    *,
    round_to: int = 1,
    compensate: bool = False,
    unit_tokens: bool = True,
) -> RotationReport:
    """Rotate the residual stream of a causal LM by its principal directions, in place, and
    remove the `hidden` share of the width along the least used of them.

    The norms' weights are folded into their readers, one orthogonal matrix rotates the
    stream (exact before any removal; the removal equals masking the dropped directions: see
    the module's docstring), and the embedding, the stream's readers and writers, the norms,
    the head and ``config.hidden_size`` (``head_dim`` kept, ``rms_norm_eps`` scaled) take the
    new width: an ordinary model of its family, for ``prune_channels`` and ``compact``.

    Args:
        model: a causal language model of the Llama family (``config.model_type`` 'llama',
            'mistral', 'qwen2' or 'qwen3'), without masks.
        calibration: batches the model's forward takes (tensors of token ids, or mappings
            such as a tokenizer's output); tokens an ``attention_mask`` masks out are left
            out of the principal directions.
        hidden: the share of the hidden width to remove, a float in [0, 1); 0 rotates only.
        round_to: the width kept is a multiple of it (an int >= 1) and of
            ``config.num_attention_heads`` (which the family's config requires of
            ``hidden_size`` for ``from_pretrained`` to build it), and at least one of them.
        compensate: True: each reader's weight over the kept directions is the least-squares
            fit of what it read from all of them, on the calibration tokens at its norm's
            input (``W_k + W_d R_dk (R_kk + damping)^-1``, R their second moment in the
            rotated basis, damped by ``DAMPING`` of its mean diagonal); the sliced model then
            no longer equals the masked one. False (the default): the readers lose their
            dropped columns as they are.
        unit_tokens: True (the default): each token's vector at a norm's input is scaled to
            unit length before it counts towards the principal directions, as the norm
            divides it by its own size. False: the vectors as they are, so tokens of large
            norm (the first token's outliers) weigh more.

    Returns:
        A RotationReport: the widths, the share of the second moment kept, the parameters.

    Raises:
        ValueError: `hidden` outside [0, 1), `round_to` below 1 or (with `hidden` > 0) one
            whose multiples with the heads' count are no narrower than the width, an
            attention_mask not shaped as its batch's input_ids, a batch the model cannot take
            (naming it and the model's error), an unsupported family or a
            missing part, masks installed, a tensor on the meta device (no values), no
            calibration batch, calibration whose every
            token an attention_mask masks out, or calibration hidden states that are not
            finite. The model is left as it was.
        TypeError: `model`, `hidden`, `round_to`, `compensate`, `unit_tokens` or
            `calibration` of the wrong type.
    """
    _check_options(hidden, round_to, compensate, unit_tokens)
    stream = find_stream(model)
    refuse_meta(OWNER, model)
    batches = batch_list(calibration, OWNER)
    width = stream.width
    kept = _kept(model, width, hidden, round_to)
    before = _count(model)
    with transaction(model):
        moments = second_moments(model, stream, batches, unit_tokens)
        values, rotation = principal_directions(_finite_sum(moments, len(batches)))
        untied = _untie(stream)
        fold_norms(stream)
        rotate_stream(stream, rotation, kept, moments if compensate else None)
        _set_norms(stream, width, kept)
        _set_config(model, stream, width, kept, untied)
    energy = float(values[:kept].clamp_min(0).sum() / values.clamp_min(0).sum().clamp_min(1e-300))
    return RotationReport(width, kept, energy, before, _count(model), untied)


def _kept(model: nn.Module, width: int, hidden: float, round_to: int) -> int:
    """The width kept: `hidden` of `width` removed, a multiple of `round_to` and of the
    config's query heads; refused where no such multiple is narrower than `width` (the call
    would remove nothing of the share asked)."""
    heads = getattr(getattr(model, "config", None), "num_attention_heads", 1)
    step = math.lcm(int(round_to), int(heads))
    if hidden > 0 and step >= width:
        raise value_error(
            f"{OWNER}: round_to={shown(round_to)} with the {heads} attention heads keeps "
            f"multiples of {shown(step)} but the hidden width is {width}, so "
            f"hidden={hidden!r} would remove nothing; expected round_to whose least common "
            f"multiple with {heads} is below {width} (or hidden=0 to rotate only)"
        )
    return kept_width(width, float(hidden), step)


def _check_options(hidden: float, round_to: int, compensate: bool, unit_tokens: bool) -> None:
    """rotate_hidden's options, each of its type and in its range."""
    wanted = "a float in [0, 1): the share of the hidden width to remove"
    check_number(hidden, "hidden", OWNER, wanted, lambda v: 0.0 <= v < 1.0)
    wanted = "an int >= 1: the width kept is a multiple of it"
    check_number(round_to, "round_to", OWNER, wanted, lambda v: v >= 1, integral=True)
    for name, value in (("compensate", compensate), ("unit_tokens", unit_tokens)):
        if not isinstance(value, bool):
            raise type_error(f"{OWNER}: invalid {name}={value!r}; expected a bool")


def _finite_sum(moments: list[Tensor], batches: int) -> Tensor:
    """The second moments of the norms' inputs, summed; refused unless finite and measuring
    some direction (a zero sum: no token counted, and any basis would be cut)."""
    moment = torch.stack(moments).sum(0)
    if not bool(torch.isfinite(moment).all()):
        raise value_error(
            f"{OWNER}: the hidden states of the {batches} calibration batches are not "
            "all finite; expected batches on which the model computes finite values"
        )
    if not bool(moment.diagonal().gt(0).any()):
        raise value_error(
            f"{OWNER}: no token of the {batches} calibration batches was counted (every "
            "attention_mask is all zero, or every hidden state is zero), so no direction of "
            "the stream is measured; expected batches whose attention_mask keeps a token"
        )
    return moment


def kept_width(width: int, hidden: float, round_to: int) -> int:
    """The width kept when the `hidden` share of `width` goes, a multiple of `round_to`
    (the whole width for `round_to` no narrower: one beyond a float's range is never divided
    by)."""
    if round_to >= width:
        return width
    kept = round((1.0 - hidden) * width / round_to) * round_to
    return max(min(kept, width), min(round_to, width), 1)


def fold_norms(stream: Stream) -> None:
    """Each norm's weight into its readers' input columns; the norm's weight becomes 1."""
    with torch.no_grad():
        for reading in stream.readings:
            weight: Tensor = reading.norm.weight  # type: ignore[assignment]
            scale = weight.detach().to(torch.float64)
            for linear in reading.readers:
                linear.weight.data = (linear.weight.to(torch.float64) * scale).to(weight.dtype)
            weight.data = torch.ones_like(weight)


def rotate_stream(
    stream: Stream, full: Tensor, kept: int, moments: list[Tensor] | None = None
) -> None:
    """The stream rotated by the first `kept` columns of `full` (orthogonal, float64): the
    embedding and every reader by them on their input side, every writer by their transpose;
    with `moments` (each norm's second moment), each reader refitted on the kept directions."""
    rotation = full[:, :kept]
    with torch.no_grad():
        embedding = stream.embedding
        embedding.weight = _like(embedding.weight, embedding.weight.to(torch.float64) @ rotation)
        embedding.embedding_dim = kept
        for index, reading in enumerate(stream.readings):
            fit = None if moments is None else refit_map(full, kept, moments[index])
            for linear in reading.readers:
                rotated = linear.weight.to(torch.float64) @ full
                weight = rotated[:, :kept] if fit is None else rotated @ fit
                linear.weight = _like(linear.weight, weight)
                linear.in_features = kept
        for linear in stream.writers:
            linear.weight = _like(linear.weight, rotation.T @ linear.weight.to(torch.float64))
            if linear.bias is not None:
                linear.bias = _like(linear.bias, rotation.T @ linear.bias.to(torch.float64))
            linear.out_features = kept


DAMPING = 0.01
"""The damping of ``rotate_hidden(..., compensate=True)``'s fit, relative to the mean
diagonal of the kept directions' second moment."""


def refit_map(full: Tensor, kept: int, moment: Tensor) -> Tensor:
    """The (width x kept) map from a reader's rotated weight to its refitted kept columns:
    the identity on the kept directions, over the dropped ones their least-squares
    prediction from the kept ones."""
    rotated = full.T @ moment @ full
    inner = rotated[:kept, :kept]
    damped = inner + DAMPING * float(inner.diagonal().mean()) * torch.eye(kept, dtype=inner.dtype)
    predicted = torch.linalg.solve(damped, rotated[:kept, kept:])  # kept x dropped
    return torch.cat([torch.eye(kept, dtype=inner.dtype), predicted.T], dim=0)


def _like(old: Tensor, values: Tensor) -> nn.Parameter:
    return nn.Parameter(values.to(old.dtype).contiguous(), requires_grad=old.requires_grad)


def _set_norms(stream: Stream, width: int, kept: int) -> None:
    """Norms over `kept` channels that normalize as those over `width` did (see the module's
    docstring): weight sqrt(width / kept), eps x width / kept."""
    for reading in stream.readings:
        norm: Any = reading.norm  # an RMSNorm of the family (checked by find_stream)
        norm.weight = _like(
            norm.weight, torch.full((kept,), math.sqrt(width / kept), dtype=torch.float64)
        )
        norm.variance_epsilon = float(norm.variance_epsilon) * width / kept


def _untie(stream: Stream) -> bool:
    """Give the head a weight of its own where it shares the embedding's; whether it did."""
    if not stream.tied:
        return False
    head = stream.head
    head.weight = nn.Parameter(
        head.weight.detach().clone(), requires_grad=head.weight.requires_grad
    )
    return True


def _set_config(model: nn.Module, stream: Stream, width: int, kept: int, untied: bool) -> None:
    config: Any = cast(Any, model).config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    config.head_dim = head_dim
    config.hidden_size = kept
    old_eps = float(config.rms_norm_eps)
    config.rms_norm_eps = old_eps * width / kept
    _warn_other_norms(model, stream, old_eps, float(config.rms_norm_eps))
    if untied:
        config.tie_word_embeddings = False
    for block in stream.blocks:
        for module in block.modules():
            if getattr(module, "hidden_size", None) == width:
                module.hidden_size = kept  # type: ignore[assignment]


def _warn_other_norms(model: nn.Module, stream: Stream, old: float, new: float) -> None:
    """Warn where norms off the stream (Qwen3's query/key norms over the head size) were
    built from ``rms_norm_eps`` too: they keep `old`, from_pretrained would build `new`."""
    if old == new:
        return
    mine = {id(reading.norm) for reading in stream.readings}
    others = [name for name, m in model.named_modules()
              if id(m) not in mine and getattr(m, "variance_epsilon", None) == old]  # fmt: skip
    if others:
        more = f" (and {len(others) - 2} more)" if len(others) > 2 else ""
        warn_caller(
            f"{OWNER}: {type(model).__name__}: config.rms_norm_eps is now {new:g} for the "
            f"norms of the narrower stream, but {', '.join(others[:2])}{more} keep {old:g}: "
            "save_pretrained / from_pretrained would rebuild them with the new value; save "
            "with prunekit.save_compacted and reload with prunekit.load_compacted"
        )


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
