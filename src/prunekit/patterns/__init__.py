"""Patterns: how scores and an amount become a mask (each owns its fast selection).

Unstructured: the k smallest entries of a tensor, or of several ranked jointly.
Channels: whole slices along a dim, ranked by a norm of their entries' scores.
"""

from prunekit.patterns.base import Pattern
from prunekit.patterns.channels import Channels
from prunekit.patterns.unstructured import Unstructured

__all__ = ["Channels", "Pattern", "Unstructured"]
