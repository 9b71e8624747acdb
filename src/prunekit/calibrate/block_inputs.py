"""A model's blocks: found, their inputs captured once, and each run to give the next one's
inputs (key/value caches left out)."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.calibrate.batches import batch_error, evaluating, run_batch
from prunekit.calibrate.statistics import Stop
from prunekit.core.errors import value_error
from prunekit.core.signature import forward_parameters

Inputs = tuple[tuple[Any, ...], dict[str, Any]]
"""The positional and keyword arguments one block was called with, for one batch."""


_CACHES = ("past_key_value", "past_key_values", "layer_past")


def block_list(model: nn.Module, owners: Sequence[nn.Module]) -> tuple[str, nn.ModuleList] | None:
    """The model's sequence of blocks: the ModuleList of two or more modules of one class
    that holds the most of `owners` (the modules to prune); None if none holds any."""
    wanted = {id(m) for m in owners}
    best: tuple[int, str, nn.ModuleList] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) < 2:
            continue
        if len({type(child) for child in module}) != 1:
            continue
        held = sum(1 for child in module for sub in child.modules() if id(sub) in wanted)
        if held and (best is None or held > best[0]):
            best = (held, name, module)
    return None if best is None else (best[1], best[2])


def cacheless(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A block's keyword arguments without its key/value cache, so it can run again."""
    kwargs = dict(kwargs)
    for key in _CACHES:
        if key in kwargs:
            kwargs[key] = None
    if "use_cache" in kwargs:
        kwargs["use_cache"] = False
    return kwargs


def _cache_positions(module: nn.Module) -> set[int]:
    """The positions at which `module`'s forward takes a key/value cache (GPT-2's blocks
    take ``past_key_values`` second): a cache given there is dropped as one by keyword."""
    params = forward_parameters(module)
    if params is None:  # no signature to read
        return set()
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    found: set[int] = set()
    for index, param in enumerate(params):
        if param.kind not in positional:
            break
        if param.name in _CACHES:
            found.add(index)
    return found


def _without_caches(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Inputs:
    """A call of `module` with its key/value cache dropped, by position or by keyword."""
    cached = _cache_positions(module)
    return tuple(None if i in cached else a for i, a in enumerate(args)), cacheless(kwargs)


def _hidden(inputs: Inputs) -> Any:
    """The hidden states of a block's call: its first positional argument, or
    ``hidden_states=`` (None where it has neither)."""
    args, kwargs = inputs
    return args[0] if args else kwargs.get("hidden_states")


def capture_block_inputs(
    model: nn.Module, block: nn.Module, batches: Sequence[Any], *, owner: str
) -> list[Inputs]:
    """Run the model on each batch up to `block` and keep what `block` was called with
    (caches dropped); nothing after the block runs. An error names `owner`, the entry
    point calibrating."""
    captured: list[Inputs] = []

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        captured.append(_without_caches(module, args, kwargs))
        raise Stop

    handle = block.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        for index, batch in enumerate(batches):
            try:
                run_batch(model, batch)
            except Stop:
                continue
            except Exception as error:
                raise batch_error(index, error, owner=owner)  # noqa: B904 (its cause is set)
            raise value_error(
                f"{owner}: calibration: batch {index} ran the model's forward without reaching its "
                f"blocks ({type(block).__name__}); expected a model that calls them"
            )
    finally:
        handle.remove()
    return captured


_SEQUENTIAL = " (or pass sequential=False)"
"""What run_block's refusals end with: a calibrated call can run the whole model instead."""


def run_block(block: nn.Module, inputs: Inputs, owner: str) -> Inputs:
    """Call `block` and return the inputs of the next one: the same arguments with the
    hidden states (the first positional one, or ``hidden_states=``) replaced. An error
    names `owner`, the entry point calibrating."""
    args, kwargs = inputs
    out = block(*args, **kwargs)
    hidden = out[0] if isinstance(out, tuple | list) and out else out
    if not isinstance(hidden, Tensor):
        shown = f"a {type(out).__name__}"
        if out is not hidden:
            shown += f" starting with a {type(hidden).__name__}"
        raise value_error(
            f"{owner}: calibration: {type(block).__name__} returned {shown}, whose hidden "
            "states the next block cannot be given; expected a tensor (or a tuple or list "
            f"starting with one){_SEQUENTIAL}"
        )
    return with_hidden(inputs, hidden, block, f"{owner}: calibration", _SEQUENTIAL)


def with_hidden(
    inputs: Inputs, hidden: Tensor, block: nn.Module, owner: str, hint: str = ""
) -> Inputs:
    """`inputs` (those `block` was called with) with the hidden states (the first
    positional argument, or ``hidden_states=``) replaced by `hidden`: the next block's.

    Raises:
        ValueError: `block` takes neither, so its hidden states cannot be told (the
            message starts with `owner` and ends with `hint`).
    """
    found = _swapped(inputs, hidden)
    if found is not None:
        return found
    raise value_error(
        f"{owner}: cannot tell which argument of {type(block).__name__} carries the hidden "
        f"states; expected a first positional argument or hidden_states={hint}"
    )


def _swapped(inputs: Inputs, hidden: Any) -> Inputs | None:
    """`inputs` with `hidden` in place of their hidden states; None where they have none."""
    args, kwargs = inputs
    if args:
        return (hidden, *args[1:]), kwargs
    if "hidden_states" in kwargs:
        return args, {**kwargs, "hidden_states": hidden}
    return None


def own_hidden(inputs: Inputs) -> Inputs:
    """`inputs` with a copy of its hidden states (the first positional argument, or
    ``hidden_states=``), for a run of a block on inputs kept for another run: a block that
    adds to its input in place (``x += ...``) leaves the kept ones as they were.

    Args:
        inputs: the positional and keyword arguments of one call of a block.

    Returns:
        The same arguments, the hidden states copied (as given where there is no tensor).
    """
    hidden = _hidden(inputs)
    found = _swapped(inputs, hidden.clone()) if isinstance(hidden, Tensor) else None
    return inputs if found is None else found


def next_inputs(block: nn.Module, inputs: Sequence[Inputs], *, owner: str) -> list[Inputs]:
    """`block`'s outputs for each batch, as the next block's inputs (an error names
    `owner`, the entry point calibrating)."""
    found = []
    for index, one in enumerate(inputs):
        try:
            found.append(run_block(block, one, owner))
        except Exception as error:
            raise batch_error(index, error, owner=owner)  # noqa: B904 (its cause is set)
    return found


BlockCalls = list[list[Inputs]]
"""Per block, per batch: the arguments the model's forward called the block with, its
hidden states left out (None in their place)."""


def block_calls(
    model: nn.Module, blocks: nn.ModuleList | Sequence[nn.Module], batches: Sequence[Any],
    wanted: int | None = None,
) -> BlockCalls | None:  # fmt: skip
    """What the model's forward gives each of `blocks` beside its hidden states, for each
    batch. A block may be called with arguments of its own (a sliding-window layer gets
    another attention mask than a full-attention one; Gemma 3's global layers another
    rotary embedding than its local ones), which the inputs captured for the first block
    do not hold.

    The batches first run the whole model in eval mode with every block passing its hidden
    states through, its own forward and hooks set aside (no block computes, its parameters
    are not read, no hook of its own sees the call); the layers after the blocks (a final
    norm, a head) run on, so that a block called again after the last one is seen. A
    forward that reads more than the hidden states from a block's output (T5's blocks hand
    on the position bias block 0 computes) then fails or hands on other shapes: the
    batches run again with the blocks computing (a full forward each). Either run checks
    the blocks' order; in the second, an argument computed from a block's output is the
    model's before anything is pruned (T5's bias comes from an embedding, which no block's
    pruning moves).

    Args:
        model: the model.
        blocks: all its blocks, in order.
        batches: the calibration batches.
        wanted: how many blocks, from the first, are calibrated (whose calls are wanted and
            whose order is checked); all by default. A block after them may be called in
            any order once they all ran.

    Returns:
        The calls of the wanted blocks; None (each block is then given the first block's
        arguments) where fewer than two blocks are wanted, or where neither run reaches the
        last wanted block with hidden states of the first block's shape at every block. A
        forward that fails after the last wanted block (its head reading what the blocks
        passed through, or held on the meta device) is taken as it ran so far.

    Raises:
        ValueError: the forward calls a wanted block out of turn, again after its turn, or
            never (naming the block and the batch); or `blocks` hold one module at two
            places, one of them wanted.
        Exception: a failure of the recording itself (a bug, never taken for a forward
            that cannot run with its blocks passed through).
    """
    count = len(blocks) if wanted is None else wanted
    if count < 2:  # the first block's inputs are captured apart
        return None
    hooked = _hooked(blocks, count)
    for through in (True, False):
        found = _record(model, blocks, batches, count, hooked, through)
        if found is not None:
            return found
    return None


def _record(
    model: nn.Module, blocks: nn.ModuleList | Sequence[nn.Module], batches: Sequence[Any],
    count: int, hooked: list[int], through: bool,
) -> BlockCalls | None:  # fmt: skip
    """``block_calls``' recording, the blocks at `hooked` passed through (`through`) or run
    as they are; None where it cannot tell the calls (see ``block_calls``)."""
    calls: BlockCalls = [[] for _ in blocks]
    shapes: list[list[object]] = [[] for _ in blocks]
    order: list[list[int]] = []  # per batch, the blocks in the order the forward calls them
    bugs: list[Exception] = []  # the recording's own failures: raised, never a fallback

    def recorder(index: int) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            try:
                seen = order[-1]
                seen.append(index)
                hidden = _hidden((args, kwargs))
                shapes[index].append(hidden.shape if isinstance(hidden, Tensor) else None)
                call = _without_caches(module, args, kwargs)
                blanked = _swapped(call, None)
                calls[index].append(call if blanked is None else blanked)
            except Exception as error:
                bugs.append(error)
                raise
            turn = len(seen) - 1
            if not (index == turn if turn < count else index >= count):
                raise Stop  # a wanted block out of turn, or called again after its turn

        return hook

    try:
        with contextlib.ExitStack() as stack:
            if through:
                stack.enter_context(_passed_through([blocks[index] for index in hooked]))
            for index in hooked:
                hook = recorder(index)
                stack.callback(
                    blocks[index].register_forward_pre_hook(hook, with_kwargs=True).remove
                )
            stack.enter_context(evaluating(model))
            stack.enter_context(torch.no_grad())
            for batch in batches:
                order.append([])
                if not _run_recorded(model, batch, order[-1], count, bugs):
                    break  # a block called out of turn, or the last wanted one never
    except _Unreached:  # a forward that needs its blocks' outputs: run them, or give up
        return None
    if order and not _in_turn(order[-1], count):
        raise _out_of_turn(blocks, order[-1], len(order) - 1, count)
    calls, shapes = calls[:count], shapes[:count]
    if any(len(found) != len(batches) for found in calls):
        return None
    if any(found != shapes[0] or None in found for found in shapes):
        return None  # a forward that takes more than the hidden states from a block's output
    return calls


_SET_ASIDE = (
    "forward",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
)
"""A block's own forward (an instance attribute, where it has one) and hooks, set aside while
``block_calls`` passes its hidden states through."""


@contextlib.contextmanager
def _passed_through(blocks: Sequence[nn.Module]) -> Iterator[None]:
    """Each of `blocks` returning the hidden states it is given, its own forward (an instance
    attribute, where it has one) and hooks set aside: no block computes, its parameters are
    not read, and no hook of its own sees the call. All restored on exit."""
    saved: list[tuple[nn.Module, dict[str, Any]]] = []
    try:
        for block in blocks:
            own = {key: block.__dict__[key] for key in _SET_ASIDE if key in block.__dict__}
            saved.append((block, own))
            for key, value in own.items():
                if key != "forward":  # set below
                    block.__dict__[key] = type(value)()  # empty hooks
            block.forward = _pass_through
        yield
    finally:
        for block, own in saved:
            for key in _SET_ASIDE:
                if key in own:
                    block.__dict__[key] = own[key]
                else:
                    block.__dict__.pop(key, None)


def _pass_through(*args: Any, **kwargs: Any) -> Any:
    """A passed-through block's forward: its hidden states, as given."""
    return _hidden((args, kwargs))


class _Unreached(Exception):
    """The forward failed before its last wanted block was called."""


def _run_recorded(
    model: nn.Module, batch: Any, seen: list[int], count: int, bugs: list[Exception]
) -> bool:
    """Run `model` on `batch`, the blocks it calls recorded into `seen`; whether they ran in
    turn (False: the recorder stopped the forward at one out of turn).

    Raises:
        _Unreached: the forward failed before the last wanted block was called.
        Exception: the recording's own failure (in `bugs`), as it is.
    """
    try:
        run_batch(model, batch)
    except Stop:
        return False
    except Exception as error:
        if bugs:
            raise bugs[0] from None
        if len(seen) < count:
            raise _Unreached from error
    return _in_turn(seen, count)


def _in_turn(seen: list[int], count: int) -> bool:
    """Whether `seen`, the blocks a forward called, calls the first `count` each once, one
    after another and before any other."""
    return seen[:count] == list(range(count)) and all(index >= count for index in seen[count:])


def _hooked(blocks: nn.ModuleList | Sequence[nn.Module], count: int) -> list[int]:
    """The positions of `blocks` to record: each module at its first place (its hooks set
    once). Raises ValueError for a module at two places of which one is wanted (the first
    `count`): its layers run more than once per batch."""
    first: dict[int, int] = {}
    for index, block in enumerate(blocks):
        before = first.setdefault(id(block), index)
        if before != index and before < count:  # hooks set once: counted at `before`
            raise value_error(
                f"calibration: the model's blocks hold one {type(block).__name__} at "
                f"positions {before} and {index} (one module run at each: its layers run more "
                "than once per batch, which no calibration of one weight matrix can follow); "
                "expected each calibrated layer to run once per forward: exclude it, or give "
                "each use its own module"
            )
    return sorted(first.values())


def _out_of_turn(
    blocks: nn.ModuleList | Sequence[nn.Module], seen: list[int], number: int, count: int
) -> ValueError:
    """The refusal of a forward that calls the first `count` of `blocks` otherwise than one
    after another, each once (`seen`: the indices it called on batch `number`, up to the
    first out of turn)."""
    expected = list(range(count))
    if seen and seen[-1] in seen[:-1]:
        what = f"calls block {seen[-1]} a second time"
    elif seen and seen[-1] != len(seen) - 1:
        what = f"calls block {seen[-1]} before block {len(seen) - 1}"
    else:
        what = f"never calls block {len(seen)}"
    shown = ", ".join(map(str, seen)) or "none"
    return value_error(
        f"calibration: the model's forward {what} of its {len(blocks)} blocks "
        f"({type(blocks[0]).__name__}) on batch {number} (called: {shown}), but block-by-block "
        f"calibration runs blocks {expected[0]} to {expected[-1]} each once, in the order the "
        "ModuleList holds them, on the outputs of the one before: each block would be "
        f"calibrated on other inputs than the model gives it; expected a forward that calls "
        f"them so{_SEQUENTIAL}"
    )


def called_as(inputs: Sequence[Inputs], calls: BlockCalls | None, index: int) -> list[Inputs]:
    """`inputs` (the hidden states the block before block `index` gave, with that block's
    arguments) with the other arguments block `index` is called with (`calls`, see
    ``block_calls``); as they are where it is called as the first block was, or `calls` is
    None.

    Args:
        inputs: per batch, the hidden states for block `index` with the arguments of the
            block before it.
        calls: what ``block_calls`` recorded, or None.
        index: the block the inputs are for.

    Returns:
        Per batch, the inputs of block `index`.
    """
    if calls is None:
        return list(inputs)
    found = []
    for k, one in enumerate(inputs):
        own, first = calls[index][k], calls[0][k]
        if _same_call(own, first):
            found.append(one)
            continue
        swapped = _swapped(own, _hidden(one))
        assert swapped is not None  # a call without hidden states is never recorded
        found.append(swapped)
    return found


def _same_call(one: Inputs, other: Inputs) -> bool:
    """Whether two calls pass the very same objects (hidden states aside, None in both)."""
    (args, kwargs), (args2, kwargs2) = one, other
    return (
        len(args) == len(args2)
        and all(a is b for a, b in zip(args, args2, strict=True))
        and kwargs.keys() == kwargs2.keys()
        and all(kwargs[k] is kwargs2[k] for k in kwargs)
    )
