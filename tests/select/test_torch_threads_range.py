"""select.tuning.torch_threads refuses a count torch cannot hold (a C int: up to 2**31 - 1)
with its own error, naming the count and the range, and leaves torch's count as it was."""

from __future__ import annotations

import pytest
import torch

from prunekit.select import tuning

LARGEST = 2**31 - 1


pytestmark = pytest.mark.usefixtures("two_torch_threads")


@pytest.mark.parametrize("count", [LARGEST + 1, 2**32, 2**63, 2**64 + 5, 10**30])
def test_a_count_beyond_a_c_int_is_refused_by_name(count: int) -> None:
    with pytest.raises(ValueError) as raised, tuning.torch_threads(count):
        pytest.fail("the block ran")
    message = str(raised.value)
    assert message.startswith(f"tuning.torch_threads: count={count}; ")
    assert f"{LARGEST}" in message  # what is allowed
    assert torch.get_num_threads() == 2


def test_the_largest_c_int_is_accepted_and_set_back() -> None:
    """Only set and read back (no operation runs inside, so no thread is started)."""
    with tuning.torch_threads(LARGEST) as found:
        assert found == 2
        assert torch.get_num_threads() == LARGEST
    assert torch.get_num_threads() == 2
