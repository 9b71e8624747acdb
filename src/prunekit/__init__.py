"""prunekit: neural-network pruning by mask reparameterization.

``import prunekit as prune`` is a drop-in for ``torch.nn.utils.prune``.
"""

# The old module paths of the drop-in, kept as attributes: prunekit.functional, prunekit.methods
import prunekit.functional
import prunekit.methods  # noqa: F401
from prunekit.core.amount import (
    compute_nparams_to_prune,
    validate_pruning_amount,
    validate_pruning_amount_init,
)
from prunekit.criteria import Criterion, Magnitude, Random, SparseGPT, Taylor, Wanda

# Scale: global pruning across torch.distributed ranks (also global_unstructured(...,
# process_group=...)), statistics reduced over data-parallel ranks.
from prunekit.distributed import all_reduce_statistics
from prunekit.dropin.base_method import BasePruningMethod, PruningBase, PruningContainer
from prunekit.dropin.calls import (
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
from prunekit.dropin.torch_methods import (
    CustomFromMask,
    Identity,
    L1Unstructured,
    LnStructured,
    Pruning,
    RandomStructured,
    RandomUnstructured,
)
from prunekit.io.checkpoint import (
    load_pruned,
    load_pruned_state_dict,
    permanent_state_dict,
    refresh_pruned,
    save_pruned,
)

# Sharded safetensors checkpoints larger than memory.
from prunekit.io.sharded import prune_sharded
from prunekit.io.streamed import StreamedConfig, prune_streamed
from prunekit.patterns import NM, Channels, Pattern, PerRow, Unstructured
from prunekit.report import Report, report

# Gradual pruning.
from prunekit.schedule import (
    Distiller,
    Gradual,
    GradualPruner,
    Recovery,
    distillation_loss,
    recover,
)

# Structural pruning: channel groups, their masks, group criteria (calibrated ones too),
# compaction, compacted models saved and rebuilt with their per-layer shapes, one budget for
# the whole model, BatchNorm statistics re-estimated after pruning; depth pruning: whole
# blocks ranked on calibration data, skipped, removed.
from prunekit.structure import (
    BlockConfig,
    BlockPruning,
    BlockRemoval,
    Budget,
    BudgetReport,
    ChannelConfig,
    ChannelGroup,
    CompactReport,
    GroupCriterion,
    HandlerRegistration,
    PrunedGroup,
    RotationReport,
    channel_groups,
    compact,
    load_compacted,
    prune_blocks,
    prune_channels,
    recalibrate_norms,
    reconstruct_blocks,
    register_compacted_factory,
    register_module_handler,
    register_op_handler,
    remove_blocks,
    rotate_hidden,
    save_compacted,
    skip_blocks,
    skipped_blocks,
    unskip_blocks,
)

# A whole model by parameter names (MultiheadAttention, tied weights, the CLI's globs).
from prunekit.whole import prune_model

# torch.nn.utils.prune's private helpers under torch's names, for code (and tests) that call
# them through `import prunekit as prune`; not in __all__, as they are private there too.
_validate_pruning_amount_init = validate_pruning_amount_init
_validate_pruning_amount = validate_pruning_amount
_compute_nparams_toprune = compute_nparams_to_prune

__version__ = "0.1.0"

__all__ = [
    "NM",
    "BasePruningMethod",
    "BlockConfig",
    "BlockPruning",
    "BlockRemoval",
    "Budget",
    "BudgetReport",
    "ChannelConfig",
    "ChannelGroup",
    "Channels",
    "CompactReport",
    "Criterion",
    "CustomFromMask",
    "Distiller",
    "Gradual",
    "GradualPruner",
    "GroupCriterion",
    "HandlerRegistration",
    "Identity",
    "L1Unstructured",
    "LnStructured",
    "Magnitude",
    "Pattern",
    "PerRow",
    "PrunedGroup",
    "Pruning",
    "PruningBase",
    "PruningContainer",
    "Random",
    "RandomStructured",
    "RandomUnstructured",
    "Recovery",
    "Report",
    "RotationReport",
    "SparseGPT",
    "StreamedConfig",
    "Taylor",
    "Unstructured",
    "Wanda",
    "__version__",
    "all_reduce_statistics",
    "channel_groups",
    "compact",
    "compute_nparams_to_prune",
    "custom_from_mask",
    "distillation_loss",
    "forward_reuse",
    "global_unstructured",
    "identity",
    "is_pruned",
    "l1_unstructured",
    "ln_structured",
    "load_compacted",
    "load_pruned",
    "load_pruned_state_dict",
    "permanent_state_dict",
    "prune_blocks",
    "prune_channels",
    "prune_model",
    "prune_sharded",
    "prune_streamed",
    "random_structured",
    "random_unstructured",
    "recalibrate_norms",
    "reconstruct_blocks",
    "recover",
    "refresh_pruned",
    "register_compacted_factory",
    "register_module_handler",
    "register_op_handler",
    "remove",
    "remove_blocks",
    "report",
    "rotate_hidden",
    "save_compacted",
    "save_pruned",
    "skip_blocks",
    "skipped_blocks",
    "unskip_blocks",
    "validate_pruning_amount",
    "validate_pruning_amount_init",
]
