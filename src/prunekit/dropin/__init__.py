"""The torch.nn.utils.prune drop-in.

The method protocol and its container, installing masks on modules, the torch-named
methods, and one call per method (also over a process group).
"""
