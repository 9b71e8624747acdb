"""Pruning across processes (torch.distributed): global selection over ranks that hold
different layers or DTensor shards, and calibration statistics reduced over ranks."""

from prunekit.distributed.prune import global_unstructured
from prunekit.distributed.stats import all_reduce_statistics

__all__ = ["all_reduce_statistics", "global_unstructured"]
