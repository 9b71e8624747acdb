"""Label helpers: one id per channel read straight from labels stored along one dim."""

from __future__ import annotations

import torch

from prunekit.structure.trace.labels import channel_ids, one_dim
from prunekit.structure.trace.tracer import Tracer


def test_one_dim_is_the_only_dim_the_labels_are_stored_along() -> None:
    ids = torch.arange(4)
    assert one_dim(ids.reshape(1, 4, 1, 1).expand(2, 4, 3, 3)) == 1
    assert one_dim(ids.reshape(2, 2)) is None  # stored along two dims
    assert one_dim(torch.tensor([[7]]).expand(3, 3)) is None  # along none


def test_channel_ids_of_per_channel_labels_equal_those_of_the_same_labels_copied() -> None:
    """Labels broadcast along every dim but the channels' are read without a merge; the same
    values stored whole give the same ids, and neither merges or blocks anything."""
    tracer = Tracer()
    ids = tracer.new_ids(5)
    ids[2] = -1  # a channel of no layer
    broadcast = ids.reshape(1, 5, 1, 1).expand(2, 5, 3, 4)
    fast = channel_ids(tracer, broadcast, 1, 5, "test")
    whole = channel_ids(tracer, broadcast.contiguous(), 1, 5, "test")
    assert fast.tolist() == whole.tolist() == ids.tolist()
    assert tracer.parent == list(range(5)) and not tracer.blocked
