"""The torch-compatible reparameterization: the method protocol and its container, installing
and removing a pruning, the one transaction every changing call runs in, the names of the
``_orig``/``_mask`` tensors, argument checks and error wording, zero counts, and the
frameworks (torch, TensorPlay).

Nothing is imported here: each module is imported by its own path.
"""
