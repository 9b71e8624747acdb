"""``compact``: remove the fully masked channel groups for real, check the result, report.

The compacted model must compute what the masked model computed on the example inputs (eval
mode); if it does not, or anything fails on the way, the model is restored as it was and the
error says why. Where the outputs differ beyond the tolerance in the model's own precision
but are finite, both models are run again in float64 and compared there: the rounding of
float32 (or lower), which a deep model amplifies, is no difference between them; a real one
remains in float64.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten, tree_map

from prunekit.core.checks import refuse_meta
from prunekit.core.difference import largest_over
from prunekit.core.errors import value_error, warn_caller
from prunekit.core.example_inputs import ExampleInputs
from prunekit.core.transaction import Transaction, transaction
from prunekit.structure.compaction.fromconfig import pretrained_mismatches
from prunekit.structure.compaction.hfconfig import update_config
from prunekit.structure.compaction.surgery import Capture, Removal, apply, folds, narrow, plan
from prunekit.structure.families.experts import unaligned_experts
from prunekit.structure.graph.graph import ChannelGroup, check_model, split_inputs, traced_groups
from prunekit.structure.measure import Paired, count_macs, count_params, paired_latency


@dataclass(frozen=True)
class CompactReport:
    """What compaction removed and what it changed; ``str()`` is a short table.

    Latencies: median ms of one forward on the example inputs, on this CPU, the masked and
    the compacted model run alternately; `latency` holds their paired ratio and its spread;
    all None when not measured. `not_rebuilt`: for a Hugging Face model, the tensors whose
    shapes ``from_pretrained`` would not rebuild from the updated config, and the float
    attributes it would build with other values (an embedding scale kept where a tied weight
    could not take the ratio) (compact then warns: save_compacted and load_compacted(folder)
    rebuild it); empty when a save_pretrained round trip works.

    Attributes:
        groups: how many channel groups lost units.
        channels: how many units (channels, heads, hidden channels, experts) were removed.
        params_before: the model's parameter count before compaction.
        params_after: the count after it.
        macs_before: multiply-accumulates of one forward on the example inputs, before.
        macs_after: the same after compaction.
        latency_before_ms: median milliseconds of one forward of the masked model; None
            when not timed (``latency_runs=0``).
        latency_after_ms: the same for the compacted model.
        max_abs_diff: the largest absolute difference between the outputs of the masked
            and the compacted model on the example inputs.
        max_abs_output: the largest absolute output (the scale of `max_abs_diff`).
        config: the Hugging Face config fields set to the new widths, by name.
        stale: the config fields left as they were because the widths differ per layer, or
            a model built from the config would differ (save with ``save_compacted``).
        latency: the paired ratio of the two latencies and its spread; None when not timed.
        not_rebuilt: what ``from_pretrained`` would not rebuild from the updated config
            (empty when a ``save_pretrained`` round trip works).
    """

    groups: int
    channels: int
    params_before: int
    params_after: int
    macs_before: int
    macs_after: int
    latency_before_ms: float | None
    latency_after_ms: float | None
    max_abs_diff: float
    max_abs_output: float
    config: dict[str, int] = field(default_factory=dict)
    stale: tuple[str, ...] = ()
    latency: Paired | None = None
    not_rebuilt: tuple[str, ...] = ()

    @property
    def relative_error(self) -> float:
        return self.max_abs_diff / self.max_abs_output if self.max_abs_output else 0.0

    def __str__(self) -> str:
        lines = [
            f"removed {self.channels} channels in {self.groups} groups",
            _row("parameters", self.params_before, self.params_after),
            _row("MACs", self.macs_before, self.macs_after),
        ]
        if self.latency is not None:
            lines.append(f"latency     {self.latency}")
        lines.append(f"output check: max |diff| / max |output| = {self.relative_error:.2e}")
        if self.config:
            lines.append("config: " + ", ".join(f"{k}={v}" for k, v in self.config.items()))
        if self.stale:
            lines.append("config left stale (save with save_compacted): " +
                         ", ".join(self.stale))  # fmt: skip
        if self.not_rebuilt:
            lines.append(_not_rebuilt(self.not_rebuilt))
        return "\n".join(lines)


def _row(label: str, before: int, after: int) -> str:
    share = after / before if before else 1.0
    return f"{label:<11} {before:>12,} -> {after:,} ({share:.1%})"


def compact(
    model: nn.Module,
    example_inputs: ExampleInputs,
    *,
    tolerance: float = 1e-4,
    latency_runs: int = 10,
) -> CompactReport:
    """Remove every fully masked unit of `model`'s channel groups, in place.

    Tensors are sliced (a masked tensor keeps its mask on what remains, and is made plain
    where nothing remains masked); module attributes follow (channels, features, groups,
    num_features, head counts, hidden sizes) and so does a Hugging Face model's config where
    the widths are one across layers (``CompactReport.config``; what it cannot express is in
    ``stale``: the fields whose widths differ per layer, or how a model built from the config,
    as ``from_pretrained`` builds it, would differ; save with ``save_compacted`` then).
    Constants that removed channels still carry are folded into the consumers' biases.
    Checked on `example_inputs` in eval mode: the largest difference of the outputs (on the
    kept channels of an output a pruned hidden width made narrower) must stay within
    `tolerance` x the largest output (where it does not in the model's precision but both
    are finite, it must in float64: the rounding a deep model amplifies is no difference;
    the model's tensors are then copied to float64 for the check; a model that does not run
    in float64, such as experts computed by grouped_mm, is refused, the error naming the
    difference and why float64 could not check it). A model asked for its routers' logits
    (``output_router_logits``) is checked without them: they are one per expert, and the
    load-balancing loss made of them counts the experts. Both states stay in memory until
    the call returns.

    Args:
        model: the model whose units ``prune_channels`` (or masks of your own over whole
            units) masked.
        example_inputs: what one forward takes (a tensor, a tuple of positional arguments or
            a dict of keyword arguments): the groups are traced on it, and the outputs before
            and after compared on it.
        tolerance: the largest difference allowed between the outputs, as a share of the
            largest output (a float >= 0).
        latency_runs: forwards of the masked and of the compacted model to time, alternated;
            0 skips timing.

    Returns:
        What was removed, the parameters and MACs before and after, the output check and the
        latencies; ``str()`` of it is a short table.

    Raises:
        TypeError: `model` is no torch module, or `example_inputs` none of the three forms.
        ValueError: `tolerance` or `latency_runs` is out of range, a tensor of `model` is
            on the meta device (no values), `example_inputs` is empty or the model's forward
            fails on it (the model's error its cause), or the masked model computes NaN on
            it (nothing to check the compacted one against).
        RuntimeError: the compacted model's outputs differ beyond `tolerance`; the model is
            then restored as it was.
    """
    check_model(model, "compact")
    refuse_meta("compact", model)
    _check_options(tolerance, latency_runs)
    inputs = split_inputs(example_inputs, "compact")
    # the transaction holds the traced forward too: it may write buffers
    with _modes_kept(model), _without_router_logits(model), transaction(model) as masked:
        run = _compacted(model, example_inputs, inputs, masked, tolerance, latency_runs)
    return _report(model, run)


@contextlib.contextmanager
def _modes_kept(model: nn.Module) -> Iterator[None]:
    """Put every module back in its training mode (compact runs the model in eval)."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        for m, mode in modes:
            m.training = mode


def _check_options(tolerance: object, latency_runs: object) -> None:
    """Refuse a tolerance that is no float >= 0, a latency_runs that is no int >= 0."""
    if not isinstance(tolerance, float) or not tolerance >= 0:
        raise ValueError(f"compact: invalid tolerance={tolerance!r}; expected a float >= 0")
    if isinstance(latency_runs, bool) or not isinstance(latency_runs, int) or latency_runs < 0:
        raise ValueError(
            f"compact: invalid latency_runs={latency_runs!r}; expected an int >= 0 (0: no timing)"
        )


@dataclass
class _Run:
    """What one compaction removed and measured, inside its transaction."""

    found: list[ChannelGroup]
    result: Removal
    ran: set[int]  # the modules the reference forward ran
    before: tuple[int, int]  # parameters, MACs
    after: tuple[int, int]
    config: dict[str, int]
    stale: tuple[str, ...]
    diff: float
    scale: float
    timed: Paired | None


def _compacted(
    model: nn.Module,
    example_inputs: ExampleInputs,
    inputs: tuple[tuple[Any, ...], dict[str, Any]],
    masked: Transaction,
    tolerance: float,
    latency_runs: int,
) -> _Run:
    """compact's work inside its transaction: trace, remove, check the outputs, measure."""
    args, kwargs = inputs
    found = traced_groups(model, example_inputs, "auto", "compact")
    result = plan(found)
    model.eval()  # _modes_kept puts the modes back; the masked model is timed in eval
    capture = Capture(result)
    ran: set[int] = set()
    with torch.no_grad(), capture, _running(ran):
        reference = model(*args, **kwargs)
    _refuse_nan(reference)
    before = _measures(model, args, kwargs)
    apply(result, folds(result, capture), model)
    config, stale = update_config(model)
    output = _forward(model, args, kwargs)
    diff, scale = _compare(reference, output, result.outputs)
    unchecked = None
    if not diff <= tolerance * scale and math.isfinite(diff) and math.isfinite(scale):
        again = _in_float64(model, args, kwargs, masked)
        if isinstance(again, str):
            unchecked = again
        else:
            diff, scale = _compare(*again, result.outputs)
    _check(diff, scale, tolerance, unchecked)
    after = _measures(model, args, kwargs)
    timed = _latency(model, args, kwargs, masked, latency_runs)
    return _Run(found, result, ran, before, after, config, stale, diff, scale, timed)


def _refuse_nan(reference: Any) -> None:
    """Refuse example inputs on which the masked model computes NaN: no compacted output
    could be compared with it (NaN counts as a difference)."""
    for k, value in enumerate(tree_flatten(reference)[0]):
        if isinstance(value, Tensor) and value.is_floating_point() and bool(value.isnan().any()):
            raise value_error(
                f"compact: the masked model's outputs on example_inputs hold NaN (output {k}), "
                "so the compacted model cannot be checked against them; expected example "
                "inputs on which the model computes no NaN (finite ones)"
            )


def _report(model: nn.Module, run: _Run) -> CompactReport:
    """The report of a compaction, with a warning for the units no forward ran and for what
    a model built from the config would not rebuild."""
    result, before, after, timed = run.result, run.before, run.after, run.timed
    unseen = _unseen(model, run.found, run.ran) if result.units else []
    if unseen:
        warn_caller(f"compact: {type(model).__name__}: {_never_ran(unseen)}")
    not_rebuilt = pretrained_mismatches(model)
    if not_rebuilt:
        warn_caller(f"compact: {type(model).__name__}: {_not_rebuilt(not_rebuilt)}")
    return CompactReport(
        result.groups, result.units, before[0], after[0], before[1], after[1],
        timed.before_ms if timed else None, timed.after_ms if timed else None, run.diff,
        run.scale, run.config, run.stale, timed, not_rebuilt,
    )  # fmt: skip


@contextlib.contextmanager
def _without_router_logits(model: nn.Module) -> Iterator[None]:
    """Within the block, no config of `model` asks for its routers' logits: they are one per
    expert (fewer once compacted) and the load-balancing loss made of them counts the
    experts, so the outputs compared are the ones that stay equal. Put back on exit."""
    configs = {id(c): c for m in model.modules() if (c := getattr(m, "config", None)) is not None}
    found = [c for c in configs.values() if getattr(c, "output_router_logits", None) is True]
    for config in found:
        config.output_router_logits = False
    try:
        yield
    finally:
        for config in found:
            config.output_router_logits = True


@contextlib.contextmanager
def _running(ran: set[int]) -> Iterator[None]:
    """Collect the ids of the modules whose forward runs in the block."""

    def enter(module: nn.Module, _: Any) -> None:
        ran.add(id(module))

    handle = nn.modules.module.register_module_forward_pre_hook(enter)
    try:
        yield
    finally:
        handle.remove()


def _unseen(model: nn.Module, groups: list[ChannelGroup], ran: set[int]) -> list[str]:
    """The modules holding parameters that did not run on the example inputs and that no
    group slices: what they read is unknown, so their input widths stay as they were."""
    known = ran | {id(s.module) for g in groups for s in g.slices}
    return [name for name, m in model.named_modules() if id(m) not in known
            and any(p is not None for p in m._parameters.values())]  # fmt: skip


def _never_ran(names: list[str]) -> str:
    more = f" (and {len(names) - 3} more)" if len(names) > 3 else ""
    return (
        f"{', '.join(names[:3])}{more} never ran on the example inputs (in eval mode), so the "
        "channels they read are unknown and their input widths were kept: a forward that "
        "runs them (on other input shapes, or in train mode) may fail; expected example "
        "inputs that run every layer, or remove such layers before compacting"
    )


def _not_rebuilt(found: tuple[str, ...]) -> str:
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    return (
        "save_pretrained / from_pretrained cannot rebuild the compacted model from its "
        f"config: {'; '.join(found[:3])}{more}; save it with prunekit.save_compacted(model, "
        "folder) and reload it with prunekit.load_compacted(folder)"
    )


def _latency(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], masked: Transaction,
    runs: int,
) -> Paired | None:  # fmt: skip
    """The masked and the compacted model's forwards alternated (`masked` rolls the model
    back to its masked state; both states stay in memory until compact returns anyway);
    the compacted one is left."""
    if runs <= 0:
        return None
    compacted = Transaction(model)

    def to_masked() -> None:
        masked.rollback()
        model.eval()

    def to_compacted() -> None:
        compacted.rollback()

    def forward() -> None:
        with torch.inference_mode():
            model(*args, **kwargs)

    try:
        return paired_latency(to_masked, to_compacted, forward, runs)
    finally:
        compacted.rollback()


def _forward(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        with torch.no_grad():
            return model(*args, **kwargs)
    except Exception as error:
        unaligned = unaligned_experts(model)
        why = (
            "; ".join(unaligned)
            if unaligned
            else "its code may fix a channel count (a hard-coded view or split)"
        )
        raise RuntimeError(
            f"compact: the compacted model's forward failed ({type(error).__name__}: {error}); "
            f"{why}; the model was restored"
        ) from error


def _measures(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int]:
    return count_params(model), count_macs(model, args, kwargs)


def _in_float64(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], masked: Transaction
) -> tuple[Any, Any] | str:
    """The masked and the compacted model's outputs computed in float64 (floating inputs
    too); the model is left compacted, in its own dtypes (`masked` rolls it back to the
    masked state; the float64 copies of its tensors live only meanwhile). Where the model
    does not run in float64 (an op without a float64 kernel), why, as a line."""
    compacted = Transaction(model)
    wide = tree_map(_to_float64, args), tree_map(_to_float64, kwargs)
    try:
        masked.rollback()
        model.eval().double()
        which = "masked"
        with torch.no_grad():
            reference = model(*wide[0], **wide[1])
            compacted.rollback()
            model.double()
            which = "compacted"
            return reference, model(*wide[0], **wide[1])
    except Exception as error:
        return f"the {which} model's forward in float64 failed ({type(error).__name__}: {error})"
    finally:
        compacted.rollback()


def _to_float64(value: Any) -> Any:
    if isinstance(value, Tensor) and value.is_floating_point():
        return value.double()
    return value


def _check(diff: float, scale: float, tolerance: float, unchecked: str | None = None) -> None:
    """Raise if the largest difference is beyond `tolerance` x the largest output;
    `unchecked`: why it could not be compared again in float64."""
    if not diff <= tolerance * scale:  # NaN (on either side) is a difference, never a pass
        why = (
            ""
            if unchecked is None
            else f" in its own precision, and float64 cannot tell whether that is rounding: "
            f"{unchecked}; pass a larger tolerance if it is"
        )
        raise RuntimeError(
            f"compact: the compacted model differs from the masked one by {diff:.3g} (largest "
            f"output {scale:.3g}; tolerance {tolerance:g} x that){why}; the model was restored"
        )


def _compare(
    reference: Any, output: Any, narrowed: dict[int, dict[int, set[int]]]
) -> tuple[float, float]:
    """Largest |difference| and |reference| over all floating outputs (the reference on the
    kept channels where compaction made an output narrower), as ``core.difference`` compares
    them: equal infinities differ by 0, and only finite references make the scale."""
    ref, out = tree_flatten(reference)[0], tree_flatten(output)[0]
    for leaf, dims in narrowed.items():
        if leaf < len(ref) and isinstance(ref[leaf], Tensor):
            ref[leaf] = narrow(ref[leaf], dims)
    if len(ref) != len(out):
        raise RuntimeError(
            f"compact: the compacted model returns {len(out)} values, not {len(ref)}"
        )
    pairs = []
    for k, (a, b) in enumerate(zip(ref, out, strict=False)):
        if not isinstance(a, Tensor) or not a.is_floating_point():
            continue
        if not isinstance(b, Tensor) or a.shape != b.shape:
            found = tuple(b.shape) if isinstance(b, Tensor) else type(b).__name__
            raise RuntimeError(
                f"compact: output {k} of the compacted model has shape {found}, not "
                f"{tuple(a.shape)}; the model was restored"
            )
        pairs.append((a, b))
    return largest_over(pairs)
