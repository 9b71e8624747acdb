"""Criteria: what ranks a tensor's entries for pruning (the smallest scores go first).

A pruning method is a criterion times a pattern (see prunekit.patterns): L1Unstructured is
Magnitude x Unstructured, LnStructured is Magnitude x Channels, RandomUnstructured is
Random x Unstructured. From calibration data (calibration.py gathers it): Wanda (|W| x
input norm), Taylor (|W x grad|) and SparseGPT (sparsegpt.py: pruning with weight
updates, which no score can express). Write a Criterion to rank by anything else and keep
the patterns' fast selection, global pruning included.
"""

from prunekit.criteria.criterion import Criterion
from prunekit.criteria.magnitude import Magnitude
from prunekit.criteria.random import Random
from prunekit.criteria.sparsegpt import SparseGPT
from prunekit.criteria.taylor import Taylor
from prunekit.criteria.wanda import Wanda

__all__ = ["Criterion", "Magnitude", "Random", "SparseGPT", "Taylor", "Wanda"]
