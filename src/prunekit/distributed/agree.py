"""Collective calls that agree before they act, and tell each other when one fails.

Every prunekit call that takes a `process_group` runs this protocol, so that an error on
any rank becomes the same error on every rank, promptly, and never a hang:

1. Each rank checks its own arguments and inputs, changing nothing.
2. Start: one status exchange, then one all_gather of a digest of the arguments that must
   be the same on every rank (method, amount, pattern, n:m, criterion, ...) together with
   the rank's error, if its checks failed. If a rank failed or the digests differ, every
   rank raises the same error, naming the rank(s) and the values.
3. Every later collective is one step: a status (one all_reduce of three integers: whether
   the rank failed, and a tag of the step, so that ranks out of step are told too), then
   the collective itself. A rank whose work fails between two steps (a calibration batch,
   a criterion, a layer's solve, installing a mask) goes to the status of the others'
   next step with its error; its text follows in one all_gather, and every rank raises.
4. A call that changes a model ends with a last status step inside its transaction, so a
   rank that fails after the last collective still reaches the others, and every rank
   undoes its changes.

Every wait is bounded by the group's timeout (see group.py): a rank that died, never
makes the call or stopped with an interrupt (not told: only Exceptions are) becomes a
RanksTimeout on the others within that bound.

The error every rank raises names each failing rank and its error. It is of the type of
the failing ranks' errors where they are all the caller's (ValueError, TypeError,
IndexError, AttributeError raised on purpose, see core.errors) and of one type; else a
RuntimeError, and a failing rank whose error is not the caller's (a bug) raises that
error itself, as it was.

A call made inside another (all_reduce_statistics inside a calibrated prune_model) takes
part in the outer call's steps: `collective` returns the outer Collective.
"""

from __future__ import annotations

import numbers
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

import torch
from torch import Tensor

from prunekit.core.errors import (
    attribute_error,
    index_error,
    is_explained,
    type_error,
    value_error,
)
from prunekit.distributed.collectives import Group, RanksTimeout, group_of

__all__ = ["Collective", "canonical", "collective", "is_told"]

_TOLD = "_prunekit_told"
_TEXT = 600  # characters of each rank's error carried to the others
_MADE = {
    "ValueError": value_error,
    "TypeError": type_error,
    "IndexError": index_error,
    "AttributeError": attribute_error,
}

E = TypeVar("E", bound=BaseException)
V = TypeVar("V")
R = TypeVar("R")


def _told(error: E) -> E:
    setattr(error, _TOLD, True)
    return error


def is_told(error: BaseException) -> bool:
    """Whether every rank already knows of `error` (raised by the protocol itself, or a
    collective's own failure): it travels as it is, without another exchange."""
    return getattr(error, _TOLD, False) is True


class Collective(Group):
    """One collective call over a group: its collectives, each preceded by a status, and
    the start, finish and failure steps of the protocol (see the module's docstring)."""

    def __init__(self, group: Group, owner: str) -> None:
        self.inner = group
        self.owner = owner
        self.rank, self.size, self.timeout = group.rank, group.size, group.timeout
        self.steps = 0

    def sum(self, values: Tensor) -> Tensor:
        self._step("sum")
        return self._collective(self.inner.sum, values)

    def gather(self, values: Tensor) -> list[Tensor]:
        self._step("gather")
        return self._collective(self.inner.gather, values)

    def objects(self, value: Any) -> list[Any]:
        self._step("objects")
        return self._collective(self.inner.objects, value)

    def first(self, values: Tensor) -> Tensor:
        self._step("first")
        return self._collective(self.inner.first, values)

    def start(self, call: str, digest: Mapping[str, Any]) -> None:
        """This rank's checks passed: compare `digest` (argument name -> value, made
        comparable by `canonical`) with the other ranks'; raise on every rank if they
        differ or another rank failed. `call` names the call (it must agree too)."""
        self._step("start", {"call": repr(call), **{k: canonical(v) for k, v in digest.items()}})

    def finish(self) -> None:
        """The last step: raises on every rank if any rank failed since the last one."""
        self._step("finish")

    def fail(self, error: BaseException) -> NoReturn:
        """Tell the others of this rank's `error` at their next step, and raise the error
        every rank raises (`error` as it is, if every rank knows of it already)."""
        if is_told(error):
            raise error
        self._step("fail", error=error)
        raise AssertionError("unreachable: a failed step raises")  # pragma: no cover

    @contextmanager
    def telling(self) -> Iterator[None]:
        """Any Exception raised in the block is told to the other ranks (see fail)."""
        try:
            yield
        except Exception as error:
            self.fail(error)

    def _collective(self, run: Callable[[V], R], value: V) -> R:
        try:
            return run(value)
        except RanksTimeout as error:
            raise _told(RanksTimeout(f"{self.owner}: {error}")) from error
        except Exception as error:
            _told(error)  # the collective failed here: no exchange can follow
            raise

    def _step(
        self,
        kind: str,
        digest: dict[str, str] | None = None,
        error: BaseException | None = None,
    ) -> None:
        if self.size == 1:
            if error is not None:
                raise _told(error)
            return
        self.steps += 1
        tag = zlib.crc32(f"{kind}.{self.steps}".encode()) & 0xFFFFF
        status = torch.tensor([int(error is not None), tag, tag * tag], dtype=torch.int64)
        failed, tags, squares = self._collective(self.inner.sum, status).tolist()
        if not failed and tags * tags != squares * self.size:  # equal only if all tags are
            raise _told(
                RuntimeError(
                    f"{self.owner}: the ranks are out of step: rank {self.rank} is at its "
                    f"collective {self.steps} ({kind}) and another rank is elsewhere; "
                    "expected every rank to make the same calls in the same order"
                )
            )
        if not failed and digest is None:
            return
        found = self._collective(self.inner.objects, (digest, _describe(error)))
        if failed:
            self._raise_failure(found, error)
        _compare(self.owner, [d for d, _ in found])

    def _raise_failure(self, found: list[Any], error: BaseException | None) -> NoReturn:
        failing = [(r, d) for r, (_, d) in enumerate(found) if d is not None]
        ranks = [r for r, _ in failing]
        said = "; ".join(f"rank {r}: {name}: {text}" for r, (name, _, text) in failing)
        message = (
            f"{self.owner}: rank(s) {ranks} of the {self.size} failed, so every rank raises "
            f"this error: {said}"
        )
        names = {name for _, (name, _, _) in failing}
        caller = all(explained for _, (_, explained, _) in failing)
        kind = names.pop() if caller and len(names) == 1 else None
        if error is not None and not is_explained(error):
            raise _told(error)  # this rank's bug, as it is (the others raise RuntimeError)
        made = _MADE[kind](message) if kind in _MADE else RuntimeError(message)
        raise _told(made) from error


def _describe(error: BaseException | None) -> tuple[str, bool, str] | None:
    """What the other ranks learn of `error`: its type name, whether it is the caller's,
    and its text (cut short)."""
    if error is None:
        return None
    text = str(error)
    if len(text) > _TEXT:
        text = text[:_TEXT] + " ..."
    return type(error).__name__, is_explained(error), text


def _compare(owner: str, digests: list[dict[str, str] | None]) -> None:
    """Raise (the same error on every rank) if the ranks' digests differ."""
    found = [d or {} for d in digests]
    keys = list(dict.fromkeys(k for d in found for k in d))
    if len({d.get("call") for d in found}) > 1:  # different calls: their arguments differ too
        owner, keys = "prunekit", ["call"]
    differ = []
    for key in keys:
        values = [d.get(key, "(not given)") for d in found]
        if len(set(values)) == 1:
            continue
        ranks: dict[str, list[int]] = {}
        for r, value in enumerate(values):
            ranks.setdefault(value, []).append(r)
        differ.append(f"{key}: " + ", ".join(f"{v} on rank(s) {rs}" for v, rs in ranks.items()))
    if differ:
        raise _told(
            value_error(
                f"{owner}: the ranks were called with different arguments "
                f"({'; '.join(differ)}); expected the same on every rank of the group, so "
                "every rank raises this error and none acts"
            )
        )


def canonical(value: Any) -> str:
    """`value` as text that is equal on two ranks exactly when the arguments agree:
    numbers by value, classes by name, tensors by shape and dtype, other objects by their
    repr unless it holds an address (then by class)."""
    if value is None or isinstance(value, bool | str):
        return repr(value)
    if isinstance(value, numbers.Integral):
        return repr(int(value))
    if isinstance(value, numbers.Real):
        return repr(float(value))
    if isinstance(value, type):
        return value.__qualname__
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    if isinstance(value, tuple | list):
        inner = ", ".join(canonical(v) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    if isinstance(value, Mapping):
        pairs = sorted(f"{canonical(k)}: {canonical(v)}" for k, v in value.items())
        return "{" + ", ".join(pairs) + "}"
    if getattr(type(value), "__repr__", None) is not object.__repr__:
        text = repr(value)
        if " at 0x" not in text:
            return text[:200]
    return type(value).__qualname__


def collective(process_group: Any, owner: str) -> Collective:
    """The Collective of a call named `owner` over `process_group` (a torch.distributed
    group, None for the default one, or a prunekit Group); a Collective (the call is made
    inside another) is returned as it is. Raises ValueError if torch.distributed is not
    initialized."""
    if isinstance(process_group, Collective):
        return process_group
    return Collective(group_of(process_group, owner), owner)
