"""Pruning across processes (torch.distributed): calibration statistics reduced over ranks,
DTensor layouts, and the protocol every such call runs (agree.py): arguments compared first,
an error on any rank raised on every rank, each wait bounded by the group's timeout
(TorchGroup, TIMEOUT). Global selection over ranks is the drop-in's
(``prunekit.global_unstructured(..., process_group=...)``, in ``dropin/across_ranks.py``)."""

from prunekit.distributed.collectives import TIMEOUT, RanksTimeout, TorchGroup
from prunekit.distributed.stats import all_reduce_statistics

__all__ = ["TIMEOUT", "RanksTimeout", "TorchGroup", "all_reduce_statistics"]
