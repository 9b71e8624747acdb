"""The traced forward: which channel of which layer each value carries.

The lowest layer of structural pruning, below the handlers it dispatches to: ``tracer`` runs
one forward under a ``TorchFunctionMode`` and keeps the labels, the union-find over channel
ids and the recorded slices (``Handlers`` is what it dispatches to, given by the caller:
``structure.graph.tables``); ``labels`` holds the helpers on label tensors; ``skim`` lets the
traced forward skip the arithmetic the graph never reads.
"""
