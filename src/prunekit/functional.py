"""``prunekit.functional``: the old path of ``prunekit.dropin.calls``.

Kept for those who import it.
"""

from prunekit.dropin.calls import *  # noqa: F403
from prunekit.dropin.calls import __all__ as __all__
