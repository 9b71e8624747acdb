"""Compensation on all-MiniLM-L6-v2: heads and MLP width each -25 %, by criterion, without
and with ``compensate=True``, uniform per block and with a ``Budget`` of the same share of
the parameters. Calibration: 8 windows of 128 tokens from the first half of
pydoc_data.topics; metric: mean sentence-embedding cosine to the dense model over paragraphs
of the second half. No fine-tuning, one thread.

    python benchmarks/minilm_compensate.py [paragraphs] [criteria] [calibration windows] [damp]

`damp`: the damping of the solve relative to the mean diagonal of the Hessian, or 'auto'
(chosen per layer on held-out batches; default: what ``prune_channels`` does without
`damping`); `criteria` may name 'reference' modes as ``activation:reference``
(compensate='reference' in the '+comp.' columns).
"""

from __future__ import annotations

import copy
import sys

import torch

import prunekit
from budget_minilm import _removed, cosine
from minilm_structure import encoded, halves, load, windows


def main() -> None:
    torch.set_num_threads(1)
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    criteria = sys.argv[2].split(",") if len(sys.argv) > 2 else ["l2", "activation", "obs",
                                                                  "fluctuation"]  # fmt: skip
    dense, tokenizer = load()
    first, second = halves()
    count_windows = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    damping = (sys.argv[4] if sys.argv[4] == "auto" else float(sys.argv[4])) if len(
        sys.argv) > 4 else None  # fmt: skip
    calibration = windows(tokenizer, first, count_windows, 128)
    test = encoded(tokenizer, second[:count], 16, 128)
    example = calibration[0]
    share = 0.25
    print(f"all-MiniLM-L6-v2, heads -25 % and MLP -25 %, {count_windows} calibration windows, "
          f"cosine to dense over {count} paragraphs, damping {damping or 'default'}")  # fmt: skip
    print(f"{'criterion':<12} {'uniform':>8} {'+comp.':>8} {'budget':>8} {'+comp.':>8}")
    probe = prunekit.Budget(params=0.01)
    probe = prunekit.prune_channels(copy.deepcopy(dense), example, budget=probe)
    assert isinstance(probe, prunekit.BudgetReport)
    for name in criteria:
        criterion, _, mode = name.partition(":")
        row = []
        for budgeted in (False, True):
            for compensate in (False, True):
                model = copy.deepcopy(dense)
                data = calibration if compensate or criterion != "l2" else None
                how = (mode or True) if compensate else False
                common: dict = {"criterion": criterion, "calibration": data, "compensate": how}
                if how is True and damping is not None:
                    common["damping"] = damping
                if budgeted:
                    uniform = prunekit.prune_channels(copy.deepcopy(dense), example, share,
                                                      heads=share)  # fmt: skip
                    target = prunekit.Budget(params=_removed(uniform, probe))
                    prunekit.prune_channels(model, example, budget=target, **common)
                else:
                    prunekit.prune_channels(model, example, share, heads=share, **common)
                row.append(cosine(dense, model, test))
        print(f"{name:<12} " + " ".join(f"{c:>8.4f}" for c in row), flush=True)


if __name__ == "__main__":
    main()
