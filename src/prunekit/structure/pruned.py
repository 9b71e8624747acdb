"""``PrunedGroup``: what ``prune_channels`` masked in one channel group."""

from __future__ import annotations

from dataclasses import dataclass

from prunekit.structure.graph.graph import ChannelGroup


@dataclass(frozen=True)
class PrunedGroup:
    """A group and the units of it that are now masked (indices into its units).

    Attributes:
        group: the channel group, as ``channel_groups`` finds it.
        units: the indices of its masked units (into ``range(group.size)``), ascending;
            ``compact`` removes them.
    """

    group: ChannelGroup
    units: tuple[int, ...]
