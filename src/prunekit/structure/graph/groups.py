"""The groups of coupled channels ``channel_groups`` returns: slices of tensors per unit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from torch import nn

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Pending(Generic[T_co]):
    """A value made when it is first read: ``make()`` returns it (the graph cuts the indices of
    all its slices from its tensors at once, when any of them is first read)."""

    __slots__ = ("_make",)

    def __init__(self, make: Callable[[], T_co]) -> None:
        self._make = make

    def make(self) -> T_co:
        return self._make()


class _OnRead(Generic[T]):
    """A dataclass field that may be given as a `Pending` and is made (once) when read."""

    def __init__(self, *default: T) -> None:
        self.default = default  # () or (the default,)
        self.slot = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, obj: Any, owner: type | None = None) -> T:
        if obj is None:  # the class itself: the default, the dataclass's field has none
            if not self.default:  # without one
                raise AttributeError(self.slot[1:])
            return self.default[0]
        value = obj.__dict__[self.slot]
        if isinstance(value, Pending):
            value = obj.__dict__[self.slot] = value.make()
        return value  # type: ignore[no-any-return]

    def __set__(self, obj: Any, value: T | Pending[T]) -> None:
        obj.__dict__[self.slot] = value


Units = tuple[tuple[int, ...], ...]


@dataclass(frozen=True, repr=False)
class Slice:
    """Positions along `dim` of ``module.<name>`` owned by each unit of a group.

    `role`: 'out' (the rows that make the channel), 'in' (a consumer's weight that reads it),
    'bias', 'norm' (per-channel parameters), 'buffer' (running statistics), 'depthwise' (a
    depthwise conv's rows), 'element' (a parameter combined with the channels in forward).
    For role 'in', `channels[u]` are the input channels of the op that the positions read.
    """

    module_name: str
    module: nn.Module = field(repr=False, compare=False)
    name: str
    dim: int
    role: str
    indices: _OnRead[Units] = _OnRead()
    channels: _OnRead[Units | None] = _OnRead(None)
    op: str = ""

    @classmethod
    def pending(cls, module_name: str, module: nn.Module, name: str, dim: int, role: str,
                indices: Pending[Units], channels: Pending[Units] | None,
                op: str) -> Slice:  # fmt: skip
        """A slice whose indices (and channels) are made when first read, set up without the
        dataclass's own ``__init__`` (the graph makes thousands at once)."""
        made = object.__new__(cls)
        made.__dict__.update(module_name=module_name, module=module, name=name, dim=dim,
                             role=role, _indices=indices, _channels=channels, op=op)  # fmt: skip
        return made

    def __repr__(self) -> str:  # the module and the indices left out
        return (f"Slice(module_name={self.module_name!r}, name={self.name!r}, dim={self.dim!r}, "
                f"role={self.role!r}, op={self.op!r})")  # fmt: skip

    @property
    def qualified(self) -> str:
        return f"{self.module_name}.{self.name}" if self.module_name else self.name

    @property
    def is_buffer(self) -> bool:
        return self.role == "buffer"


@dataclass(frozen=True)
class ChannelGroup:
    """Coupled channels: `size` units, each owning its positions in every slice.

    `kind`: 'channels' (a layer's output channels), 'heads' (the heads of one attention
    module: a unit is a head's query/key/value rows and its output projection's columns),
    'hidden' (a width that LayerNorm/RMSNorm normalize over, coupled through the residuals)
    or 'experts' (the routed experts of one mixture-of-experts block: a unit is an expert's
    weights along the expert dim and its router row).
    `blocks`: units that must each lose the same count (the query heads of each key/value
    group). `outputs`: (output index, dim, positions per unit) of the model's outputs that
    carry these channels (a pruned hidden width makes those outputs narrower).

    Attributes:
        slices: every tensor slice the channels touch: the rows that make them (role
            ``'out'``), the consumers' weights that read them (``'in'``), biases, norms,
            running statistics, depthwise rows; each gives the positions of each unit.
        size: the number of units (channels, heads, hidden channels or experts).
        reason: why the group is left alone (its channels reach an op or output whose width
            must not change, ...), or None when it is prunable.
        kind: ``'channels'``, ``'heads'``, ``'hidden'`` or ``'experts'``.
        blocks: the units that must each lose the same count (the query heads of each
            key/value group); empty when the units are free.
        outputs: the model's outputs that carry these channels: (output index, dim,
            positions per unit) each.
    """

    slices: tuple[Slice, ...]
    size: int
    reason: str | None = None
    kind: str = "channels"
    blocks: tuple[tuple[int, ...], ...] = ()
    outputs: tuple[tuple[int, int, tuple[tuple[int, ...], ...]], ...] = field(
        default=(), repr=False
    )

    @property
    def prunable(self) -> bool:
        return self.reason is None

    @property
    def name(self) -> str:
        """The slices that make the channels, such as 'layer1.0.conv1.weight'."""
        makers = [s.qualified for s in self.slices if s.role == "out"]
        return "+".join(makers[:3]) + ("+..." if len(makers) > 3 else "")

    def __str__(self) -> str:
        state = "prunable" if self.reason is None else f"left alone: {self.reason}"
        parts = ", ".join(f"{s.qualified}[dim {s.dim}]" for s in self.slices)
        unit = {"heads": "heads", "hidden": "hidden channels", "experts": "experts"}.get(
            self.kind, "channels"
        )
        return f"{self.size} {unit} of {self.name} ({state}): {parts}"
