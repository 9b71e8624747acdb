"""The whole-model layer: every call that prunes a whole model (or a whole state_dict)
goes through it.

- ``registry``: the methods by name ('l1', 'random', 'ln', 'wanda', 'sparsegpt',
  'taylor'), which are calibrated, which prune a state_dict; the scopes.
- ``targets``: the one selector: include/exclude globs over tensor names, a model's
  parameters each once (tied weights, an attention's out_proj, the output head).
- ``config``: ``Config``, the frozen, checked arguments of one call.
- ``model``: ``prune_model``, the front door.
- ``oneshot`` (with ``plan`` and ``calibrated``): ``run``, the one-shot engine, calibrated
  or not, run inside the one transaction of ``prunekit.core.transaction`` (prune_model is
  its one caller).
- ``vocabulary``: the argument names every entry point shares (``scope=``, ``include=``,
  ``exclude=``), and the old spellings that still work with a FutureWarning.

It stands below the entry points that use it (io, schedule, structure, tools) and imports
none of them.
"""

from prunekit.whole.config import Config
from prunekit.whole.model import prune_model
from prunekit.whole.registry import CALIBRATED, METHODS, SCOPES, Method
from prunekit.whole.targets import Place, Target, select_names, select_targets

__all__ = [
    "CALIBRATED",
    "METHODS",
    "SCOPES",
    "Config",
    "Method",
    "Place",
    "Target",
    "prune_model",
    "select_names",
    "select_targets",
]
