"""Budgets against uniform shares on all-MiniLM-L6-v2, at the same share of parameters.

Uniform: every block loses the same share of its heads and of its MLP width. Budget: the
same share of the non-embedding parameters, allocated across blocks and kinds by
``Budget(params=...)``. Same criterion ('activation', 8 windows of 128 tokens from the first
half of pydoc_data.topics), no fine-tuning; mean sentence-embedding cosine to the dense
model on paragraphs of the second half. One thread.
"""

from __future__ import annotations

import copy
import sys

import torch

import prunekit
from minilm_structure import embed, encoded, halves, load, windows


def cosine(dense: torch.nn.Module, pruned: torch.nn.Module, batches: list) -> float:
    values = []
    with torch.no_grad():
        for b in batches:
            values.append((embed(dense, b) * embed(pruned, b)).sum(1))
    return float(torch.cat(values).mean())


def main() -> None:
    torch.set_num_threads(1)
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    dense, tokenizer = load()
    first, second = halves()
    calibration = windows(tokenizer, first, 8, 128)
    test = encoded(tokenizer, second[:count], 16, 128)
    example = calibration[0]
    print(f"all-MiniLM-L6-v2, criterion activation, cosine to dense over {count} paragraphs")
    print(f"{'heads':>6} {'MLP':>6} {'share':>7} {'uniform':>8} {'budget':>8}")
    for share in (0.25, 0.5):
        uniform = copy.deepcopy(dense)
        pruned = prunekit.prune_channels(
            uniform, example, share, heads=share, criterion="activation", calibration=calibration
        )
        budgeted = copy.deepcopy(dense)
        # the same parameters as the uniform run removed, counted the budget's way
        probe = prunekit.Budget(params=0.01)
        report = prunekit.prune_channels(copy.deepcopy(dense), example, budget=probe)
        removed = _removed(pruned, report)
        got = prunekit.prune_channels(
            budgeted, example, budget=prunekit.Budget(params=removed), criterion="activation",
            calibration=calibration,
        )  # fmt: skip
        assert isinstance(got, prunekit.BudgetReport)
        scores = f"{cosine(dense, uniform, test):>8.4f} {cosine(dense, budgeted, test):>8.4f}"
        print(f"{share:>6.0%} {share:>6.0%} {got.achieved:>7.1%} {scores}")
        kept = [(r.kind, r.after) for r in got.rows]
        print("  budget kept per block:", kept)


def _removed(pruned: list, report: prunekit.BudgetReport) -> float:
    """The share of the non-embedding parameters that the uniform masks remove."""
    removed = 0
    for p in pruned:
        for s in p.group.slices:
            param = s.module._parameters.get(s.name + "_orig", s.module._parameters.get(s.name))
            if param is None or s.is_buffer:
                continue
            removed += len(p.units) * len(s.indices[0]) * param.numel() // param.shape[s.dim]
    return removed / report.total


if __name__ == "__main__":
    main()
