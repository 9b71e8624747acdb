"""Compaction: the fully masked units removed for real, the result checked and reported.

The compact stage (trace -> groups -> score -> mask -> compensate -> compact -> save):
``compact`` is the entry point, ``surgery`` plans and slices the tensors, ``widths`` says the
width attributes each layer must carry, ``hfconfig`` updates a Hugging Face config to the new
widths and ``fromconfig`` checks it against a model built from that config. Named
``compaction`` so that it never shadows the function ``prunekit.structure.compact``.
"""
