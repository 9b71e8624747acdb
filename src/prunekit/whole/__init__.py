"""The whole-model layer: every call that prunes a whole model (or a whole state_dict)
goes through it. The registry names the methods, one selector picks the tensors by name
(globs, tied weights, an attention's out_proj, the output head left dense by the
calibrated methods), one frozen configuration carries the checked arguments, and each call
runs inside the one transaction of ``prunekit.core.transaction``."""
