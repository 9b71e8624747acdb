"""A PyTorch Lightning callback that drives a GradualPruner (needs prunekit[lightning]).

``Trainer(callbacks=[GradualPruningCallback(pruner)])``: the pruner installs its masks at
setup (so checkpoints hold ``_orig``/``_mask`` keys from the start and a resumed run loads
them into the model), steps after each optimizer step (``trainer.global_step``), and its
state travels in Lightning's checkpoints as this callback's state.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl

from prunekit.schedule.pruner import GradualPruner, checked_pruner

__all__ = ["GradualPruningCallback"]


class GradualPruningCallback(pl.Callback):
    """Steps `pruner` with the Trainer's optimizer steps; saved and restored with it.

    Args:
        pruner: the ``prunekit.GradualPruner`` of the LightningModule's model; its state
            travels in the Trainer's checkpoints as this callback's.

    Attributes:
        pruner: as given.

    Raises:
        TypeError: `pruner` is not a ``prunekit.GradualPruner``.
    """

    def __init__(self, pruner: GradualPruner) -> None:
        self.pruner = checked_pruner(pruner)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.pruner.prepare()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        while self.pruner.steps < trainer.global_step:
            self.pruner.step()

    def state_dict(self) -> dict[str, Any]:
        return self.pruner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.pruner.load_state_dict(state_dict)
