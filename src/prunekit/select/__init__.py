"""Selection kernels: which k entries of one or many score tensors are the smallest.

Every method ranks through here, so the rule is the same everywhere: exactly
k entries are chosen, and among equal scores the lower flat index goes first
(across several tensors: the earlier tensor first, then the lower index). No
path sorts the model, and none concatenates it: scores are read a chunk at a
time, so the work memory beyond the selections returned is a few chunks plus
the entries gathered to be ranked apart, never more than the largest tensor.

Every selection runs the same passes, whoever holds the scores:

1. sample: an evenly spaced sample (sample.spaced) and two of its order statistics
   (sample.enclose) that almost surely enclose the k-th value;
2. count: one pass counts the entries below the lower bound and keeps those in between;
3. refine: the k-th value among those kept, or, where the bounds missed, from histograms
   of the scores' bits, 16 at a time (radix.find, over a group of processes);
4. ties: the first ties in order are chosen (ties);
5. mark: each tensor's selection.

Three drivers run them. Whole tensors in memory, CPU torch floats (choose -> onepass):
the count pass is also the marking pass, written around the sample's best guess by the
C loop (native) or tensor operations a chunk at a time, the few entries in between
gathered with their positions and settled after; a miss falls back to radix.find_cut
and radix.mark. Tensors of any framework, device or dtype, or negative scores by value
(portable): the same passes in plain tensor methods, refined in rounds of narrowing
bounds, as bits cannot be read there. Tensors in pieces (pieces -> passes): held by
several processes (prunekit.distributed) or streamed from disk (io/sharded.py), over a
group of processes (group: its collectives; Alone, the group of one process): the
threshold is found before anything is marked, and each piece is marked when asked.

The modules, in the order a selection meets them:

- choose: smallest_k and smallest_k_many, which check what is asked and pick a driver;
- sources: what the kernels take and give (sources, counts, masks) and their checks;
- plan: the fast path (CPU torch floats) or the portable one, and how to read;
- chunks: the fast path's reader, a chunk at a time into reused buffers;
- sample: the sample and the bounds, for every driver;
- onepass: every selection written in one pass around the guess, then settled;
- native: the binding to the C loop (_native.c) that makes the one pass;
- radix: the k-th value from histograms of bits (every driver that reads bits), and the
  fast path's marking after it;
- portable: the passes in plain tensor methods, for any framework and device;
- pieces, passes: the passes over pieces and a group (group.py);
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
