"""Gradual pruning: the schedules, the pruner that follows them, its trainer callbacks, and
recovery by distillation from the dense model.

The callbacks (``prunekit.schedule.hf_callback``, ``prunekit.schedule.lightning``) import their
trainer library; this package does not.
"""

from prunekit.schedule.distill import Distiller, distillation_loss, hidden_state_loss
from prunekit.schedule.gradual import Gradual
from prunekit.schedule.pruner import GradualPruner
from prunekit.schedule.recovery import Recovery, recover
from prunekit.schedule.schedules import SCHEDULES, constant, cubic, linear
from prunekit.schedule.settings import GradualConfig

__all__ = [
    "SCHEDULES",
    "Distiller",
    "Gradual",
    "GradualConfig",
    "GradualPruner",
    "Recovery",
    "constant",
    "cubic",
    "distillation_loss",
    "hidden_state_loss",
    "linear",
    "recover",
]
