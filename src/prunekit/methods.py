"""``prunekit.methods``: the old path of ``prunekit.dropin.torch_methods``.

Kept for those who import it.
"""

from prunekit.dropin.torch_methods import *  # noqa: F403
from prunekit.dropin.torch_methods import __all__ as __all__
