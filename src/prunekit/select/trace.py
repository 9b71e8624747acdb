"""Which paths a selection took, told to whoever listens (tests); nothing is kept otherwise.

The kernels call :func:`note` with one of the events below as they go::

    from prunekit.select import trace

    with trace.recorded() as events:
        smallest_k(scores, 1000)
    assert events == ["one pass"]

Events: ``"one pass"`` (the one pass around the sampled guess held), ``"one pass
missed"`` (it was tried and did not), ``"settle"`` (the entries the one pass gathered
are about to be ranked), ``"radix"`` (the histogram passes), ``"portable"`` (the
portable path), ``"all or none"`` (k was 0 or every entry).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["note", "recorded"]

Listener = Callable[[str], None]

_LISTENERS: ContextVar[tuple[Listener, ...]] = ContextVar("prunekit_select_trace", default=())


def note(event: str) -> None:
    """Tell every listener in force here that `event` happened."""
    for listener in _LISTENERS.get():
        listener(event)


@contextmanager
def recorded(listener: Listener | None = None) -> Iterator[list[str]]:
    """Collect the events of the ``with`` block in the list it gives; call `listener` too,
    if given, as each one happens."""
    events: list[str] = []

    def keep(event: str) -> None:
        events.append(event)
        if listener is not None:
            listener(event)

    token = _LISTENERS.set((*_LISTENERS.get(), keep))
    try:
        yield events
    finally:
        _LISTENERS.reset(token)
