"""Pruning across processes (torch.distributed): global selection over ranks that hold
different layers or DTensor shards, calibration statistics reduced over ranks, and the
protocol every such call runs (agree.py): arguments compared first, an error on any rank
raised on every rank, each wait bounded by the group's timeout (TorchGroup, TIMEOUT)."""

from prunekit.distributed.collectives import TIMEOUT, RanksTimeout, TorchGroup
from prunekit.distributed.stats import all_reduce_statistics
from prunekit.dropin.across_ranks import global_unstructured

__all__ = ["TIMEOUT", "RanksTimeout", "TorchGroup", "all_reduce_statistics", "global_unstructured"]
