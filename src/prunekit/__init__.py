"""prunekit: neural-network pruning by mask reparameterization.

``import prunekit as prune`` is a drop-in for ``torch.nn.utils.prune``.
"""

from prunekit.core.amount import (
    compute_nparams_to_prune,
    validate_pruning_amount,
    validate_pruning_amount_init,
)
from prunekit.core.method import BasePruningMethod, PruningBase, PruningContainer
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
    RandomStructured,
    RandomUnstructured,
)
from prunekit.report import Report, report

# Structural pruning: channel groups, their masks, compaction.
from prunekit.structure import (
    ChannelGroup,
    CompactReport,
    PrunedGroup,
    channel_groups,
    compact,
    prune_channels,
)

__version__ = "0.1.0"

__all__ = [
    "BasePruningMethod",
    "ChannelGroup",
    "CompactReport",
    "CustomFromMask",
    "Identity",
    "L1Unstructured",
    "LnStructured",
    "PrunedGroup",
    "PruningBase",
    "PruningContainer",
    "RandomStructured",
    "RandomUnstructured",
    "Report",
    "__version__",
    "channel_groups",
    "compact",
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
    "prune_channels",
    "random_structured",
    "random_unstructured",
    "refresh_pruned",
    "remove",
    "report",
    "save_pruned",
    "validate_pruning_amount",
    "validate_pruning_amount_init",
]
