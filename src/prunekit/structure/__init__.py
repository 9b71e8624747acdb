"""Structural pruning: the channel dependency graph, group masks and exact compaction.

``channel_groups`` traces the coupled channels, ``prune_channels`` masks whole units of them,
``compact`` removes the masked units for real and checks the result.
"""

from prunekit.structure.compact import CompactReport, compact
from prunekit.structure.criteria import CRITERIA, group_scores
from prunekit.structure.graph import ChannelGroup, Slice, channel_groups
from prunekit.structure.measure import count_macs, count_params, latency_ms
from prunekit.structure.prune import PrunedGroup, prune_channels

__all__ = [
    "CRITERIA",
    "ChannelGroup",
    "CompactReport",
    "PrunedGroup",
    "Slice",
    "channel_groups",
    "compact",
    "count_macs",
    "count_params",
    "group_scores",
    "latency_ms",
    "prune_channels",
]
