"""Structural pruning: the channel dependency graph, group masks and exact compaction.

``channel_groups`` traces the coupled channels, ``prune_channels`` masks whole units of them,
``compact`` removes the masked units for real and checks the result, ``save_compacted`` and
``load_compacted`` save it with its shapes and rebuild it (from its folder alone, or into a
freshly built model).
"""

from prunekit.structure.compaction.compact import CompactReport, compact
from prunekit.structure.graph.graph import ChannelGroup, Slice, channel_groups
from prunekit.structure.measure import count_macs, count_params, latency_ms
from prunekit.structure.pruned import PrunedGroup
from prunekit.structure.scoring.criteria import (
    CRITERIA,
    BNScale,
    GroupCriterion,
    WeightNorm,
    group_scores,
)
from prunekit.structure.stages.entry import prune_channels

# isort: split
# Criteria that learn from calibration data; compacted models saved with their shapes.
from prunekit.structure.saving.saving import load_compacted, save_compacted
from prunekit.structure.saving.skeleton import register_factory as register_compacted_factory
from prunekit.structure.scoring.data_criteria import Activation, GroupTaylor

# isort: split
# One target for the whole model: a share of its parameters or MACs.
from prunekit.structure.budget import Budget, BudgetReport, BudgetRow

# isort: split
# Every option of prune_channels in one frozen, checked config.
from prunekit.structure.stages import ChannelConfig

# isort: split
# Depth: whole blocks ranked, skipped and removed.
from prunekit.structure.depth import (
    BlockConfig,
    BlockPruning,
    BlockRemoval,
    prune_blocks,
    remove_blocks,
    skip_blocks,
    skipped_blocks,
    unskip_blocks,
)

# isort: split
# The residual (hidden) width by rotation: norms folded, the stream rotated, directions cut.
from prunekit.structure.rotation import RotationReport, rotate_hidden

# isort: split
# BatchNorm statistics re-estimated on calibration data after pruning.
from prunekit.structure.compensation.recalibrate import recalibrate_norms

# isort: split
# Each block of a pruned model trained towards the unpruned model's block.
from prunekit.structure.compensation.reconstruct import reconstruct_blocks

# isort: split
# One's own ops and modules in the channel graph, registered process-wide.
from prunekit.structure.graph.custom import (
    HandlerRegistration,
    register_module_handler,
    register_op_handler,
)

__all__ = [
    "CRITERIA",
    "Activation",
    "BNScale",
    "BlockConfig",
    "BlockPruning",
    "BlockRemoval",
    "Budget",
    "BudgetReport",
    "BudgetRow",
    "ChannelConfig",
    "ChannelGroup",
    "CompactReport",
    "GroupCriterion",
    "GroupTaylor",
    "HandlerRegistration",
    "PrunedGroup",
    "RotationReport",
    "Slice",
    "WeightNorm",
    "channel_groups",
    "compact",
    "count_macs",
    "count_params",
    "group_scores",
    "latency_ms",
    "load_compacted",
    "prune_blocks",
    "prune_channels",
    "recalibrate_norms",
    "reconstruct_blocks",
    "register_compacted_factory",
    "register_module_handler",
    "register_op_handler",
    "remove_blocks",
    "rotate_hidden",
    "save_compacted",
    "skip_blocks",
    "skipped_blocks",
    "unskip_blocks",
]
