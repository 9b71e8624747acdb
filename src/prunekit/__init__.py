"""prunekit: neural-network pruning by mask reparameterization.

``import prunekit as prune`` is a drop-in for ``torch.nn.utils.prune``.
"""

from prunekit.core.amount import (
    compute_nparams_to_prune,
    validate_pruning_amount,
    validate_pruning_amount_init,
)
from prunekit.core.container import PruningContainer
from prunekit.core.method import BasePruningMethod, PruningBase
from prunekit.criteria import Criterion, Magnitude, Random, SparseGPT, Taylor, Wanda
from prunekit.functional import (
    custom_from_mask,
    forward_reuse,
    global_unstructured,
    identity,
    is_pruned,
    l1_unstructured,
    ln_structured,
    random_structured,
    random_unstructured,
    remove,
)
from prunekit.io.checkpoint import (
    load_pruned,
    load_pruned_state_dict,
    permanent_state_dict,
    refresh_pruned,
    save_pruned,
)
from prunekit.methods import (
    CustomFromMask,
    Identity,
    L1Unstructured,
    LnStructured,
    Pruning,
    RandomStructured,
    RandomUnstructured,
)
from prunekit.patterns import NM, Channels, Pattern, PerRow, Unstructured
from prunekit.report import Report, report

__version__ = "0.1.0"

__all__ = [
    "NM",
    "BasePruningMethod",
    "Channels",
    "Criterion",
    "CustomFromMask",
    "Identity",
    "L1Unstructured",
    "LnStructured",
    "Magnitude",
    "Pattern",
    "PerRow",
    "Pruning",
    "PruningBase",
    "PruningContainer",
    "Random",
    "RandomStructured",
    "RandomUnstructured",
    "Report",
    "SparseGPT",
    "Taylor",
    "Unstructured",
    "Wanda",
    "__version__",
    "compute_nparams_to_prune",
    "custom_from_mask",
    "forward_reuse",
    "global_unstructured",
    "identity",
    "is_pruned",
    "l1_unstructured",
    "ln_structured",
    "load_pruned",
    "load_pruned_state_dict",
    "permanent_state_dict",
    "random_structured",
    "random_unstructured",
    "refresh_pruned",
    "remove",
    "report",
    "save_pruned",
    "validate_pruning_amount",
    "validate_pruning_amount_init",
]
