"""Patterns: how scores and an amount become a mask (each owns its fast selection).

Unstructured: the k smallest entries of a tensor, or of several ranked jointly.
Channels: whole slices along a dim, ranked by a norm of their entries' scores.
PerRow: the same share of every row. NM: n of every m consecutive entries (2:4).
"""

from prunekit.patterns.channels import Channels
from prunekit.patterns.nm import NM
from prunekit.patterns.pattern import Pattern
from prunekit.patterns.per_row import PerRow
from prunekit.patterns.unstructured import Unstructured

__all__ = ["NM", "Channels", "Pattern", "PerRow", "Unstructured"]
