"""sequential='layers': one block's layers calibrated a group at a time (those reading one
input together: query, key and value; the attention's output; gate and up; down), each
group on the outputs of the groups pruned before it, then the block's outputs.

Each group takes one partial run of the block per calibration input, and a run computes
only what the run before it could not have:

- it stops at the group's input: once the first member is called (the members read that
  one tensor), before any member computes;
- a call that finished in the run before, before that run's group was first called, is
  not computed again: its output, kept from that run, is returned. Only that group was
  pruned since, and the block ran the same code on the same input up to it, so the
  arguments and weights of such a call are as they were, and so is its output, to the bit.

Kept: the outputs of the calls of the block's submodules that hold a target (a Linear to
prune, or a module around some: an attention, an MLP), each call's only while no call
around it has finished (its output then holds what was needed). Memory: per calibration
input, at most the outputs of the block's sublayers that run before its last group (a
LLaMA block's: the attention's, gate's and up's). A kept output changed in place after it
was kept (a tensor's version counter moved) is computed again.

The block's code must run the same way on the same input (as block by block, each batch
runs the model the same way): the group and its sharing of one input are found on the
first input that calls a member, and each later run stops at the first member it calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

import prunekit.calibrate as cal
from prunekit.calibrate import layer_matrices

__all__ = ["GroupedRuns"]


def _versions(output: Any) -> tuple[int, ...] | None:
    """The version counters of the tensors of `output` (a tensor, or a tuple or list of
    tensors and Nones), or None for another kind of output (never kept)."""
    items = output if isinstance(output, tuple | list) else (output,)
    found = []
    for item in items:
        if isinstance(item, Tensor):
            found.append(item._version)
        elif item is not None:
            return None
    return tuple(found)


@dataclass
class _Kept:
    """One call's output, and its tensors' version counters when it was returned."""

    module: nn.Module
    output: Any
    versions: tuple[int, ...]


@dataclass
class _Run:
    """One run of the block on one input: the calls kept by the run before (replayed in
    order, `at` the next one), those kept by this run, and whether it still keeps (not
    once a member of the group was called)."""

    replay: list[_Kept]
    kept: list[_Kept] = field(default_factory=list)
    at: int = 0
    keeping: bool = True
    called: set[int] = field(default_factory=set)  # the targets called so far (ids)


class GroupedRuns:
    """Runs of `block` on `inputs` (the arguments of each call, as
    calibration.capture_block_inputs gives them) for its `targets`, a group at a time;
    inside ``with``, where the submodules holding a target have their forward wrapped.
    `numbers`: the calibration batch of each input, as errors name it (default: its index).
    `names`: each module's path in the whole model, which an error names (else its class).
    `owner`: the entry point calibrating, which an error of an input names; `hint`: what a
    block's refusal ends with (``calibrate.block_inputs.SEQUENTIAL`` where `owner` has
    that option).
    `masks`: each input's tokens that count (``cal.batch_masks`` of its batches), None: all."""

    def __init__(
        self,
        block: nn.Module,
        inputs: Sequence[cal.Inputs],
        targets: Sequence[nn.Module],
        wanted: cal.Wanted,
        numbers: Sequence[int] | None = None,
        names: Mapping[nn.Module, str] | None = None,
        *,
        owner: str,
        hint: str = "",
        masks: Sequence[Tensor | None] | None = None,
    ) -> None:
        self.block = block
        self.owner = owner
        self.hint = hint
        self.names = names
        self.inputs = list(inputs)
        self.numbers = list(range(len(self.inputs)) if numbers is None else numbers)
        self.masks: list[Tensor | None] = (
            [None] * len(self.inputs) if masks is None else list(masks)
        )
        self.wanted = wanted
        held = {id(m) for m in targets}
        self._targets = held
        self._holders = [
            m
            for m in block.modules()
            if m is not block and any(id(sub) in held for sub in m.modules())
        ]
        self._kept: list[list[_Kept]] = [[] for _ in self.inputs]
        self._run: _Run | None = None
        self._saved: list[tuple[nn.Module, Any]] = []

    def __enter__(self) -> GroupedRuns:
        for module in self._holders:
            self._saved.append((module, module.__dict__.get("forward")))
            module.forward = self._wrap(module, module.forward)
        return self

    def __exit__(self, *exc: object) -> None:
        for module, own in reversed(self._saved):
            del module.forward
            if own is not None:
                module.forward = own
        self._saved.clear()
        self._kept = [[] for _ in self.inputs]

    def _wrap(self, module: nn.Module, forward: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            run = self._run
            if run is None:
                return forward(*args, **kwargs)
            if id(module) in self._targets:
                if id(module) in run.called:  # as InputStatistics refuses it (True, False)
                    raise cal.called_twice(module, self.names)
                run.called.add(id(module))
            found = None
            if run.at < len(run.replay) and run.replay[run.at].module is module:
                found = run.replay[run.at]
                run.at += 1
            first = len(run.kept)
            if found is not None and _versions(found.output) == found.versions:
                output = found.output
            else:
                output = forward(*args, **kwargs)
            versions = _versions(output) if run.keeping else None
            if versions is not None:  # this call's output holds those of the calls inside
                del run.kept[first:]
                run.kept.append(_Kept(module, output, versions))
            return output

        cal.calls_back(call)
        return call

    def next_group(
        self, modules: Sequence[nn.Module]
    ) -> tuple[cal.InputStatistics, list[nn.Module]]:
        """The wanted statistics of the first of `modules` the block calls and of those
        reading the same input tensor (query, key and value; gate and up), with those
        modules in the order called (none: no module of `modules` ran on any input).
        Called again once they are pruned, it gives the next group, calibrated on the
        pruned ones' outputs."""
        patches = self.wanted.patches
        group: list[nn.Module] = []
        read: list[Any] = []
        finding = True  # on the input where the group is found, until it is complete

        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            run = self._run
            assert run is not None
            if not finding:
                if any(m is module for m in group):
                    run.keeping = False
                    stats.take(module, args, kwargs)
                    raise cal.Stop
                return
            x = layer_matrices.layer_input(module, args, kwargs) if patches else args[0]
            if group:
                alike = _shares(module, patches) and _shares(group[0], patches)
                if not (alike and x is read[0] and all(m is not module for m in group)):
                    raise cal.Stop
            else:
                read.append(x)
                run.keeping = False
            group.append(module)
            stats.take(module, args, kwargs)
            if len(group) == len(modules):
                raise cal.Stop  # every module asked for is in: none is left to join

        handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in modules]
        try:
            gather = self.wanted.gather([], names=self.names)
            with gather as stats:  # hooked here, not by `stats`
                for index in range(len(self.inputs)):
                    stats.new_batch(self.masks[index])
                    self._once(index, keep=True)
                    if group:
                        finding = False
        finally:
            for handle in handles:
                handle.remove()
        return stats, group

    def check_calls(self) -> None:
        """Run the block to its end on each input (what the runs before kept replayed), so
        that a target it calls twice is refused where no run for the outputs does it (the
        runs for statistics stop at their group: a call after it is never seen)."""
        for index in range(len(self.inputs)):
            self._once(index, keep=True)

    def outputs(self) -> list[cal.Inputs]:
        """The block's outputs on each input, as the next block's inputs."""
        found = []
        for index in range(len(self.inputs)):
            found.append(self._once(index, keep=False))
        return found

    def _once(self, index: int, *, keep: bool) -> cal.Inputs:
        """Run the block on input `index`, replaying what the run before kept. With
        `keep`: a run for statistics, which keeps its calls for the next one and returns
        its input; else the block's last run, which returns the next block's inputs."""
        run = _Run(self._kept[index])
        self._run = run
        call = self.inputs[index]
        try:
            if not keep:
                return cal.run_block(self.block, call, self.owner, self.hint)
            args, kwargs = cal.own_hidden(call)  # each run from the inputs as kept
            with suppress(cal.Stop):
                self.block(*args, **kwargs)
            return call
        except Exception as error:
            number = self.numbers[index]
            raise cal.batch_error(number, error, owner=self.owner)  # noqa: B904 (cause set)
        finally:
            self._run = None
            if keep:
                self._kept[index] = run.kept


def _shares(module: nn.Module, patches: bool) -> bool:
    """Whether `module` may share one accumulator with others reading its input (as
    InputStatistics does: not a convolution's patches)."""
    return not (patches and isinstance(module, nn.modules.conv._ConvNd))
