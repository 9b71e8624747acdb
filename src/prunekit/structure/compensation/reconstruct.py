"""Block-wise reconstruction: each block of a pruned model trained towards the reference's.

The refit (``prunekit.structure.compensation.refit``) solves one linear layer at a time in
closed form; what lies between its layers (norms, activations, a squeeze-and-excitation gate,
a residual add) it cannot fit jointly. Here each block of the model's sequence of blocks (the
ModuleList that holds most of its parameters: a CNN's stages, a transformer's layers) is
trained by gradient steps so that, on its input in the pruned model, it computes the output
the reference's same block (ref) computes on *its* input:

    min over the block's parameters of  sum || block(x) - ref(t) ||^2 / sum || ref(t) ||^2

with x the block's inputs in the pruned model as reconstructed so far and t the reference's,
over the calibration batches. Blocks go in order, each from the inputs the blocks before it
now give, so later blocks also correct what earlier ones left. Masked entries stay zero (a
mask multiplies the stored weight, so their gradient is zero and Adam leaves them), and a
block whose error on the calibration batches did not fall gets its parameters back.

Everything runs in eval mode (running statistics of BatchNorm as they are, no dropout): only
parameters change. Peak memory beyond the model: both models' block inputs for every batch,
the block's targets, and the optimizer's two moments of one block's parameters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.core.errors import type_error, value_error
from prunekit.core.transaction import transaction
from prunekit.criteria import calibration as cal
from prunekit.structure.graph.graph import check_model

__all__ = ["reconstruct_blocks"]

_Inputs = tuple[tuple[Any, ...], dict[str, Any]]


def reconstruct_blocks(
    model: nn.Module,
    reference: nn.Module,
    calibration: Iterable[Any],
    *,
    steps: int = 200,
    lr: float = 1e-3,
) -> list[tuple[float, float]]:
    """Train each block of `model` towards the output of `reference`'s same block.

    Typically after ``prune_channels(..., compensate="reference")``, with `reference` the
    copy of the model taken before pruning. Each block gets `steps` Adam steps (one
    calibration batch per step, in turn; the learning rate decays from `lr` to 0 along a
    cosine) on its relative squared error to the reference block's output; see the module
    docstring.

    Args:
        model: the pruned (masked, not yet compacted) model; changed in place.
        reference: the model before pruning, with the same sequence of blocks at the same
            path; not changed.
        calibration: batches both models' forward takes (a tensor, a mapping of keyword
            arguments or a tuple of positional arguments each).
        steps: optimizer steps per block, >= 1.
        lr: Adam's learning rate, finite and > 0.

    Returns:
        Per block, in order: its relative squared error on the calibration batches before
        and after (after <= before: a block that did not improve is put back).

    Raises:
        TypeError: a model or reference that is no nn.Module, or calibration that is no
            iterable of batches.
        ValueError: a bad `steps` or `lr`, calibration without batches, a model without a
            sequence of blocks, or a reference without the same one. On any error the model
            is left as it was.
    """
    owner = "reconstruct_blocks"
    check_model(model, owner)
    check_model(reference, owner)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise value_error(f"{owner}: invalid steps={steps!r}; expected an int >= 1")
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not 0 < lr < math.inf:
        raise value_error(f"{owner}: invalid lr={lr!r}; expected a finite float > 0")
    batches = cal.batch_list(calibration, owner)
    blocks, theirs = _blocks(model, reference)
    trained = [p for block in blocks for p in block.parameters() if p.requires_grad]
    with transaction(model, writes=trained), cal.evaluating(model), cal.evaluating(reference):
        with torch.no_grad():
            ours_in = cal.capture_block_inputs(model, blocks[0], batches)
            theirs_in = cal.capture_block_inputs(reference, theirs[0], batches)
        errors = []
        for block, their_block in zip(blocks, theirs, strict=True):
            with torch.no_grad():
                targets = [_output(their_block, one) for one in theirs_in]
            errors.append(_fit(block, ours_in, targets, steps, float(lr)))
            with torch.no_grad():
                ours_in = cal.next_inputs(block, ours_in)
                theirs_in = cal.next_inputs(their_block, theirs_in)
    return errors


def _blocks(model: nn.Module, reference: nn.Module) -> tuple[nn.ModuleList, nn.ModuleList]:
    """The model's sequence of blocks and the reference's at the same path."""
    owners = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    found = cal.block_list(model, owners)
    if found is None:
        raise value_error(
            f"reconstruct_blocks: {type(model).__name__} holds no sequence of blocks; "
            "expected a ModuleList of two or more modules of one class"
        )
    path, blocks = found
    try:
        theirs = reference.get_submodule(path)
    except AttributeError:
        theirs = None
    if not isinstance(theirs, nn.ModuleList) or len(theirs) != len(blocks):
        held = f"{len(theirs)} blocks" if isinstance(theirs, nn.ModuleList) else "no ModuleList"
        raise value_error(
            f"reconstruct_blocks: the model's blocks are {path!r} ({len(blocks)} of them) but "
            f"the reference has {held} there; expected the model as it was before pruning"
        )
    return blocks, theirs


def _output(block: nn.Module, inputs: _Inputs) -> Tensor:
    """The hidden states `block` returns (the first element of a tuple output)."""
    args, kwargs = inputs
    out = block(*args, **kwargs)
    found = out[0] if isinstance(out, tuple | list) else out
    if not isinstance(found, Tensor):
        raise type_error(
            f"reconstruct_blocks: {type(block).__name__} returned {type(found).__name__}; "
            "expected a tensor (or a tuple starting with one)"
        )
    return found


def _fit(
    block: nn.Module, inputs: Sequence[_Inputs], targets: Sequence[Tensor], steps: int, lr: float
) -> tuple[float, float]:
    """`steps` Adam steps of `block` towards `targets`; its error before and after (its
    parameters put back when the error did not fall)."""
    params = [p for p in block.parameters() if p.requires_grad]
    scale = sum(float(t.double().square().sum()) for t in targets) or 1.0
    before = _error(block, inputs, targets) / scale
    if not params:
        return before, before
    saved = [p.detach().clone() for p in params]
    optimizer = torch.optim.Adam(params, lr=lr)
    with torch.enable_grad():
        for step in range(steps):
            k = step % len(inputs)
            loss = (_output(block, inputs[k]) - targets[k]).square().sum()
            loss = loss * (len(inputs) / scale)
            for group in optimizer.param_groups:
                group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
    after = _error(block, inputs, targets) / scale
    if not after < before:  # NaN too
        with torch.no_grad():
            for p, old in zip(params, saved, strict=True):
                p.copy_(old)
        after = before
    return before, after


def _error(block: nn.Module, inputs: Sequence[_Inputs], targets: Sequence[Tensor]) -> float:
    with torch.no_grad():
        return sum(
            float((_output(block, one) - t).double().square().sum())
            for one, t in zip(inputs, targets, strict=True)
        )
