"""The torch-compatible reparameterization: the method protocol and its container, installing
and removing a pruning, the one transaction every changing call runs in, the names of the
``_orig``/``_mask`` tensors, argument checks and error wording, zero counts, the frameworks
(torch, TensorPlay), and what a forward is given and takes (the walk over a batch, the
reading of a forward's signature).

Nothing is imported here: each module is imported by its own path.
"""
