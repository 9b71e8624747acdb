"""Selection kernels: which k entries of one or many score tensors are the smallest.

Every method ranks through here, so the rule is the same everywhere: exactly
k entries are chosen, and among equal scores the lower flat index goes first
(across several tensors: the earlier tensor first, then the lower index). No
path sorts the model, and none concatenates it: scores are read a chunk at a
time, so the work memory beyond the selections returned is a few chunks plus
the entries gathered to be ranked apart, never more than the largest tensor.

One engine makes every selection of CPU torch floats: pieces.select, over pieces (a
whole tensor is a piece of one run) and a group of processes (group: its collectives;
Alone, the group of one process, has none). smallest_k_many (whole tensors in memory),
prunekit.distributed (tensors held by several processes) and io/sharded.py (tensors
streamed from disk) are its callers. Its steps:

1. sample: an evenly spaced sample over the ranks (sample.spaced), two of its order
   statistics that almost surely enclose the k-th value and its best guess in between
   (sample.guess, sample.enclose);
2. count: one pass (passes.between, each source through onepass.split: the C loop of
   native.py, or tensor operations a chunk at a time) counts the entries below the lower
   bound and gathers those in between with their positions, summed over the ranks;
3. refine: the k-th value among those gathered (native.nth, or radix.find over the
   ranks), or, where the bounds missed, from histograms of the scores' bits, 16 at a
   time (radix.find); scores all of one 16-bit format skip the sample when marked later
   (every caller but smallest_k_many): one pass of histograms of their bits finds it
   (passes.histograms);
4. ties: the first ties in order are chosen (ties; across ranks, pieces._share_ties);
5. mark: each piece's selection, made when asked for (pieces.Selection: the C loop or
   tensor operations).

One option changes where the marks are made. Whole tensors in memory in one process
(smallest_k_many) pass `Marks`: the count pass then also writes every selection around
the sampled guess, the one read of the scores, and steps 3-5 become the settling of the
few entries gathered in between (onepass.settle); a guess that missed leaves those marks
unused and the steps run as above.

Everything else takes the portable path (portable), still a driver of its own: tensors of
any other framework, device or dtype, negative scores ranked by value, and inputs of at
most `tuning.small` entries in all (its few plain calls are faster there). It shares the
sample (sample.spaced, sample.enclose) and the tie rule (ties, select_sorted included)
with the engine, in plain tensor methods both frameworks share, and refines in rounds of
narrowing pivots, as their bits cannot be read.

The modules, in the order a selection meets them:

- choose: smallest_k and smallest_k_many, which check what is asked and call the engine
  (or the portable path);
- sources: what the kernels take and give (sources, counts, masks) and their checks;
- plan: the engine (CPU torch floats) or the portable path, and how to read;
- pieces: the engine's driver, select, and the pieces and selections it works on;
- group: the collectives a selection over several processes needs, and Alone;
- sample: the sample and the bounds, for the engine and the portable path;
- passes: the engine's passes: the count pass, the histograms, the ties' counts;
- chunks: the count pass's reader, a chunk at a time into reused buffers;
- onepass: the count pass over one source (C loop or tensor operations), and the
  settling of the marks it wrote;
- native: the binding to the C loop (_native.c);
- radix: the k-th value from histograms of bits, over a group;
- portable: the passes in plain tensor methods, for any framework and device;
- ties: the tie rule, the first ties in order chosen, and the k smallest of one vector;
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
