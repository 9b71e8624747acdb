"""Training steps inside a caller's ``torch.autocast``.

Autocast keeps the lower-precision copy of each parameter it casts (a leaf that requires
grad) until its outermost context ends. Steps taken inside that context change the
parameters in place, but every forward after the first one goes on reading the copies of
the values they had then: the loss and its gradient stay those of the first weights, Adam
keeps stepping the same way, and the model is measured as unchanged however far it moved.
``fresh_casts`` turns that cache off while a function trains, so each forward casts the
weights as they are, and empties it on the way out, so the caller's forwards after the
call, in the same context, do not read copies of the weights as they were before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["fresh_casts"]


@contextmanager
def fresh_casts() -> Iterator[None]:
    """Autocast's cache of cast parameters off while entered (the caller's setting put back
    after) and emptied on leaving; no effect on a forward outside autocast."""
    previous = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(False)
    try:
        yield
    finally:
        torch.set_autocast_cache_enabled(previous)
        torch.clear_autocast_cache()
