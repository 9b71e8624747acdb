"""Pruning across processes (torch.distributed) and over tensors held in pieces."""
