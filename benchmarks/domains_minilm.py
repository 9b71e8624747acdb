"""all-MiniLM-L6-v2 rows of ``domains_llm.py``: data-free calibration windows (--minilm-augment)
and a criterion that blends the activation score with the weights' norm (--minilm-blend).

--minilm-augment SPEC, each value a row: windows added to the calibration that compensation
fits, '+'-joined KIND COUNT items ('freq32+random32'), 'none' for none:

- 'random': tokens drawn uniformly from the vocabulary's word pieces (ids 999 on, past the
  special and unused tokens of BERT's uncased vocabulary);
- 'freq': tokens drawn by the vocabulary's frequency, a Zipf law over the word pieces in
  their order (BERT's vocabulary lists them by frequency from id 1996, 'the', 'of', 'and'),
  with ',' and '.' as frequent as the commonest words;
- 'shuffle': the calibration windows' own tokens, each window shuffled (its unigram
  statistics kept, the domain's word order broken), as many as COUNT, cycling the windows.

The criterion of every such row is prepared on the domain's calibration windows only (the
added windows are not text of any domain, and scoring on them lost on docs); compensation
fits the calibration windows and the added ones together.

--minilm-blend W, each value a row: each unit's score (1 - W) x its activation score over
the mean of its group's + W x its 'l2' score over the mean of its group's. The allocation
divides every unit's score by its group's mean anyway, so the two terms weigh alike in
every group; W = 0 is the activation criterion.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch
from torch import Tensor

from prunekit.structure.graph.graph import ChannelGroup
from prunekit.structure.scoring.data_criteria import Activation
from prunekit.structure.scoring.protocol import Calibration, GroupCriterion
from prunekit.structure.scoring.weights import WeightNorm

KINDS = ("random", "freq", "shuffle")
VOCABULARY = 30522  # BERT's uncased word pieces, all-MiniLM-L6-v2's
FIRST_PIECE = 999  # past [PAD], [unused*], [UNK], [CLS], [SEP], [MASK]
FIRST_WORD = 1996  # 'the': from here the word pieces are in the order of their frequency
COMMA, PERIOD = 1010, 1012


def parse_augment(spec: str) -> list[tuple[str, int]]:
    """'freq32+random8' as [('freq', 32), ('random', 8)]; 'none' as [].

    Raises:
        SystemExit: an item that is not a kind of ``KINDS`` followed by a count >= 1.
    """
    if spec == "none":
        return []
    items = []
    for item in spec.split("+"):
        found = re.fullmatch(r"([a-z]+)(\d+)", item)
        if found is None or found[1] not in KINDS or int(found[2]) < 1:
            raise SystemExit(
                f"--minilm-augment: invalid item {item!r} of {spec!r}; expected 'none' or "
                f"'+'-joined items KIND COUNT, KIND one of {KINDS}, COUNT >= 1 ('freq32+random8')"
            )
        items.append((found[1], int(found[2])))
    return items


def augmented(spec: str, windows: list[Tensor], seed: int = 0) -> list[Tensor]:
    """The data-free windows of `spec` (see ``parse_augment``), each as long as the
    calibration windows `windows` (token ids), from a generator seeded by `seed`."""
    generator = torch.Generator().manual_seed(seed)
    length = len(windows[0])
    made: list[Tensor] = []
    for kind, count in parse_augment(spec):
        for k in range(count):
            if kind == "random":
                made.append(torch.randint(FIRST_PIECE, VOCABULARY, (length,), generator=generator))
            elif kind == "freq":
                ids, weights = _zipf()
                drawn = torch.multinomial(weights, length, replacement=True, generator=generator)
                made.append(ids[drawn])
            else:
                window = windows[k % len(windows)]
                made.append(window[torch.randperm(length, generator=generator)])
    return made


def _zipf() -> tuple[Tensor, Tensor]:
    """The word pieces from ``FIRST_WORD`` with weights 1 / (rank + 2.7), ',' and '.' first."""
    ranks = torch.arange(VOCABULARY - FIRST_WORD, dtype=torch.float64)
    ids = torch.cat([torch.tensor([COMMA, PERIOD]), torch.arange(FIRST_WORD, VOCABULARY)])
    weights = torch.cat([torch.tensor([1 / 2.0, 1 / 2.5], dtype=torch.float64), 1 / (ranks + 2.7)])
    return ids, weights


class Blend(GroupCriterion):
    """(1 - weight) x activation / its group mean + weight x 'l2' / its group mean, the
    activation norms gathered on `batches` (not on the calibration prune_channels gets).

    Args:
        weight: the share of the weights' norm, in [0, 1].
        batches: the batches the activation norms are gathered on.
    """

    calibrated = True

    def __init__(self, weight: float, batches: list[Any]) -> None:
        if not 0 <= weight <= 1:
            raise SystemExit(f"--minilm-blend: invalid weight {weight!r}; expected one in [0, 1]")
        self.weight = weight
        self.batches = batches
        self.activation = Activation()

    def gather(self, calibration: Calibration) -> None:
        self.activation.gather(dataclasses.replace(calibration, batches=self.batches))

    def scores(self, group: ChannelGroup) -> Tensor:
        found = self.activation.scores(group)
        if self.weight == 0:
            return found
        norms = WeightNorm(2).scores(group)
        return (1 - self.weight) * _relative(found) + self.weight * _relative(norms)


def _relative(scores: Tensor) -> Tensor:
    """`scores` over their mean (as they are where the mean is 0: all of them 0)."""
    mean = scores.mean()
    return scores / mean if mean > 0 else scores
