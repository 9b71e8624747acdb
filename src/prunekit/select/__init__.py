"""Selection kernels: which k entries of one or many score tensors are the smallest.

Every method ranks through here, so the rule is the same everywhere: exactly
k entries are chosen, and among equal scores the lower flat index goes first
(across several tensors: the earlier tensor first, then the lower index). No
path sorts the model, and none concatenates it: scores are read a chunk at a
time, so the work memory beyond the selections returned is a few chunks plus
the entries gathered to be ranked apart, never more than the largest tensor.

The modules, in the order a selection meets them:

- choose: smallest_k and smallest_k_many, which check what is asked and pick a path;
- sources: what the kernels take and give (sources, counts, masks) and their checks;
- plan: the fast path (CPU torch floats) or the portable one, and how to read;
- chunks: the fast path's reader, a chunk at a time into reused buffers;
- sample: the sampled guess, two bounds that almost surely enclose the k-th value;
- onepass: every selection written in one pass around the guess, then settled;
- native: the binding to the C loop (_native.c) that makes the one pass;
- radix: the exact fallback when the guess misses, from histograms of bits;
- portable: plain tensor methods a chunk at a time, for any framework and device;
- pieces, passes: the selection in pieces (tensors or shards held by several processes, or
  streamed from disk) over a group of processes (group: its collectives, and Alone, one
  process); prunekit.distributed and io/sharded.py call it;
- ties: the tie rule, the first ties in order chosen;
- tuning: every constant the kernels are tuned by, and how tests override them;
- trace: which paths a selection took, for tests.
"""

from __future__ import annotations

from prunekit.select.choose import smallest_k, smallest_k_many
from prunekit.select.native import _native as _native
from prunekit.select.sources import Count, NotFinite, Source, alive_count, all_finite

__all__ = [
    "Count",
    "NotFinite",
    "Source",
    "alive_count",
    "all_finite",
    "smallest_k",
    "smallest_k_many",
]
