"""How errors and warnings read: which tensor, what is wrong, what is allowed.

Every error reads ``<where>: <what is wrong, with the bad value>; expected <what is allowed>``,
where ``<where>`` names the module and the parameter (see describe()). Errors about the
caller's input are made by the functions below: plain ValueError, TypeError, IndexError or
AttributeError, as torch raises, marked as explained. ``with naming(where):`` puts
``<where>`` in front of explained errors only: any other exception is a bug and travels
as it is, with its own traceback.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

_LONG = 80  # the characters of a value an error shows at most

__all__ = [
    "attribute_error",
    "describe",
    "index_error",
    "is_explained",
    "naming",
    "runtime_error",
    "shown",
    "type_error",
    "value_error",
    "warn_caller",
    "with_context",
]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # prunekit/
_MARK = "_prunekit_explained"

E = TypeVar("E", bound=BaseException)


def _explained(error: E) -> E:
    setattr(error, _MARK, True)
    return error


def value_error(message: str) -> ValueError:
    """A ValueError about the caller's input (see the module's docstring)."""
    return _explained(ValueError(message))


def type_error(message: str) -> TypeError:
    """A TypeError about the caller's input."""
    return _explained(TypeError(message))


def index_error(message: str) -> IndexError:
    """An IndexError about the caller's input (a dim out of range)."""
    return _explained(IndexError(message))


def runtime_error(message: str) -> RuntimeError:
    """A RuntimeError about the caller's input, where torch raises one for the same fault
    (a state_dict whose keys or shapes do not fit)."""
    return _explained(RuntimeError(message))


def attribute_error(message: str) -> AttributeError:
    """An AttributeError about the caller's input (a name that does not exist)."""
    return _explained(AttributeError(message))


def is_explained(error: BaseException) -> bool:
    """Whether prunekit raised `error` on purpose, about the caller's input."""
    return getattr(error, _MARK, False) is True


def describe(module: Any, name: Any, path: str | None = None) -> str:
    """How errors name a tensor: ``parameter 'weight' of Linear``; with the module's `path`
    in its model (whole-model calls know it), ``'a.weight', parameter 'weight' of Linear``."""
    found = f"parameter {name!r} of {type(module).__name__}"
    if path is None:
        return found
    return f"{(path + '.' if path else '') + str(name)!r}, {found}"


def shown(value: Any) -> str:
    """`value` as an error shows it: its repr, at most _LONG characters; an int of more
    digits as its first digits and its count of digits (Python refuses to print an int of
    more than 4300 digits, and reading hundreds helps no one)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**_LONG:
        size = abs(value)
        digits = max(1, int((size.bit_length() - 1) * 0.30102999566398120))
        while 10**digits <= size:  # the estimate is at most one short: no str() needed
            digits += 1
        sign = "-" if value < 0 else ""
        return f"{sign}{size // 10 ** (digits - 20)}... ({digits} digits)"
    try:
        text = repr(value)
    except ValueError:  # a container holding an int too long to print
        text = f"<a {type(value).__name__} holding an int too long to print>"
    return f"{text:.{_LONG}}"


def with_context(error: E, where: str) -> E:
    """`error` again, of the same type and still explained, with `where` in front."""
    return _explained(type(error)(f"{where}: {error}"))


@contextmanager
def naming(where: str) -> Iterator[None]:
    """Put `where` in front of the explained errors raised in the block."""
    try:
        yield
    except (ValueError, TypeError, IndexError, AttributeError) as error:
        if not is_explained(error):
            raise
        raise with_context(error, where) from None


def _inside(filename: str) -> bool:
    """Whether code of `filename` is prunekit's: its files, and the code generated for its
    classes (a dataclass's ``__init__``, named ``<string>``)."""
    return filename.startswith("<") or os.path.abspath(filename).startswith(_PACKAGE)


def warn_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """Warn (a `category`), pointing at the first line outside prunekit: the user's call,
    however deep."""
    frame = sys._getframe(1)
    level = 2  # stacklevel 2 is this function's caller
    while frame.f_back is not None and _inside(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
