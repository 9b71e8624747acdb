"""Block-wise reconstruction: each block of a pruned model trained towards the reference's.

The refit (``prunekit.structure.compensation.refit``) solves one linear layer at a time in
closed form; what lies between its layers (norms, activations, a squeeze-and-excitation gate,
a residual add) it cannot fit jointly. Here each block of the model's sequence of blocks (the
ModuleList that holds most of its parameters: a CNN's stages, a transformer's layers) is
trained by gradient steps so that, on its input in the pruned model, it computes the output
the reference's same block (ref) computes on *its* input:

    min over the block's parameters of  sum || block(x) - ref(t) ||^2 / sum || ref(t) ||^2

with x the block's inputs in the pruned model as reconstructed so far and t the reference's,
over the calibration batches and their tokens that count: where a batch has an
``attention_mask`` (``calibrate.batch_masks``) and an output is one row per token
(``calibrate.statistics.token_rows``, the rule the statistics follow: (*mask.shape,
features), so (batch, tokens, features), or (tokens, features) for one unbatched sequence,
or the tokens flattened), both sums run over the tokens it keeps only, so padding neither weighs in
nor sets the scale (the sum, not the mean, over them: a step's gradient on a padded batch is
the one on the same tokens unpadded). An output of any other shape counts whole: a
(tokens, batch, features) output of a model that is not batch-first is not told from a
batch-first one, and is masked as one only where its shape matches. Blocks go in order,
each from the inputs the blocks before it now give, so later blocks also correct what
earlier ones left. Masked entries stay zero (a mask multiplies the stored weight, so their
gradient is zero and Adam leaves them), and a block whose error on the calibration batches
did not fall gets its parameters back.

With ``ends=True`` the two ends of the model take part too. The stem (the modules that run
before the first block, outside it: a CNN's first convolution and norm, a transformer's
embeddings) trains together with the first block, towards that block's output: on its kept
channels the pruned stem already computes what the reference's does (its input, the data,
is the same), so only the block after it can tell what its remaining channels should carry.
The head (the modules that run after the last block: a CNN's last convolution, norm and
classifier, a transformer's final norm and output layer) trains last, towards the
reference's output. Its steps skip the blocks: each block's call returns the last block's
output (kept from one forward per batch), checked once against the real forward (a model
whose forward needs more than the blocks' returns, or does more between them, runs whole).
Which side a parameter is on is read from the calls of the module holding it, in one
forward: a parameter held by modules called on both sides (an embedding tied to the output
layer) is in neither, and parameters held by a module that encloses the blocks (a position
embedding of the model itself) stay as they are.

Everything runs in eval mode (running statistics of BatchNorm as they are, no dropout): only
parameters change. Peak memory beyond the model: both models' block inputs for every batch,
the block's targets, and the optimizer's two moments of one block's parameters.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

import prunekit.calibrate as cal
from prunekit.calibrate.statistics import token_rows
from prunekit.core.autocast import fresh_casts
from prunekit.core.checks import check_number, check_rate, refuse_float16, refuse_shared
from prunekit.core.errors import is_explained, type_error, value_error
from prunekit.core.naming import orig_name
from prunekit.core.transaction import transaction
from prunekit.structure.graph.graph import check_model

__all__ = ["reconstruct_blocks"]

_Inputs = tuple[tuple[Any, ...], dict[str, Any]]


_OWNER = "reconstruct_blocks"
_HEAD = "the head (the modules run after the last block)"


def reconstruct_blocks(
    model: nn.Module,
    reference: nn.Module,
    calibration: Iterable[Any],
    *,
    steps: int = 200,
    lr: float = 1e-3,
    ends: bool = False,
    cpu_seconds: float | None = None,
) -> list[tuple[float, float]]:
    """Train each block of `model` towards the output of `reference`'s same block.

    Typically after ``prune_channels(..., compensate="reference")``, with `reference` the
    copy of the model taken before pruning. Each block gets `steps` Adam steps (one
    calibration batch per step, in turn; the learning rate decays from `lr` to 0 along a
    cosine) on its relative squared error to the reference block's output, summed over the
    tokens a batch's ``attention_mask`` keeps (padding left out); see the module docstring.
    With `cpu_seconds`, the call's CPU time is spread over the blocks instead: each block
    trains until an even share of what is left is used (or `steps`), the cosine following
    that share.

    Under ``torch.autocast`` the forwards (the targets, the steps, the errors before and
    after) compute in its dtype, the parameters and Adam's moments staying in theirs.
    Autocast's cache of cast parameters is off during the call, or every forward after the
    first would read the weights as they were then (steps that train blind, and an error
    after that does not see them), and it is emptied on return, so the caller's forwards in
    the same context read the new weights.

    Args:
        model: the pruned model, masked, or compacted if its hidden width (the blocks'
            inputs and outputs) was not cut; changed in place.
        reference: the model before pruning, with the same sequence of blocks at the same
            path; not changed.
        calibration: batches both models' forward takes (a tensor, a mapping of keyword
            arguments or a tuple of positional arguments each).
        steps: optimizer steps per block, >= 1.
        lr: Adam's learning rate, finite and > 0.
        ends: also train the stem (the modules run before the first block) with the first
            block, and then the head (those run after the last block) towards the
            reference's output (a tensor, the ``logits`` of a mapping such as a Hugging
            Face output, whose loss comes first when the batches hold labels, else the
            first tensor of a tuple or mapping that is no scalar, as a loss is). A
            classifier head holds many parameters: on few calibration samples it fits
            their outputs exactly and generalises worse (give it hundreds of samples, not
            tens).
        cpu_seconds: a budget of this process's CPU time (all its threads; a finite
            float > 0) for the whole call, its passes over the batches included: each
            block (and with `ends` the head) in turn gets the time left over the number
            of them left, and takes steps while its share lasts and `steps` is not
            reached. None: `steps` per block, whatever time they take.

    Returns:
        Per block, in order: its relative squared error on the calibration batches before
        and after (after <= before: a block that did not improve is put back); with
        `ends`, one more entry last, the model's output error before and after the head's
        steps.

    Raises:
        TypeError: a model or reference that is no nn.Module, calibration that is no
            iterable of batches, `steps` that is no int, `lr` or `cpu_seconds` that is no
            real number, or `ends` that is no bool (a bool is no int or number here
            either).
        ValueError: `steps` < 1, `lr` or `cpu_seconds` <= 0 or not finite, calibration
            without batches, a
            model without a sequence of blocks, or a reference without the same one (or
            the model itself), a parameter trained (the blocks', with `ends` the stem's
            and the head's too) that is float16 or that the reference shares, a
            reference with parameters of another dtype than the model's on which its
            forward fails (the parameter and both dtypes named), or batches on which a
            block's error is not finite. On any error the model is left as it was.
    """
    batches = _checked(model, reference, calibration, steps, lr, (ends, cpu_seconds))
    blocks, theirs = _blocks(model, reference)
    budget = None if cpu_seconds is None else float(cpu_seconds)
    masks = cal.batch_masks(batches, owner=_OWNER, model=model)  # the tokens that count
    fit = _Fit(int(steps), float(lr), budget, len(blocks) + int(ends), masks)
    inner = [p for block in blocks for p in _trainable(block)]
    # the forward that finds the ends runs inside the transaction: a refusal after it
    # leaves what it wrote (a buffer, an attribute) as it was
    with (
        fresh_casts(),  # under autocast: each forward casts the weights as the steps left them
        cal.evaluating(model),
        cal.evaluating(reference),
        transaction(model, writes=inner) as undo,
    ):
        stem, head = _ends(model, blocks, batches[0]) if ends else ([], [])
        undo.keep(stem + head)
        _check_trained(model, reference, inner + stem + head)
        check_rate(_OWNER, lr, inner + stem + head)
        errors = _fit_blocks((model, reference), (blocks, theirs), batches, stem, fit)
        if ends:
            errors.append(_fit_head(model, reference, blocks, batches, head, fit))
    return errors


@contextmanager
def _reference_named(model: nn.Module, reference: nn.Module) -> Iterator[None]:
    """An error of the reference's forward (or of a block of it) raised in the block, where
    a parameter of the reference is of another floating dtype than the model's of the same
    name, is named as that: the reference and its parameter with both dtypes (what the
    forward raised kept as the cause). Left as it is otherwise, and so is one of prunekit's
    own code: a reference of another dtype whose forward runs (one that casts its inputs,
    as Hugging Face models do after their embeddings) is taken."""
    try:
        yield
    except Exception as error:
        if is_explained(error):  # a batch the model cannot take: what the model raised
            cause = error.__cause__
            if not isinstance(cause, Exception) or is_explained(cause):
                raise
        elif not cal.is_callers(error):  # raised by prunekit's own code: a bug
            raise
        else:
            cause = error
        found = _other_dtype(model, reference)
        if found is None:
            raise
        name, mine, theirs = found
        raise value_error(
            f"{_OWNER}: invalid reference: its parameter {name!r} is {theirs} where the "
            f"model's is {mine}, and a forward on the calibration batches failed "
            f"({type(cause).__name__}: {cause}); expected the reference in the model's "
            f"dtype (reference.to({mine}))"
        ) from cause


def _other_dtype(
    model: nn.Module, reference: nn.Module
) -> tuple[str, torch.dtype, torch.dtype] | None:
    """The first floating parameter of `reference` whose namesake in `model` (its pruned
    values, where masked) is of another floating dtype: (name, the model's, the reference's)."""
    ours = dict(model.named_parameters())
    for name, theirs in reference.named_parameters():
        mine = ours.get(orig_name(name), ours.get(name))
        floating = mine is not None and mine.is_floating_point() and theirs.is_floating_point()
        if floating and mine is not None and mine.dtype != theirs.dtype:
            return name, mine.dtype, theirs.dtype
    return None


def _checked(
    model: object, reference: object, calibration: object, steps: object, lr: object,
    flags: tuple[object, object],
) -> list[Any]:  # fmt: skip
    """reconstruct_blocks' arguments checked; the calibration batches as a list."""
    owner = _OWNER
    ends, cpu_seconds = flags
    check_model(model, owner)
    check_model(reference, owner, "reference")
    if reference is model:
        raise value_error(
            f"{owner}: the reference is the model itself, so there is nothing to train "
            "towards; expected the model as it was before pruning (a copy taken first, "
            "such as copy.deepcopy(model))"
        )
    check_number(steps, "steps", owner, "an int >= 1", lambda v: v >= 1, integral=True)
    check_number(lr, "lr", owner, "a finite float > 0", lambda v: 0 < v < math.inf)
    if cpu_seconds is not None:
        check_number(cpu_seconds, "cpu_seconds", owner, "a finite float > 0 (or None)",
                     lambda v: 0 < v < math.inf)  # fmt: skip
    if not isinstance(ends, bool):
        raise type_error(f"{owner}: invalid ends={ends!r}; expected True or False")
    return cal.batch_list(calibration, owner)


def _fit_blocks(
    models: tuple[nn.Module, nn.Module], pairs: tuple[nn.ModuleList, nn.ModuleList],
    batches: Sequence[Any], stem: list[nn.Parameter], fit: _Fit,
) -> list[tuple[float, float]]:  # fmt: skip
    """Each block of the model (the first with `stem`) fitted in turn towards the
    reference's same block, from the inputs the blocks before it now give. Each block of
    either model runs once per batch outside the steps: the reference's outputs are the
    targets and its next inputs, the model's last pass gives its error and its next inputs."""
    (model, reference), (blocks, theirs) = models, pairs
    with torch.no_grad():
        ours_in = cal.capture_block_inputs(model, blocks[0], batches, owner=_OWNER)
        own = cal.block_calls(model, blocks, batches, owner=_OWNER)  # own mask, rotary
        with _reference_named(model, reference):
            theirs_in = cal.capture_block_inputs(reference, theirs[0], batches, owner=_OWNER)
            their_own = cal.block_calls(reference, theirs, batches, owner=_OWNER)
    _check_widths(ours_in, theirs_in)
    errors = []
    for index, (block, their_block) in enumerate(zip(blocks, theirs, strict=True)):
        with torch.no_grad(), _reference_named(model, reference):
            targets = _outputs(their_block, theirs_in)
        if block is blocks[0] and stem:
            params = _trainable(block) + stem
            with cal.requiring_grad(model, params):  # no graph through the others
                before, after, outputs = fit(params, _through_stem(model, block, batches),
                                             targets, _name(model, block), keep=True)  # fmt: skip
            with torch.no_grad():  # the stem's other outputs (a mask, positions) too
                ours_in = cal.capture_block_inputs(model, block, batches, owner=_OWNER)
        else:
            before, after, outputs = fit(_trainable(block), _runner(block, ours_in), targets,
                                         _name(model, block), keep=True)  # fmt: skip
        errors.append((before, after))
        ours_in = [
            cal.with_hidden(one, out, block, _OWNER)
            for one, out in zip(ours_in, outputs, strict=True)
        ]
        theirs_in = [
            cal.with_hidden(one, out, block, _OWNER)
            for one, out in zip(theirs_in, targets, strict=True)
        ]
        if index + 1 < len(blocks):
            ours_in = cal.called_as(ours_in, own, index + 1)
            theirs_in = cal.called_as(theirs_in, their_own, index + 1)
    return errors


def _name(model: nn.Module, module: nn.Module) -> str:
    return next((n for n, m in model.named_modules() if m is module), type(module).__name__)


def _check_widths(ours: Sequence[_Inputs], theirs: Sequence[_Inputs]) -> None:
    """The blocks of both models must take hidden states of one shape: a model compacted
    after a cut of its hidden width takes narrower ones, and no block of it can be trained
    towards the reference's outputs."""
    for (args, kwargs), (their_args, their_kwargs) in zip(ours, theirs, strict=True):
        mine, their = _hidden(args, kwargs), _hidden(their_args, their_kwargs)
        if mine is not None and their is not None and mine.shape != their.shape:
            raise value_error(
                f"reconstruct_blocks: the model's first block takes hidden states of shape "
                f"{tuple(mine.shape)} but the reference's takes {tuple(their.shape)}: the "
                "model was compacted (its hidden width cut); reconstruct_blocks takes the "
                "masked model before compaction, with the reference's shapes; expected "
                "prune_channels, then reconstruct_blocks, then compact"
            )


def _hidden(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    found = args[0] if args else kwargs.get("hidden_states")
    return found if isinstance(found, Tensor) else None


def _trainable(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def _runner(block: nn.Module, inputs: Sequence[_Inputs]) -> Callable[[int], Tensor]:
    """``block``'s output on the inputs of batch k (an error of the block names batch k)."""
    return lambda k: _on_batch(k, block, inputs[k])


def _through_stem(
    model: nn.Module, block: nn.Module, batches: Sequence[Any]
) -> Callable[[int], Tensor]:
    """The first block's output on batch k, from the stem's output (with its graph)."""
    return lambda k: _output(
        block, cal.capture_block_inputs(model, block, [batches[k]], owner=_OWNER)[0]
    )


def _check_trained(model: nn.Module, reference: nn.Module, trained: list[nn.Parameter]) -> None:
    """Refuse, among the parameters `trained` (the blocks', with `ends` the stem's and the
    head's too), one the reference holds too (a shallow copy: its targets would move with
    the steps) and float16 ones (Adam's squared gradients underflow to 0 there, its steps
    turn to inf and every part would be put back as it was)."""
    why = (
        "which is trained here, so its targets would move with it; expected a copy of the "
        "model taken before pruning (copy.deepcopy(model): copy.copy shares the modules)"
    )
    refuse_shared(model, reference, "model", f"{_OWNER}: invalid reference: it", why, trained)
    refuse_float16(_OWNER, model, trained)


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


def _ends(
    model: nn.Module, blocks: nn.ModuleList, batch: Any
) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """The trainable parameters of the modules one forward on `batch` calls before the
    first block (the stem) and after the last (the head), outside the blocks; a parameter
    also held by a module called elsewhere (or never) is in neither, and so are those of
    the modules that enclose the blocks."""
    inside = {id(m) for m in blocks.modules()}
    enclosing = {id(m) for m in model.modules() if any(s is blocks for s in m.modules())}
    phase = ["stem"]
    seen: dict[int, set[str]] = {}

    def note(module: nn.Module, *_: Any) -> None:
        seen.setdefault(id(module), set()).add(phase[0])

    handles = [
        blocks[0].register_forward_pre_hook(lambda *_: phase.__setitem__(0, "blocks")),
        blocks[-1].register_forward_hook(lambda *_: phase.__setitem__(0, "head")),
    ]
    for module in model.modules():
        if id(module) not in inside and id(module) not in enclosing:
            handles.append(module.register_forward_pre_hook(note))
    try:
        with torch.no_grad():
            cal.run_batch(model, batch)
    except Exception as error:
        raise cal.batch_error(0, error, owner=_OWNER)  # noqa: B904 (its cause is set)
    finally:
        for handle in handles:
            handle.remove()
    sides: dict[int, str | None] = {}
    params: dict[int, nn.Parameter] = {}
    for module in model.modules():
        where = seen.get(id(module), set())
        side = next(iter(where)) if len(where) == 1 else None
        for p in module.parameters(recurse=False):
            params[id(p)] = p
            sides[id(p)] = side if sides.get(id(p), side) == side else None
    return (
        [p for key, p in params.items() if sides[key] == "stem" and p.requires_grad],
        [p for key, p in params.items() if sides[key] == "head" and p.requires_grad],
    )


def _fit_head(
    model: nn.Module,
    reference: nn.Module,
    blocks: nn.ModuleList,
    batches: Sequence[Any],
    head: list[nn.Parameter],
    fit: _Fit,
) -> tuple[float, float]:
    """The head's steps towards the reference's outputs (the model's output error before
    and after), the blocks skipped when that gives the same output."""
    with torch.no_grad():
        with _reference_named(model, reference):
            targets = [_final(cal.run_batch(reference, batch)) for batch in batches]
        last: list[Any] = []
        handle = blocks[-1].register_forward_hook(lambda *args: last.append(args[2]))
        try:
            whole = [_final(cal.run_batch(model, batch)) for batch in batches]
        finally:
            handle.remove()
        with _replaying(blocks, last[0]):
            try:
                short = _final(cal.run_batch(model, batches[0]))
                skip = short.shape == whole[0].shape and torch.equal(short, whole[0])
            except Exception:  # the forward needs the blocks themselves: run it whole
                skip = False
    with cal.requiring_grad(model, head):
        if not skip:
            before, after, _ = fit(head, lambda k: _final(cal.run_batch(model, batches[k])),
                                   targets, _HEAD)  # fmt: skip
            return before, after

        def run(k: int) -> Tensor:
            with _replaying(blocks, last[k]):
                return _final(cal.run_batch(model, batches[k]))

        before, after, _ = fit(head, run, targets, _HEAD)
        return before, after


@contextmanager
def _replaying(blocks: nn.ModuleList, output: Any) -> Iterator[None]:
    """Every block's call returns `output` (its own forward not run) while entered."""
    own = [block.__dict__.get("forward") for block in blocks]
    for block in blocks:
        block.forward = lambda *args, **kwargs: output
    try:
        yield
    finally:
        for block, forward in zip(blocks, own, strict=True):
            del block.forward
            if forward is not None:
                block.forward = forward


def _final(output: Any) -> Tensor:
    """The model's output as one tensor: itself, its ``logits`` (a Hugging Face output's,
    which holds its loss first when given labels), or the first tensor of a tuple, list or
    mapping that is no scalar (a loss; the first tensor where all are)."""
    if isinstance(output, Tensor):
        return output
    logits = output.get("logits") if isinstance(output, Mapping) else None
    if isinstance(logits, Tensor):
        return logits
    values = output.values() if isinstance(output, Mapping) else output
    values = values if isinstance(output, Mapping | tuple | list) else ()
    tensors = [v for v in values if isinstance(v, Tensor)]
    found = next((t for t in tensors if t.dim() > 0), tensors[0] if tensors else None)
    if found is None:
        raise type_error(
            f"reconstruct_blocks: the model returned {type(output).__name__}; expected a "
            "tensor, or a tuple or mapping holding one (with ends=True)"
        )
    return found


def _outputs(block: nn.Module, inputs: Sequence[_Inputs]) -> list[Tensor]:
    """The hidden states `block` returns on each batch's inputs (an error of the block on
    one names that batch)."""
    return [_on_batch(k, block, one) for k, one in enumerate(inputs)]


def _on_batch(k: int, block: nn.Module, inputs: _Inputs) -> Tensor:
    """The hidden states `block` returns on `inputs`, those of batch `k`: an error the
    block raises is named as the model's on that batch (``calibrate.batch_error``)."""
    try:
        return _output(block, inputs)
    except Exception as error:
        raise cal.batch_error(k, error, owner=_OWNER)  # noqa: B904 (its cause is set)


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


class _Fit:
    """Adam steps of some parameters towards targets, one batch per step, the rate decaying
    along a cosine over the share of the call's budget used: `steps`, and with
    `cpu_seconds` an even share of the CPU time left over the `parts` calls left. `masks`:
    each batch's tokens that count (``token_rows``), None: all."""

    def __init__(
        self, steps: int, lr: float, cpu_seconds: float | None, parts: int,
        masks: Sequence[Tensor | None],
    ) -> None:  # fmt: skip
        self.masks = masks
        self.steps = steps
        self.lr = lr
        self.cpu_seconds = cpu_seconds
        self.parts = parts
        self.started = time.process_time()

    def _share(self, passes: float) -> float:
        """This call's CPU seconds for its steps, once its first pass over the batches took
        `passes`: what is left of the budget, less the passes still to come (one more of
        this call, three of each call after it: targets, error before and after), over
        the calls left; inf without a budget."""
        if self.cpu_seconds is None:
            return math.inf
        left = self.cpu_seconds - (time.process_time() - self.started)
        to_come = passes * (1 + 3 * (self.parts - 1))
        share = (left - to_come) / max(self.parts, 1)
        self.parts -= 1
        return share

    def __call__(
        self, params: list[nn.Parameter], run: Callable[[int], Tensor],
        targets: Sequence[Tensor], what: str, keep: bool = False,
    ) -> tuple[float, float, list[Tensor]]:  # fmt: skip
        """The relative squared error of ``run(k)`` to ``targets[k]`` over the batches
        before and after the steps (`params` put back when it did not fall), and with
        `keep` the outputs that gave the second. An error that is not finite is refused
        before any step, naming `what` is trained."""
        begun = time.process_time()
        scale = sum(
            float(token_rows(t, self.masks[k]).double().square().sum())
            for k, t in enumerate(targets)
        )
        scale = scale or 1.0
        error, first = _error(run, targets, keep, self.masks)
        before = error / scale
        if not math.isfinite(before):
            raise value_error(
                f"{_OWNER}: the error of {what} on the calibration batches is not finite (the "
                "batches, or what either model computes from them, hold NaN or inf); expected "
                "batches on which both models compute finite outputs"
            )
        seconds = self._share(time.process_time() - begun)
        if not params:
            return before, before, first
        saved = [p.detach().clone() for p in params]
        self._steps(params, run, targets, scale, seconds)
        error, outputs = _error(run, targets, keep, self.masks)
        after = error / scale
        if not after < before:  # NaN too
            with torch.no_grad():
                for p, old in zip(params, saved, strict=True):
                    p.copy_(old)
            after, outputs = before, first
        return before, after, outputs

    def _steps(
        self, params: list[nn.Parameter], run: Callable[[int], Tensor],
        targets: Sequence[Tensor], scale: float, seconds: float,
    ) -> None:  # fmt: skip
        """Steps while both `self.steps` and `seconds` of CPU time last."""
        optimizer = torch.optim.Adam(params, lr=self.lr)
        begun, step = time.process_time(), 0
        with torch.enable_grad():
            while (used := self._used(step, time.process_time() - begun, seconds)) < 1.0:
                k = step % len(targets)
                mask = self.masks[k]
                loss = (token_rows(run(k), mask) - token_rows(targets[k], mask)).square().sum()
                loss = loss * (len(targets) / scale)
                for group in optimizer.param_groups:
                    group["lr"] = self.lr * 0.5 * (1 + math.cos(math.pi * used))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()  # type: ignore[no-untyped-call]
                optimizer.step()
                step += 1
        for p in params:
            p.grad = None

    def _used(self, step: int, spent: float, seconds: float) -> float:
        """The share of the budget used after `step` steps and `spent` CPU seconds."""
        timed = spent / seconds if seconds > 0 else 1.0
        return min(1.0, max(step / self.steps, timed))


def _error(
    run: Callable[[int], Tensor], targets: Sequence[Tensor], keep: bool,
    masks: Sequence[Tensor | None],
) -> tuple[float, list[Tensor]]:  # fmt: skip
    """The squared error of ``run(k)`` to each target over the tokens ``masks[k]`` keeps
    (``token_rows``), summed, and with `keep` the outputs (whole)."""
    total, kept = 0.0, []
    with torch.no_grad():
        for k, target in enumerate(targets):
            out = run(k)
            mask = masks[k]
            total += float(
                (token_rows(out, mask) - token_rows(target, mask)).double().square().sum()
            )
            if keep:
                kept.append(out)
    return total, kept
