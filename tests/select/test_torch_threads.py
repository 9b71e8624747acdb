"""tuning.torch_threads: torch's thread count for a block, restored on leaving it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from prunekit.select import tuning


@pytest.fixture(autouse=True)
def three_threads() -> Iterator[None]:
    """Every test starts at three threads (a count no default gives) and leaves as it came."""
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_the_block_runs_at_the_count_and_the_count_found_is_restored() -> None:
    with tuning.torch_threads(1) as found:
        assert torch.get_num_threads() == 1
        assert found == 3
    assert torch.get_num_threads() == 3


def test_the_count_is_restored_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError, match="boom"), tuning.torch_threads(1):
        assert torch.get_num_threads() == 1
        raise RuntimeError("boom")
    assert torch.get_num_threads() == 3


def test_blocks_nest_each_restoring_the_count_it_found() -> None:
    with tuning.torch_threads(1) as outer:
        with tuning.torch_threads(2) as inner:
            assert torch.get_num_threads() == 2
            assert inner == 1
            with tuning.torch_threads(2):  # the same count: still restored after
                assert torch.get_num_threads() == 2
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 1
        assert outer == 3
    assert torch.get_num_threads() == 3


def test_nested_blocks_restore_in_order_when_the_inner_one_raises() -> None:
    with tuning.torch_threads(2):
        with pytest.raises(KeyError), tuning.torch_threads(1):
            raise KeyError("inner")
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 3


def test_a_count_the_block_set_itself_is_undone_too() -> None:
    with tuning.torch_threads(3):  # the count already: nothing to set on entry
        torch.set_num_threads(1)
    assert torch.get_num_threads() == 3


@pytest.mark.parametrize(
    ("count", "error", "message"),
    [
        (0, ValueError, r"tuning\.torch_threads: count=0; expected an int of at least 1"),
        (-2, ValueError, r"count=-2; expected"),
        (1.0, TypeError, r"count=1\.0 of type float; expected an int of at least 1"),
        (True, TypeError, r"count=True of type bool"),
    ],
)
def test_a_bad_count_is_refused_before_anything_changes(
    count: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message), tuning.torch_threads(count):  # type: ignore[arg-type]
        pytest.fail("the block ran")
    assert torch.get_num_threads() == 3


@pytest.mark.parametrize(("entries", "inside"), [(10, 1), (None, 3), (1 << 22, 3)])
def test_threads_for_takes_one_thread_below_one_thread_entries_only(
    entries: int | None, inside: int
) -> None:
    with tuning.threads_for(entries) as found:
        assert torch.get_num_threads() == inside
        assert found == 3
    assert torch.get_num_threads() == 3
