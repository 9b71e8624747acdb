"""The one transaction: a call that changes a model is undone whole when it fails.

``with transaction(model):`` (every module of `model`) or ``with transaction([a, b]):``
(those modules alone) records, before the block runs, everything a prunekit call may change:

- each module's class (compaction swaps classes) and attribute dict, and the contents of every
  dict, list and set in it (parameters, buffers, submodules, all hook dicts, the set of
  non-persistent buffers, an RNN's ``_flat_weights``), kept in the same objects so that hook
  handles and references stay valid;
- the attributes of every hook object (a PruningContainer's method list, a schedule's mask
  and amount);
- every tensor's data: a parameter or buffer whose ``.data`` was replaced gets its old data
  back, and one written in place gets its old values back (below);
- the Hugging Face config of any module (``module.config``, nested sub-configs too);
- any other object named in `state` (a pruner's step count, masks, random generator).

If the block raises anything (KeyboardInterrupt too), all of it is put back and the error
propagates unchanged.

Cost. Attribute dicts and containers are copied shallowly; tensors by reference, except:

- buffers are cloned (running statistics, masks, counters that a forward may increment in
  place), except those named in `untouched`: a mask the call replaces rather than writes (one
  as large as its weight) is watched through its version counter as parameters are;
- parameters are cloned only when named in `writes` (the ones a call knows it writes in
  place). Every other parameter is watched through its version counter (``_version``): a
  parameter changed in place that was not cloned cannot be restored, and the error raised
  says so in a note. prunekit's own calls never write an undeclared parameter in place, so
  a large model costs no copy of its weights;
- a call that writes parameters in place block by block (SparseGPT's updates, a pruning made
  permanent) declares each block's tensors just before it writes them (``write_ahead``): their
  values go to a temporary file, not to memory, so undo costs disk, not a copy of the model,
  and the values come back from the file if the call fails.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["Transaction", "transaction"]

_Containers = list[tuple[Any, Any]]
_Saved = dict[int, tuple[Any, dict[str, Any], _Containers]]


class _Journal:
    """Values written ahead to an anonymous temporary file (made on first use, gone when
    closed), each read back by its offset."""

    def __init__(self) -> None:
        self._file: Any = None
        self._end = 0

    def save(self, tensor: Tensor) -> int:
        """Append `tensor`'s values; returns where they start."""
        if self._file is None:
            # held open across calls until close(): no `with` fits
            self._file = tempfile.TemporaryFile(prefix="prunekit-undo-")  # noqa: SIM115
        values = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        start = self._end
        self._file.seek(start)
        self._file.write(values.numpy().data)
        self._end = start + values.numel()
        return start

    def load(self, start: int, into: Tensor) -> None:
        """Write the values saved at `start` into `into` (in place)."""
        assert self._file is not None
        flat = torch.empty(into.numel() * into.element_size(), dtype=torch.uint8)
        self._file.seek(start)
        got = self._file.readinto(flat.numpy().data)
        assert got == flat.numel(), (got, flat.numel())
        with torch.no_grad():
            into.copy_(flat.view(into.dtype).reshape(into.shape))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class _Tensor:
    """One parameter or buffer: its data (an alias: no copy), version and, where kept, a
    clone of its values (`copy`) or where the journal holds them (`start`)."""

    __slots__ = ("alias", "copy", "name", "start", "tensor", "version")

    def __init__(self, tensor: Tensor, name: str, copy: bool) -> None:
        self.tensor = tensor
        self.name = name
        self.alias = tensor.detach()
        self.version = -1 if tensor.is_inference() else tensor._version  # -1: not counted
        self.copy = tensor.detach().clone() if copy else None
        self.start: int | None = None

    @property
    def kept(self) -> bool:
        return self.copy is not None or self.start is not None

    def restore(self, journal: _Journal) -> str | None:
        """Put the data back; the name of a tensor whose values could not be, else None.

        Values kept are always written back: some kernels write in place without counting
        a version (batch norm's running statistics in training mode), so an unchanged
        version does not prove unchanged values."""
        self.tensor.data = self.alias  # undoes a replaced .data; no copy, no version bump
        if self.start is not None:
            journal.load(self.start, self.alias)
            return None
        if self.copy is not None:
            with torch.no_grad():
                self.alias.copy_(self.copy)
            return None
        changed = self.version >= 0 and self.alias._version != self.version
        return self.name if changed else None


def _is_config(value: Any) -> bool:
    return callable(getattr(value, "to_dict", None)) and isinstance(
        getattr(value, "__dict__", None), dict
    )


def _keep_object(obj: Any, saved: _Saved) -> None:
    """Record `obj`'s attributes and the contents of its dicts, lists, sets and generators."""
    attributes = getattr(obj, "__dict__", None)
    if not isinstance(attributes, dict) or id(obj) in saved:
        return
    inner: _Containers = []
    for value in attributes.values():
        if isinstance(value, dict):
            inner.append((value, dict(value)))
        elif isinstance(value, list):
            inner.append((value, list(value)))
        elif isinstance(value, set):
            inner.append((value, set(value)))
        elif isinstance(value, torch.Generator):
            inner.append((value, value.get_state()))
    saved[id(obj)] = (obj, dict(attributes), inner)
    for value in attributes.values():
        if _is_config(value):
            _keep_object(value, saved)


def _put_back(saved: _Saved) -> None:
    for obj, attributes, inner in saved.values():
        for container, contents in inner:
            if isinstance(container, torch.Generator):
                container.set_state(contents)
            elif isinstance(container, list):
                container[:] = contents
            else:
                container.clear()
                container.update(contents)
        own: dict[str, Any] = obj.__dict__
        own.clear()
        own.update(attributes)


class Transaction:
    """What a call may change on `modules` and `state`, recorded now; rollback() puts it back.

    Args:
        modules: a model (every module in it) or an iterable of modules (each alone).
        writes: tensors the call may write in place; their values are cloned.
        state: other objects whose attributes the call changes (a pruner).
        untouched: buffers the call does not write in place (it may replace them): not
            cloned, only watched.
    """

    def __init__(
        self,
        modules: nn.Module | Iterable[nn.Module],
        *,
        writes: Iterable[Tensor] = (),
        state: Iterable[object] = (),
        untouched: Iterable[Tensor] = (),
    ) -> None:
        found = modules.modules() if isinstance(modules, nn.Module) else modules
        self._modules: dict[int, tuple[nn.Module, type]] = {}
        for module in found:
            self._modules.setdefault(id(module), (module, type(module)))
        written = {id(t) for t in writes}
        buffers = {id(t) for module, _ in self._modules.values() for t in module.buffers(False)}
        buffers = (buffers - {id(t) for t in untouched}) | written  # writes win
        self._objects: _Saved = {}
        self._tensors: dict[int, _Tensor] = {}
        self._journal = _Journal()
        for module, _ in self._modules.values():
            _keep_object(module, self._objects)
            for hooks in _hook_dicts(module):
                for hook in hooks.values():
                    _keep_object(hook, self._objects)
            self._keep_tensors(module, "_parameters", written)
            self._keep_tensors(module, "_buffers", buffers)
        for obj in state:
            _keep_object(obj, self._objects)

    def _keep_tensors(self, module: nn.Module, kind: str, written: set[int]) -> None:
        """Record `module`'s parameters or buffers (`kind`); those in `written` cloned."""
        for name, tensor in module.__dict__.get(kind, {}).items():
            if isinstance(tensor, Tensor) and id(tensor) not in self._tensors:
                copy = id(tensor) in written
                label = f"{type(module).__name__}.{name}"
                self._tensors[id(tensor)] = _Tensor(tensor, label, copy)

    def keep(self, tensors: Iterable[Tensor]) -> None:
        """Clone `tensors` now, before the call writes them in place: for parameters the
        call learns it will write only once it has looked at the model (the consumers a
        compensation updates). Tensors the transaction did not record are not its own.

        Raises:
            RuntimeError: a tensor was written in place already (an internal error: its
                values from the start are gone).
        """
        for kept in self._unkept(tensors, "keep()"):
            kept.copy = kept.alias.clone()

    def write_ahead(self, tensors: Iterable[Tensor]) -> None:
        """Save `tensors`' values to a temporary file now, before the call writes them in
        place: the undo of a call that changes a model block by block holds no copy of
        its weights in memory (the file holds them, and goes when the transaction ends).
        Tensors already kept, and those the transaction did not record, are skipped.

        Args:
            tensors: parameters or buffers of the recorded modules, about to change in
                place.

        Raises:
            RuntimeError: a tensor was written in place already (an internal error).
            OSError: the temporary file cannot be written (a full disk).
        """
        for kept in self._unkept(tensors, "write_ahead()"):
            kept.start = self._journal.save(kept.alias)

    def _unkept(self, tensors: Iterable[Tensor], how: str) -> Iterator[_Tensor]:
        """The records of `tensors` whose values are not kept yet, unchanged so far."""
        for tensor in tensors:
            kept = self._tensors.get(id(tensor))
            if kept is None or kept.kept:
                continue
            if kept.version >= 0 and kept.alias._version != kept.version:
                raise RuntimeError(f"transaction: {kept.name} was written before {how}")
            yield kept

    def held(self) -> int:
        """The memory this transaction's copies take.

        Returns:
            Bytes of the values it holds in memory (its clones; not the journal's file).
        """
        return sum(
            k.copy.numel() * k.copy.element_size()
            for k in self._tensors.values()
            if k.copy is not None
        )

    def close(self) -> None:
        """Let go of the journal's file (the call is over: nothing left to undo from it)."""
        self._journal.close()

    def rollback(self) -> list[str]:
        """Put everything back; returns the tensors written in place that were not cloned."""
        _put_back(self._objects)
        for module, cls in self._modules.values():
            if type(module) is not cls:
                module.__class__ = cls
        lost = []
        for kept in self._tensors.values():
            name = kept.restore(self._journal)
            if name is not None:
                lost.append(name)
        return lost


def _hook_dicts(module: nn.Module) -> list[dict[Any, Any]]:
    return [
        value
        for key, value in module.__dict__.items()
        if key.endswith("_hooks") and isinstance(value, dict)
    ]


@contextmanager
def transaction(
    modules: nn.Module | Iterable[nn.Module],
    *,
    writes: Iterable[Tensor] = (),
    state: Iterable[object] = (),
    untouched: Iterable[Tensor] = (),
) -> Iterator[Transaction]:
    """Run the block; if it raises anything, roll back every change to `modules` and
    `state` (see Transaction), then re-raise the same error.

    Args:
        modules: a model (all its modules) or an iterable of modules (each alone).
        writes: tensors the block may write in place (cloned; buffers always are, but
            for `untouched`).
        state: other objects whose attributes the block changes.
        untouched: buffers the block does not write in place (a mask it replaces): only
            watched, as parameters are.

    Yields:
        The Transaction.
    """
    recorded = Transaction(modules, writes=writes, state=state, untouched=untouched)
    try:
        yield recorded
    except BaseException as error:
        lost = recorded.rollback()
        if lost:
            note = (
                "prunekit could not undo in-place writes to " + ", ".join(lost) + " (not "
                "copied: only buffers and declared tensors are)"
            )
            add_note = getattr(error, "add_note", None)  # Python 3.11+
            if callable(add_note):
                add_note(note)
            else:
                warnings.warn(note, RuntimeWarning, stacklevel=3)
        raise
    finally:
        recorded.close()
