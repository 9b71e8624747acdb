"""The width attributes a layer's tensors fix (in/out features, channels, num_features, ...).

One law per layer type, as the layer's own constructor ties its attributes to its tensors.
``compact`` sets the attributes from the sliced tensors; ``load_compacted`` refuses a saved
attribute that contradicts the saved tensors. Layers of other types fix nothing here.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

__all__ = ["implied_widths"]


def implied_widths(module: nn.Module) -> dict[str, Any]:
    """The width attributes `module`'s tensors fix, by name ({} for a type not known here).

    A convolution's channels are read with its current ``groups``; a GroupNorm's
    ``num_groups`` and a depthwise convolution's ``groups`` are not fixed by the tensors
    alone and are left to the caller.
    """
    weight = getattr(module, "weight", None)
    if isinstance(module, nn.modules.conv._ConvNd) and isinstance(weight, Tensor):
        ours, theirs = ("in_channels", "out_channels") if module.transposed else (
            "out_channels", "in_channels")  # fmt: skip
        return {ours: weight.shape[0], theirs: weight.shape[1] * module.groups}
    if isinstance(module, nn.Linear) and isinstance(weight, Tensor):
        return {"out_features": weight.shape[0], "in_features": weight.shape[1]}
    if isinstance(module, nn.modules.batchnorm._NormBase):
        ref = weight if isinstance(weight, Tensor) else getattr(module, "running_mean", None)
        return {"num_features": ref.shape[0]} if isinstance(ref, Tensor) else {}
    if isinstance(module, nn.GroupNorm) and isinstance(weight, Tensor):
        return {"num_channels": weight.shape[0]}
    if isinstance(module, nn.PReLU) and isinstance(weight, Tensor):
        return {"num_parameters": weight.numel()}
    if isinstance(module, nn.Embedding) and isinstance(weight, Tensor):
        return {"num_embeddings": weight.shape[0], "embedding_dim": weight.shape[1]}
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)) and isinstance(weight, Tensor):
        return {"normalized_shape": tuple(weight.shape)}
    if type(module).__name__ == "Conv1D" and isinstance(weight, Tensor):
        return {"nx": weight.shape[0], "nf": weight.shape[1]}  # Hugging Face's transposed linear
    return {}
