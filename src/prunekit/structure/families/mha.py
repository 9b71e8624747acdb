"""torch's ``nn.MultiheadAttention`` (and so torchvision's ViT): its heads, and a subclass
that computes with fewer heads or a narrower width once compacted.

``nn.MultiheadAttention`` ties the width of its heads to ``embed_dim`` (its forward derives
``head_dim = embed_dim // num_heads`` and checks the query's width against it), so a module
with heads removed cannot run through it. Compaction turns such a module into
``CompactMultiheadAttention``: the same object, class changed in place, so ``isinstance``,
its parameters and state_dict keys stay; its forward takes the head count and head_dim from
its own attributes and computes the same attention (masks, key padding, causal, weights).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from prunekit.structure.families.heads import Adapter, Heads, Proj, first


def _read(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> (
    Heads | str
):  # fmt: skip
    assert isinstance(module, nn.MultiheadAttention)
    if module.bias_k is not None or module.add_zero_attn:
        return "add_bias_kv and add_zero_attn are not handled"
    inputs = tuple(kwargs.get(n, args[k] if len(args) > k else None)
                   for k, n in enumerate(("query", "key", "value")))  # fmt: skip
    d, bias = module.head_dim, "in_proj_bias" if module.in_proj_bias is not None else None
    if module.in_proj_weight is not None:
        rows = module.in_proj_weight.shape[0] // 3
        parts = [Proj(module, "in_proj_weight", bias, offset=k * rows) for k in range(3)]
    else:
        rows = module.q_proj_weight.shape[0]
        parts = [Proj(module, f"{n}_proj_weight", bias, bias_offset=k * rows)
                 for k, n in enumerate("qkv")]  # fmt: skip
    if rows % d or rows // d != module.num_heads:
        return f"its projections ({rows} rows) are not {module.num_heads} heads of {d}"
    heads, o = module.num_heads, Proj(module.out_proj)
    x = (inputs[0], inputs[1], inputs[2])
    return Heads(parts[0], parts[1], parts[2], o, heads, heads, d, x, first(out))


def _update(module: Any) -> tuple[int, int, int, int]:
    assert isinstance(module, nn.MultiheadAttention)
    fused = module.in_proj_weight
    q = fused if fused is not None else module.q_proj_weight
    rows = q.shape[0] // 3 if fused is not None else q.shape[0]
    module.num_heads = rows // module.head_dim
    module.embed_dim = q.shape[1]
    if fused is None:
        module.kdim, module.vdim = module.k_proj_weight.shape[1], module.v_proj_weight.shape[1]
    else:
        module.kdim = module.vdim = q.shape[1]
    width = module.out_proj.out_features
    if not rows == module.embed_dim == width:
        module.__class__ = CompactMultiheadAttention
    return module.num_heads, module.num_heads, module.head_dim, module.embed_dim


# torch's MultiheadAttention (in the table of ``attention.ADAPTERS``)
ADAPTER = Adapter(_read, _update)


class CompactMultiheadAttention(nn.MultiheadAttention):
    """An ``nn.MultiheadAttention`` whose heads (``num_heads`` x ``head_dim`` rows) need not
    make its ``embed_dim`` (the query's width); made by ``prunekit.compact``.

    ``_qkv_same_embed_dim`` reads False: torch's ``TransformerEncoderLayer`` and
    ``TransformerEncoder`` take their fused eval fast path (which needs the heads to make
    ``embed_dim``) only where it is True, so they call this forward instead."""

    @property  # an attribute of nn.MultiheadAttention, fixed here
    def _qkv_same_embed_dim(self) -> bool:
        return False

    @_qkv_same_embed_dim.setter
    def _qkv_same_embed_dim(self, value: bool) -> None:
        """Set by nn.MultiheadAttention's __init__ and __setstate__: not this class's."""

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        batched = query.dim() == 3
        if not batched:
            query, key, value = (t.unsqueeze(1) for t in (query, key, value))
            key_padding_mask = None if key_padding_mask is None else key_padding_mask[None]
        elif self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        q, k, v = self._project(query, key, value)
        mask = _mask(attn_mask, key_padding_mask, is_causal, q, self.num_heads, key.shape[0])
        scores = torch.bmm(q * (1.0 / math.sqrt(self.head_dim)), k.transpose(1, 2))
        if mask is not None:
            scores = scores + mask
        weights = F.dropout(torch.softmax(scores, -1), self.dropout, self.training)
        length, batch = query.shape[0], query.shape[1]
        heads = torch.bmm(weights, v).transpose(0, 1).reshape(length, batch, -1)
        out = self.out_proj(heads)
        out = out.transpose(0, 1) if batched and self.batch_first else out
        out = out if batched else out.squeeze(1)
        if not need_weights:
            return out, None
        weights = weights.view(batch, self.num_heads, length, -1)
        weights = weights.mean(1) if average_attn_weights else weights
        return out, weights if batched else weights.squeeze(0)

    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> list[Tensor]:
        """Queries, keys and values as (batch x heads, length, head_dim)."""
        rows = self.num_heads * self.head_dim
        if self.in_proj_weight is not None:
            weights = list(torch.split(self.in_proj_weight, rows))
        else:
            weights = [self.q_proj_weight, self.k_proj_weight, self.v_proj_weight]
        bias = self.in_proj_bias
        biases: list[Tensor | None] = [None] * 3 if bias is None else list(torch.split(bias, rows))
        found = []
        for x, w, b in zip((query, key, value), weights, biases, strict=False):
            y = F.linear(x, w, b)
            found.append(y.reshape(x.shape[0], x.shape[1] * self.num_heads, self.head_dim)
                         .transpose(0, 1))  # fmt: skip
        return found


def _mask(attn_mask: Tensor | None, key_padding_mask: Tensor | None, is_causal: bool,
          q: Tensor, heads: int, source: int) -> Tensor | None:  # fmt: skip
    """One additive mask (-inf where not allowed), broadcast to (batch x heads, L, S)."""
    length = q.shape[1]
    if attn_mask is None and is_causal:
        attn_mask = torch.ones(length, source, dtype=torch.bool, device=q.device).triu(1)
    mask = None if attn_mask is None else _additive(attn_mask, q.dtype)
    if mask is not None and mask.dim() == 2:
        mask = mask.unsqueeze(0)
    if key_padding_mask is not None:
        pad = _additive(key_padding_mask, q.dtype)
        batch = pad.shape[0]
        pad = pad.view(batch, 1, 1, source).expand(batch, heads, 1, source)
        pad = pad.reshape(batch * heads, 1, source)
        mask = pad if mask is None else mask + pad
    return mask


def _additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
            mask, float("-inf")
        )  # fmt: skip
    return mask.to(dtype)
