"""The residual (hidden) width by rotation: norms folded into their readers, the stream
rotated by the principal directions of calibration tokens, the least used directions
removed (``rotate_hidden``)."""

from prunekit.structure.rotation.rotate import RotationReport, rotate_hidden

__all__ = ["RotationReport", "rotate_hidden"]
