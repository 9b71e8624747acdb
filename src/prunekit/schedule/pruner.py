"""GradualPruner: prunes a model a little more at scheduled steps of its training.

Call ``pruner.step()`` after each optimizer step. At each update step the masks are
recomputed at the scheduled sparsity (see schedules.py) with a criterion x pattern, among
the entries still alive, and written into each tensor's one ``<name>_mask`` in place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.core.amount import Amount
from prunekit.core.errors import type_error, value_error
from prunekit.core.transaction import transaction
from prunekit.criteria.criterion import Criterion
from prunekit.criteria.magnitude import Magnitude
from prunekit.io.checkpoint import refresh_pruned
from prunekit.patterns.channels import Channels
from prunekit.patterns.nm import NM
from prunekit.patterns.pattern import Pattern
from prunekit.patterns.unstructured import Unstructured
from prunekit.schedule.companion_masks import Companions
from prunekit.schedule.gradual import Gradual, find_gradual
from prunekit.schedule.masks import global_masks, layer_mask
from prunekit.schedule.settings import (
    CRITERIA,
    GradualConfig,
    GradualOptions,
    Unpack,
    config_of,
)
from prunekit.schedule.state import check_state, json_state, pruner_state, rewound_state
from prunekit.structure.graph.graph import split_inputs
from prunekit.whole.targets import Place, Target, select_targets

__all__ = ["CRITERIA", "PATTERNS", "GradualConfig", "GradualPruner"]

OWNER = "GradualPruner"

PATTERNS: dict[str, Callable[[], Pattern]] = {
    "unstructured": Unstructured,
    "channels": lambda: Channels(dim=0, norm=2),
}
"""The patterns GradualPruner took by name before it spoke whole.Config's vocabulary
('channels' is now method 'ln'); kept for the code that reads it."""


class GradualPruner:
    """Prunes `model` from `initial_amount` to `final_amount` between two training steps.

    The schedule (``'cubic'``, ``'linear'``, ``'constant'`` or a callable step ->
    sparsity) gives the sparsity at each update step: `start_step`, every `every` steps
    after it, and `end_step`. Call ``step()`` once after each optimizer step; the t-th
    call is step t (a `start_step` of 0 updates when the pruner is made).

    `method` and `pattern` speak the vocabulary of every whole-model entry point
    (prune_model's, whole.Config's): `method` ranks (``'l1'``, ``'random'``, ``'ln'``:
    whole output channels by their L2 norm, or a prunekit.Criterion), `pattern` says what
    is pruned (``'unstructured'``: entries; ``'row'``: the same share of each row;
    ``'N:M'``; or a prunekit.Pattern, ``prunekit.Channels(dim=0)`` for channels ranked by
    another criterion); amounts count the pattern's units. The old spellings
    ``method='magnitude'`` and ``pattern='channels'`` still work, with a FutureWarning. A
    tensor pruned by channels keeps at least one (as prune_channels does), so that
    ``compact`` can remove the others.
    `scope='layer'` brings each tensor to the sparsity, ``'global'`` all of them together
    (entries ranked across tensors). `include`/`exclude` select parameters by name as
    prune_model does. Random choices come from the pruner's own generator, seeded with
    `seed` (default: ``torch.initial_seed()``), and never disturb torch's global one.
    `example_inputs` (with ``method='ln'`` or a Channels pattern): inputs of the model's
    forward, traced once into channel groups; a channel whose weight rows are all masked
    then has its bias and norm parameters masked too, so it carries exactly 0 and
    ``compact`` removes it.

    The set-up is one GradualConfig: ``GradualPruner(model, 0.8, start_step=0,
    end_step=100)`` makes it from the keywords, ``GradualPruner(model,
    config=GradualConfig(0.8, start_step=0, end_step=100))`` takes it made.

    Args:
        model: the model trained; its parameters selected by `include` and `exclude` get a
            ``Gradual`` hook whose mask each update rewrites in place.
        final_amount: the sparsity reached at `end_step` (without `config`).
        config: the whole set-up in one GradualConfig, instead of `final_amount` and
            `options`.
        example_inputs: inputs of the model's forward, for channels (see above).
        **options: the fields of GradualConfig by keyword (see
            prunekit.schedule.settings.GradualOptions): `start_step` and `end_step`
            (needed), `every`, `schedule`, `initial_amount`, `method`, `pattern`,
            `scope`, `include`, `exclude`, `seed`.

    Attributes:
        config: the checked GradualConfig.
        model: the model pruned.
        targets: the parameters pruned, each once.
        timetable: the update steps and their sparsities.
        criterion: what ranks the entries; pattern: what is pruned (a Pattern).
        scope: 'layer' or 'global'.

    Raises:
        TypeError, ValueError: a bad argument, naming it (see GradualConfig); `config`
            with other arguments; a model that is not a module, globs that select
            nothing, tensors the pattern cannot prune.
    """

    def __init__(
        self,
        model: nn.Module,
        final_amount: float | None = None,
        *,
        config: GradualConfig | None = None,
        example_inputs: object = None,
        **options: Unpack[GradualOptions],
    ) -> None:
        checked = config_of(final_amount, config, options)
        self.config = checked
        self.timetable = checked.timetable
        self.criterion, self.pattern = checked.criterion, checked.units
        self.scope = checked.scope
        self.model = model
        if not isinstance(model, nn.Module):
            raise type_error(
                f"{OWNER}: invalid model of type {type(model).__name__}; expected a torch nn.Module"
            )
        self.targets: list[Target] = select_targets(model, checked.include, checked.exclude, OWNER)
        self._check_shapes()
        self._companions = self._traced(example_inputs)
        seed = checked.seed
        self._generator = torch.Generator().manual_seed(
            torch.initial_seed() if seed is None else seed
        )
        self._steps = 0
        self._amount = 0.0
        self._pruned: set[str] = set()  # targets this pruner has masked
        if self.timetable.is_update(0):
            self._update(0)

    @property
    def steps(self) -> int:
        """How many times step() was called (the training steps done)."""
        return self._steps

    @property
    def amount(self) -> float:
        """The sparsity the masks hold now, as scheduled at the last update (0 before)."""
        return self._amount

    @property
    def label(self) -> str:
        """What prunes, as a report shows it: ``L1``, ``L2 channels``, ``L1 global``."""
        return _label(self.criterion, self.pattern, self.scope)

    def amount_at(self, step: int) -> float:
        """The schedule's sparsity at `step`, by its formula (0 before start_step).

        Args:
            step: a training step, an int >= 0.

        Returns:
            The sparsity the schedule gives at `step`, in [0, 1].
        """
        return self.timetable.amount_at(step, OWNER)

    def prepare(self) -> None:
        """Install the reparameterization now on every target (masks of ones where nothing
        is pruned yet), as the first update would: the model's state_dict then has its
        ``_orig``/``_mask`` keys from the start, and a checkpoint loads into a model
        prepared the same way. The trainer callbacks call it; the values do not change."""
        current = [self._current(t) for t in self.targets]
        self._write([torch.ones_like(v) if m is None else m for v, m in current], self._amount)
        self._follow()

    def step(self) -> None:
        """Count one training step; at an update step, prune to the scheduled sparsity.

        A step that raises (a schedule's error, a weight that cannot be ranked, a target
        gone) is not counted, and the masks and the pruner stay as they were: call it again
        once fixed.
        """
        steps = self._steps + 1
        if self.timetable.is_update(steps):
            with self._transaction():
                self._update(steps)
        self._steps = steps

    def _transaction(self) -> Any:
        """The transaction of an update: the targets' modules (their masks are cloned, the
        weights only referenced: an update never writes them) and the pruner itself."""
        modules = [m for t in self.targets for p in t.places for m in (p.module, p.holder)]
        return transaction(modules, state=[self])

    def _update(self, step: int) -> None:
        fraction = max(self.amount_at(step), self._amount)
        seed = int(torch.randint(0, 2**62, (1,), generator=self._generator))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            masks = self._masks(fraction)
        self._write(masks, fraction)
        self._amount = fraction
        self._follow()

    def _masks(self, fraction: float) -> list[Tensor]:
        """The new mask of each target at `fraction`; nothing is changed yet."""
        current = [self._current(t) for t in self.targets]
        pairs = [(t.first.holder, t.first.own) for t in self.targets]
        if self.scope == "global":
            return global_masks(
                self.criterion,
                self.pattern,
                [values for values, _ in current],
                [mask for _, mask in current],
                fraction,
                pairs,
                [_where(t) for t in self.targets],
                OWNER,
            )
        return [
            layer_mask(self.criterion, self.pattern, values, mask, fraction, pair, _where(t))
            for t, (values, mask), pair in zip(self.targets, current, pairs, strict=True)
        ]

    def _current(self, target: Target) -> tuple[Tensor, Tensor | None]:
        """What the criterion ranks for `target`, and its mask (None: not pruned yet)."""
        mask = target.first.mask()
        orig = target.first.parameter()
        if mask is None:
            if target.name in self._pruned:
                raise value_error(
                    f"{_where(target)} lost its mask since the pruner's last update "
                    "(made permanent with prunekit.remove?); expected its mask kept until "
                    "the pruner is done"
                )
            return orig.detach(), None
        if self.pattern.PRUNING_TYPE == "structured":
            return (mask.to(dtype=orig.dtype) * orig).detach(), mask.detach()
        return orig.detach(), mask.detach()

    def _write(self, masks: Sequence[Tensor], fraction: float) -> None:
        """Install Gradual where a target has none yet, else rewrite its mask in place."""
        places = [
            (place, m) for t, m in zip(self.targets, masks, strict=True) for place in t.places
        ]
        self._write_places(places, fraction)
        self._pruned.update(t.name for t in self.targets)

    def _follow(self) -> None:
        """Mask the biases and norm parameters of the channels the targets' masks emptied."""
        if self._companions is not None:
            self._write_places(self._companions.masks(), self._amount)

    def _traced(self, example_inputs: Any) -> Companions | None:
        if example_inputs is None:
            return None
        if self.pattern.PRUNING_TYPE != "structured" or getattr(self.pattern, "dim", 0) != 0:
            raise value_error(
                f"{OWNER}: example_inputs is for method='ln' (output channels, dim 0), "
                f"whose emptied channels it masks whole; got pattern={self.pattern!r}"
            )
        split_inputs(example_inputs, OWNER)
        return Companions(self.model, example_inputs, self.targets)

    def _write_places(self, places: Sequence[tuple[Place, Tensor]], fraction: float) -> None:
        """Install Gradual where a place has none yet, else rewrite its mask in place."""
        label = self.label
        fresh = [(p, m) for p, m in places if find_gradual(p.holder, p.own) is None]
        with transaction([x for p, _ in fresh for x in (p.module, p.holder)]):
            for p, m in fresh:
                Gradual.apply(p.module, p.leaf, m, label=label, amount=fraction)
        installed = {id(p) for p, _ in fresh}
        with torch.no_grad():
            for p, m in places:
                hook = find_gradual(p.holder, p.own)
                buffer = p.mask()
                assert hook is not None and buffer is not None
                if hook.mask is not buffer:
                    hook.mask = buffer  # the buffer was replaced (a load, a pruning)
                if id(p) not in installed:
                    buffer.copy_(m)
                hook.amount = fraction
                hook.label = label
        for p, _ in places:
            refresh_pruned(p.holder)

    def _check_shapes(self) -> None:
        if isinstance(self.pattern, NM) and self.timetable.final_amount > 0:
            for t in self.targets:  # its groups must divide every tensor, known now
                self.pattern.check(tuple(_shape(t)), Amount(self.pattern.fraction, _where(t)))
        if self.pattern.PRUNING_TYPE != "structured":
            return
        for t in self.targets:
            shape = _shape(t)
            if len(shape) < 2:
                raise value_error(
                    f"{_where(t)}: pattern={self.pattern!r} prunes channels, which a "
                    f"tensor of shape {tuple(shape)} has not; expected tensors of 2 or more "
                    "dims (exclude it, or prune it with pattern='unstructured')"
                )

    # -- Saving, resuming, rewinding ----------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs: step, amount, generator, masks, and the set-up
        (checked on load). Plain tensors and numbers: ``torch.load(weights_only=True)``
        reads it.

        Returns:
            A dict for ``torch.save`` and ``load_state_dict``.
        """
        return pruner_state(self, self._installed_masks(), self._generator.get_state())

    def _installed_masks(self) -> dict[str, Tensor]:
        """The mask buffers of the targets pruned so far, by target name, as the model holds
        them (not copied, not turned to booleans: a mask loaded into the model from a
        checkpoint is read as it was saved, a 0.5 too).

        Returns:
            A dict of target name -> the module's ``<name>_mask`` buffer.
        """
        return {t.name: _mask(t) for t in self.targets if t.name in self._pruned}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from `state`: masks installed (or rewritten), step, amount, generator.

        Load it before the model's state_dict, which then finds its ``_orig``/``_mask``
        keys. The state must come from a pruner set up the same way on the same model,
        its masks of the targets' shapes holding only 0 and 1 (or False and True); if it
        does not fit, nothing changes.

        Args:
            state: what ``state_dict()`` returned (or ``torch.load`` read back).
        """
        checked = check_state(self, state, [_shape(t) for t in self.targets], OWNER)
        steps, amount, generator, masks = checked
        with self._transaction():
            self._install(steps, amount, generator, masks)

    def _install(self, steps: int, amount: float, generator: Tensor,
                 masks: Mapping[str, Tensor]) -> None:  # fmt: skip
        chosen = [
            (t, masks[t.name].to(dtype=orig.dtype, device=orig.device))
            for t in self.targets
            if t.name in masks and (orig := t.first.parameter()) is not None
        ]
        if chosen:
            targets, self.targets = self.targets, [t for t, _ in chosen]
            try:
                self._write([m for _, m in chosen], amount)
            finally:
                self.targets = targets
            self._amount = amount
            self._follow()
        self._generator.set_state(generator)
        self._steps, self._amount = steps, amount
        self._pruned = {t.name for t, _ in chosen}

    def rewind(self, state_dict: Mapping[str, Tensor]) -> None:
        """Put the model's weights back to `state_dict` (taken earlier, pruned or not),
        keeping the masks: the weight rewinding of the lottery-ticket procedure.

        An unpruned tensor ``fc.weight`` of `state_dict` is loaded into ``fc.weight_orig``;
        every other entry (biases, buffers) is loaded as it is, strictly.

        Args:
            state_dict: the model's state_dict taken earlier (before pruning, or pruned).
        """
        state = rewound_state(self.model, state_dict, OWNER)  # keys and shapes checked
        with transaction(self.model, writes=list(self.model.parameters())):
            self.model.load_state_dict(state)


def checked_pruner(pruner: Any) -> GradualPruner:
    """`pruner`, refused unless it is a GradualPruner (the trainer callbacks' one argument)."""
    if not isinstance(pruner, GradualPruner):
        raise type_error(
            f"GradualPruningCallback: invalid pruner of type {type(pruner).__name__}; "
            "expected a prunekit.GradualPruner"
        )
    return pruner


def _label(criterion: Criterion, pattern: Pattern, scope: str) -> str:
    channels = pattern.PRUNING_TYPE == "structured"
    if isinstance(criterion, Magnitude):
        norm = getattr(pattern, "norm", 2) if channels else 1
        name = f"L{norm:g}" if isinstance(norm, int | float) else f"L{norm}"
    else:
        name = type(criterion).__name__
    return name + (" channels" if channels else "") + (" global" if scope == "global" else "")


def _mask(target: Target) -> Tensor:
    mask = target.first.mask()
    assert mask is not None
    return mask


def _shape(target: Target) -> torch.Size:
    return target.first.parameter().shape


def _where(target: Target) -> str:
    return f"{OWNER} ({target.name})"


def named_state(pruner: GradualPruner) -> dict[str, Any]:
    """`pruner`'s state as the Trainer's state holds it (``state.json_state``): its
    state_dict with the masks named, read without copying them.

    Args:
        pruner: the pruner.

    Returns:
        A dict of JSON values.
    """
    names = [t.name for t in pruner.targets if t.name in pruner._pruned]
    return json_state(pruner, names, pruner._generator.get_state())
