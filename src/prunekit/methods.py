"""``prunekit.methods``: the old path of ``prunekit.dropin.torch_methods``.

Kept for those who import it, with the deprecated ``METHODS`` (the old registry of methods by
short name), which reads the one registry of ``prunekit.whole.registry``.
"""

from typing import Any

from prunekit.core.errors import warn_caller
from prunekit.dropin.torch_methods import *  # noqa: F403
from prunekit.dropin.torch_methods import __all__ as __all__
from prunekit.whole.registry import METHODS as _REGISTRY


def __getattr__(name: str) -> Any:
    """``METHODS`` reads the one registry, with a FutureWarning."""
    if name != "METHODS":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warn_caller(
        "prunekit.methods.METHODS moved to prunekit.whole.registry.METHODS (each entry's "
        "`pruning` is the class); the old name will be removed in a future version",
        FutureWarning,
    )
    return {short: m.pruning for short, m in _REGISTRY.items() if m.pruning is not None}
