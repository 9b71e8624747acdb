"""A Hugging Face Trainer callback that drives a GradualPruner (needs prunekit[hf]).

``Trainer(..., callbacks=[GradualPruningCallback(pruner)])``: the pruner installs its
masks when the Trainer is made (so checkpoints hold ``_orig``/``_mask`` keys from the
start) and steps after each optimizer step. Its state travels in every checkpoint: the
masks in the model's weights, the rest (step, amount, random generator, set-up) in
``trainer_state.json``, so ``trainer.train(resume_from_checkpoint=PATH)`` resumes it from
that checkpoint wherever it lies (``True``: the last one of ``output_dir``), as the Trainer
resumes the model, optimizer and data order. The whole state is also written beside each
checkpoint as ``gradual_pruner.pt``, for ``pruner.load_state_dict(torch.load(...))`` by
hand. One GradualPruningCallback per Trainer.
``DistillationTrainer(..., distiller=Distiller(teacher))`` trains with the distiller's loss.
"""

from __future__ import annotations

import os
from typing import Any, cast

import torch
from torch import Tensor, nn
from transformers import (
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from prunekit.core.errors import type_error, value_error
from prunekit.schedule.distill import Distiller
from prunekit.schedule.pruner import GradualPruner, checked_pruner, named_state
from prunekit.schedule.state import from_json_state

__all__ = ["STATE_FILE", "STATE_KEY", "DistillationTrainer", "GradualPruningCallback"]

STATE_FILE = "gradual_pruner.pt"
STATE_KEY = "prunekit.GradualPruner"
"""The pruner's entry in ``TrainerState.stateful_callbacks`` (trainer_state.json)."""


class GradualPruningCallback(TrainerCallback):
    """Steps `pruner` with the Trainer's optimizer steps and checkpoints its state.

    The pruner's state goes into every checkpoint's ``trainer_state.json`` (and
    ``gradual_pruner.pt`` beside it), so that ``trainer.train(resume_from_checkpoint=...)``
    resumes the schedule where it was.

    Args:
        pruner: the ``prunekit.GradualPruner`` of the model the Trainer trains.

    Attributes:
        pruner: as given.

    Raises:
        TypeError: `pruner` is not a ``prunekit.GradualPruner``.
    """

    def __init__(self, pruner: GradualPruner) -> None:
        self.pruner = checked_pruner(pruner)

    def on_init_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.pruner.prepare()

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if state.global_step == self.pruner.steps:
            return
        saved = _entries(state).get(STATE_KEY)
        if isinstance(saved, dict) and saved.get("steps") == state.global_step:
            # the model's, as the checkpoint's loaded them (0.5 stays 0.5: load_state_dict
            # checks it; the pruner's state_dict would have turned it into a 'kept')
            masks = self.pruner._installed_masks()
            where = f"GradualPruningCallback: trainer_state.json ({STATE_KEY!r})"
            self.pruner.load_state_dict(from_json_state(saved, masks, where))
            return
        path = checkpoint_file(args, state.global_step)  # written before the state travelled
        if not os.path.isfile(path):
            raise value_error(
                f"GradualPruningCallback: the Trainer resumes at step {state.global_step} "
                f"but the pruner is at step {self.pruner.steps}, the checkpoint's "
                f"trainer_state.json holds no {STATE_KEY!r} of that step and {path} does not "
                "exist; expected a checkpoint written with this callback, or the pruner's "
                "state loaded first: "
                "pruner.load_state_dict(torch.load('<checkpoint>/gradual_pruner.pt'))"
            )
        self.pruner.load_state_dict(torch.load(path, weights_only=True))

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        while self.pruner.steps < state.global_step:
            self.pruner.step()
        # into the Trainer's state, which every checkpoint saves with the model (and so the
        # masks): a run resumed from any checkpoint, wherever it was moved, finds it there
        # (the masks named, not copied as state_dict would at every step)
        _entries(state)[STATE_KEY] = named_state(self.pruner)

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if state.is_world_process_zero:
            path = checkpoint_file(args, state.global_step)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            torch.save(self.pruner.state_dict(), path)


def _entries(state: TrainerState) -> dict[str, Any]:
    """The callbacks' saved states (a dict once the TrainerState is made; typed as a list)."""
    entries: Any = state.stateful_callbacks
    if not isinstance(entries, dict):  # an older transformers: a dict of our own
        entries = vars(state).setdefault("stateful_callbacks", {})
    return cast(dict[str, Any], entries)


def checkpoint_file(args: TrainingArguments, step: int) -> str:
    """Where the pruner's state of `step` goes: beside the Trainer's checkpoint."""
    folder = os.path.join(str(args.output_dir), f"{PREFIX_CHECKPOINT_DIR}-{step}")
    return os.path.join(folder, STATE_FILE)


class DistillationTrainer(Trainer):
    """A Trainer whose loss is `distiller`'s: the dense teacher's logits distilled into the
    model being trained (the teacher moves to the model's device; evaluation too uses it).

    ``DistillationTrainer(model=pruned, args=..., train_dataset=..., distiller=Distiller(
    dense), callbacks=[GradualPruningCallback(pruner)])`` prunes gradually while distilling.

    Args:
        *args: the ``transformers.Trainer``'s positional arguments.
        distiller: the teacher and the weights of the loss, a ``prunekit.Distiller``.
        **kwargs: the ``transformers.Trainer``'s keyword arguments (``model``, ``args``,
            ``train_dataset``, ``callbacks``, ...).

    Attributes:
        distiller: as given.

    Raises:
        TypeError: `distiller` is not a ``prunekit.Distiller``.
    """

    def __init__(self, *args: Any, distiller: Distiller, **kwargs: Any) -> None:
        if not isinstance(distiller, Distiller):
            raise type_error(
                f"DistillationTrainer: invalid distiller of type {type(distiller).__name__}; "
                "expected a prunekit.schedule.Distiller"
            )
        super().__init__(*args, **kwargs)
        self.distiller = distiller
        # The distiller's loss is a mean over each batch, not a sum over its tokens: the
        # Trainer then divides it by the gradient accumulation steps itself.
        self.model_accepts_loss_kwargs = False

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Tensor | int | None = None,
    ) -> Tensor | tuple[Tensor, Any]:
        if self.distiller.hidden_weight:
            inputs = {**inputs, "output_hidden_states": True}
        outputs = model(**inputs)
        loss = self.distiller.loss(outputs, inputs)
        return (loss, outputs) if return_outputs else loss
