"""Gradual pruning: the schedules, the pruner that follows them, and its trainer callbacks.

The callbacks (``prunekit.schedule.hf``, ``prunekit.schedule.lightning``) import their
trainer library; this package does not.
"""

from prunekit.schedule.hook import Gradual
from prunekit.schedule.pruner import GradualPruner
from prunekit.schedule.schedules import SCHEDULES, constant, cubic, linear

__all__ = ["SCHEDULES", "Gradual", "GradualPruner", "constant", "cubic", "linear"]
