"""Depth pruning: whole blocks of a model ranked, skipped (the masks of depth) and removed.

``prune_blocks`` ranks the blocks of a ModuleList on calibration data and skips the least
important (optionally replacing each skipped span by a least-squares linear map folded into
the block before it); ``remove_blocks`` deletes them, renumbers what follows, updates a
Hugging Face config and checks the result (outputs, and a model rebuilt from the config).
"""

from prunekit.structure.depth.block_config import BlockConfig
from prunekit.structure.depth.block_pruning import (
    BlockPruning,
    prune_blocks,
    skip_blocks,
    unskip_blocks,
)
from prunekit.structure.depth.blocks import skipped_blocks
from prunekit.structure.depth.remove import BlockRemoval, remove_blocks

__all__ = [
    "BlockConfig",
    "BlockPruning",
    "BlockRemoval",
    "prune_blocks",
    "remove_blocks",
    "skip_blocks",
    "skipped_blocks",
    "unskip_blocks",
]
