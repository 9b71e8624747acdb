"""Selection kernels: which k entries of one or many score tensors are the smallest.

Every method ranks through here, so the rule is the same everywhere: exactly
k entries are chosen, and among equal scores the lower flat index goes first
(across several tensors: the earlier tensor first, then the lower index). No
path sorts the model, and none concatenates it: scores are read a chunk at a
time, so the work memory beyond the selections returned is a few chunks plus
the entries gathered to be ranked apart, never more than the largest tensor.

One driver makes every selection: engine.run, its steps written once (all or none; a
shortcut where one read settles it; a sampled guess; one count pass about it; the k-th
value; its first ties in order; the marks), each step made by a strategy. The engine's
(pieces.Bits) takes CPU torch floats, by magnitude, or by signed value (whole tensors in
one process: the C loop compares the scores themselves, and the k-th value's bits are
read among the negative scores' magnitudes, ranked the other way, or the others'), in
pieces over a group of processes (group: its collectives; Alone, the group of one
process, has none). smallest_k_many (whole tensors in memory), prunekit.distributed
(tensors held by several processes) and io/sharded.py (tensors streamed from disk) take
it, through pieces.select. Its steps:

1. shortcut: scores all of one 16-bit format, marked later (every caller but
   smallest_k_many): one pass of histograms of their bits finds the k-th value
   (passes.histograms);
2. guess: an evenly spaced sample over the ranks (sample.spaced), two of its order
   statistics that almost surely enclose the k-th value and its best guess in between
   (sample.guess, sample.enclose);
3. count: one pass (passes.between, each source through onepass.split: the C loop of
   native.py, or tensor operations a chunk at a time) counts the entries below the lower
   bound and gathers those in between with their positions, summed over the ranks;
4. k-th value: among those gathered (native.nth, or radix.find over the ranks), or, where
   the bounds missed, from histograms of the scores' bits, 16 at a time (radix.find);
5. ties: the first ties in order are chosen (ties; across ranks, pieces._share_ties);
6. mark: each piece's selection, made when asked for (pieces.Selection: the C loop or
   tensor operations).

One option changes where the marks are made. Whole tensors in memory in one process
(smallest_k_many) pass `Marks`: the count pass then also writes every selection around
the sampled guess, the one read of the scores, and steps 4-6 become the settling of the
few entries gathered in between (onepass.settle); a guess that missed leaves those marks
unused and the steps run as above.

The portable strategy (portable.Portable) takes everything else, in plain tensor methods
both frameworks share: tensors of any other framework, device or dtype, and inputs of
at most `tuning.small` entries in all (its few plain calls are faster there). Its
shortcut ranks inputs of one chunk as one vector (select_sorted); its guess is the same
sample's, bounds inside it (sample.guess, `inside`); its count pass counts below and at
both bounds; where that missed, the k-th value is found in rounds of narrowing pivots
(sample.within), as its bits cannot be read; it marks in chunk order, the first ties as
they come.

The modules, in the order a selection meets them:

- choose: smallest_k and smallest_k_many, which check what is asked and run the driver
  with the strategy the plan says;
- sources: what the kernels take and give (sources, counts, masks) and their checks;
- plan: the engine's strategy (CPU torch floats) or the portable one, and how to read;
- engine: the one driver, run, and what its strategies give it (Steps);
- pieces: the engine's strategy (Bits), select, and the pieces and selections it works on;
- group: the collectives a selection over several processes needs, and Alone;
- sample: the sample and the bounds, for both strategies;
- passes: the engine's passes: the count pass, the histograms, the ties' counts;
- chunks: the count pass's reader, a chunk at a time into reused buffers;
- onepass: the count pass over one source (C loop or tensor operations), and the
  settling of the marks it wrote;
- native: the binding to the C loop (_native.c);
- radix: the k-th value from histograms of bits, over a group;
- portable: the portable strategy, plain tensor methods for any framework and device;
- ties: the tie rule, the first ties in order chosen, and the k smallest of one vector;
- tuning: every constant the kernels are tuned by, and how tests override them;
- trace: which paths a selection took, for tests.
"""

from __future__ import annotations

from prunekit.select.choose import smallest_k, smallest_k_many
from prunekit.select.inputs import Count, NotFinite, Source, alive_count, all_finite
from prunekit.select.native import _native as _native

__all__ = [
    "Count",
    "NotFinite",
    "Source",
    "alive_count",
    "all_finite",
    "smallest_k",
    "smallest_k_many",
]
