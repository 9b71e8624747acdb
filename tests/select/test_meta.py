"""A meta tensor (a shape without values) given to the selection is refused at its entry,
naming the caller and which source: the C loop would read memory it does not have."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from prunekit.select import smallest_k, smallest_k_many
from prunekit.select.pieces import Piece, select
from prunekit.select.process_group import Alone

SRC = str(Path(__file__).resolve().parents[2] / "src")
N = 100_000  # past tuning.small: the engine's C loop, not the portable path


def test_pieces_select_refuses_a_meta_piece_rather_than_crash() -> None:
    code = textwrap.dedent(
        f"""
        import torch
        from prunekit.select.pieces import Piece, select
        from prunekit.select.process_group import Alone
        t = torch.empty({N}, device="meta")
        piece = Piece(lambda: (t, None), t.numel(), t.dtype, 0)
        try:
            select([piece], 3, Alone(), owner="mine")
        except ValueError as e:
            print(e)
        """
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("mine: pieces[0] gave scores on the meta device"), done.stdout


def test_a_cpu_piece_is_still_selected() -> None:
    t = torch.arange(N, dtype=torch.float32)
    made = select([Piece(lambda: (t, None), N, t.dtype, 0)], 3, Alone(), owner="mine")
    assert made.keep(0, torch.float32).view(-1)[:4].tolist() == [0.0, 0.0, 0.0, 1.0]


@pytest.mark.parametrize("n", [10, N])
def test_smallest_k_many_refuses_meta_scores_and_flags(n: int) -> None:
    meta = torch.empty(n, device="meta")
    cpu = torch.randn(n)
    with pytest.raises(ValueError, match=r"^smallest_k_many: sources\[1\] gave scores on the meta"):
        list(smallest_k_many([lambda: (cpu, None), lambda: (meta, None)], 3))
    flags = torch.ones(n, dtype=torch.bool, device="meta")
    with pytest.raises(ValueError, match=r"^smallest_k_many: sources\[0\] gave flags on the meta"):
        list(smallest_k_many([lambda: (cpu, flags)], 3))
    with pytest.raises(ValueError, match=r"^smallest_k: sources\[0\] gave scores on the meta"):
        smallest_k(meta, 3)
