"""Handlers of the layers: convolutions, linear, norms, PReLU and embeddings.

Each reads the module tensors it is given (weight, bias, running statistics), so it works the
same whether the op ran in a module's forward or was called functionally with its parameters.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from prunekit.structure.trace.labels import along, channel_ids
from prunekit.structure.trace.tracer import Call, Tracer, describe_op

Owner = tuple[str, nn.Module, str, bool] | None
"""What ``Tracer.claim`` says of a tensor: the parameter of the model it is, or None."""


def conv(tr: Tracer, call: Call) -> None:
    x, weight, bias = call.arg(0, "input"), call.arg(1, "weight"), call.arg(2, "bias")
    groups = int(call.arg(6, "groups", 1))
    spatial = int(call.name[-2])
    cdim = x.dim() - spatial - 1
    owner = tr.claim(weight)
    if owner is None:  # a weight made in forward: nothing to slice
        tr.block(tr.label(x), f"{describe_op(call)} has a weight that is no model parameter")
        return
    bias_owner = tr.claim(bias)
    where = describe_op(call)
    out = call.out
    cout, per = weight.shape[0], weight.shape[1]
    chan = channel_ids(tr, tr.label(x), cdim, x.shape[cdim], where)
    if per == 1 and groups > 1:  # depthwise: output channel o reads input channel o // k
        ids = chan.repeat_interleave(cout // groups)
        made = tr.positions(cout)  # one tensor for both: their entries are built once
        tr.record(owner, 0, "depthwise", made, ids, op=call.name)
        tr.record(bias_owner, 0, "bias", made, ids)
        tr.set(out, tr.along(ids, cdim, out.shape))
        return
    channels = tr.positions(x.shape[cdim])
    if groups > 1:  # the j-th input channel of every group goes together
        by_group = chan.reshape(groups, per)
        if bool((by_group < 0).any()):  # some channels of no layer
            partial = (by_group < 0).any(0) & (by_group >= 0).any(0)
            tr.block(by_group[:, partial], f"{where}: grouped with channels of no layer")
        tr.union(by_group[:1].expand_as(by_group).reshape(-1), by_group.reshape(-1))
    positions = channels if per == len(channels) else channels % per
    tr.record(owner, 1, "in", positions, chan, channels, op=call.name)
    new = tr.new_ids(cout)
    if groups > 1:  # and so does the j-th output channel of every group: the later
        by_group = new.reshape(groups, cout // groups)  # groups' fresh ids join the first's
        tr.attach(by_group[1:], by_group[:1].expand(groups - 1, -1))
    made = tr.positions(cout)  # one tensor for all: their entries are built once
    tr.record(owner, 0, "out", made, new, op=call.name)
    tr.record(bias_owner, 0, "bias", made, new)
    tr.set(out, tr.along(new, cdim, out.shape), held=True)


def linear(tr: Tracer, call: Call) -> None:
    x, weight, bias = call.arg(0, "input"), call.arg(1, "weight"), call.arg(2, "bias")
    owner = tr.claim(weight)
    if owner is None:
        tr.block(tr.label(x), f"{describe_op(call)} has a weight that is no model parameter")
        return
    _matrix_product(tr, call, x, weight, (owner, tr.claim(bias)), 1)


def _matrix_product(
    tr: Tracer, call: Call, x: Tensor, weight: Tensor, owners: tuple[Owner, Owner], reads: int
) -> None:
    """Record a layer that multiplies the last dim of `x` by `weight` (its input features
    along dim `reads`, its outputs along the other) and adds a bias (`owners`: those of the
    weight and the bias); the output's last dim carries new channels."""
    owner, bias_owner = owners
    makes = 1 - reads
    features = weight.shape[reads]
    chan = channel_ids(tr, tr.label(x), x.dim() - 1, features, describe_op(call))
    positions = tr.positions(features)
    tr.record(owner, reads, "in", positions, chan, positions, op=call.name)
    new = tr.new_ids(weight.shape[makes])
    made = tr.positions(weight.shape[makes])  # one tensor for all: entries built once
    tr.record(owner, makes, "out", made, new, op=call.name)
    tr.record(bias_owner, 0, "bias", made, new)
    tr.set(call.out, tr.along(new, call.out.dim() - 1, call.out.shape), held=True)


def _per_channel(tr: Tracer, call: Call, tensors: list[tuple[object, str]]) -> Tensor | None:
    """A norm that treats channels (dim 1) apart: its tensors are sliced with the channel."""
    x = call.arg(0, "input")
    owners = [(tr.claim(t), role) for t, role in tensors]
    labels = tr.label(x)
    if labels is None:  # values of no channel: recorded, so that a use on channels of the
        unowned = torch.full((x.shape[1],), -1, dtype=torch.long)  # same entries shows
        for owner, role in owners:
            tr.record(owner, 0, role, tr.positions(x.shape[1]), unowned)
        return None
    chan = channel_ids(tr, labels, 1, x.shape[1], describe_op(call))
    positions = tr.positions(len(chan))  # one tensor for all: their entries are built once
    for owner, role in owners:
        tr.record(owner, 0, role, positions, chan)
    return chan


def batch_norm(tr: Tracer, call: Call) -> None:
    tensors = [(call.arg(1, "running_mean"), "buffer"), (call.arg(2, "running_var"), "buffer"),
               (call.arg(3, "weight"), "norm"), (call.arg(4, "bias"), "norm")]  # fmt: skip
    chan = _per_channel(tr, call, tensors)
    if chan is not None:
        tr.set(call.out, tr.along(chan, 1, call.out.shape))


def group_norm(tr: Tracer, call: Call) -> None:
    x, groups = call.arg(0, "input"), int(call.arg(1, "num_groups"))
    labels = tr.label(x)
    chan = _per_channel(tr, call, [(call.arg(2, "weight"), "norm"), (call.arg(3, "bias"), "norm")])
    if chan is None or labels is None:
        return
    by_group = chan.reshape(groups, -1)  # a norm group's statistics need all of its channels
    partial = (by_group < 0).any(1) & (by_group >= 0).any(1)
    tr.block(by_group[partial], f"{describe_op(call)} normalizes them with values of no channel")
    tr.merge(by_group[:, :1].expand_as(by_group), by_group)
    tr.set(call.out, along(chan, 1, call.out.shape))


def layer_norm(tr: Tracer, call: Call) -> None:
    x, shape = call.arg(0, "input"), call.arg(1, "normalized_shape")
    weight = call.arg(2, "weight")
    bias = call.arg(3, "bias") if call.name == "layer_norm" else None
    owner, bias_owner = tr.claim(weight), tr.claim(bias)
    labels = tr.label(x)
    if labels is None:
        return
    first = x.dim() - len(tuple(shape))
    dims = tr.varying(labels)
    if any(d >= first for d in dims):
        why = normalized_width(tr, call, labels, owner, first)
        if why:
            tr.block(labels, f"{describe_op(call)} normalizes over them ({why})")
        else:
            chan = channel_ids(tr, labels, first, x.shape[first], describe_op(call))
            positions = torch.arange(len(chan))
            tr.record(owner, 0, "norm", positions, chan, op="normalize")
            tr.record(bias_owner, 0, "norm", positions, chan, op="normalize")
            tr.normed.update(chan[chan >= 0].tolist())
            labels = tr.settled(labels)  # its channels' ids are merged now: so are the
            tr.set(x, labels)  # input's (a residual stream read again later)
    tr.set(call.out, labels)


def normalized_width(tr: Tracer, call: Call, labels: Tensor, owner: object, first: int) -> str:
    """Why a norm over the channels cannot be pruned with them ('' if it can: one dim of
    channels, normalized by a norm module of its own weight, which ``prune_channels`` makes
    normalize over the kept channels only)."""
    if first != labels.dim() - 1:
        return "its statistics span several dims"
    if owner is None:
        return "it has no weight to mask, so its statistics would change"
    mname, module = owner[0], owner[1]  # type: ignore[index]
    if call.where != mname or not is_norm_module(module):
        return "it runs outside a LayerNorm/RMSNorm module, so its statistics would change"
    return ""


def is_norm_module(module: object) -> bool:
    """nn.LayerNorm, nn.RMSNorm or a Hugging Face RMSNorm (normalizing the last dim)."""
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        return len(module.normalized_shape) == 1
    return type(module).__name__ in RMS_NORMS


# Hugging Face norms whose forward is weight * x / rms(x) (or (1 + weight) * x / rms(x): the
# Gemma families) over the last dim, each checked by benchmarks/families.py with the hidden
# width pruned: while masked, their output is recomputed over the kept channels
# (prunekit.structure.handlers.norms), zero elsewhere, so a masked (1 + weight) scale does no harm.
RMS_NORMS = {
    "LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "T5LayerNorm",
    "Qwen2MoeRMSNorm", "Qwen3MoeRMSNorm", "MixtralRMSNorm", "OlmoeRMSNorm", "Olmo2RMSNorm",
    "Olmo3RMSNorm", "FlexOlmoRMSNorm", "GraniteRMSNorm", "CohereLayerNorm", "Cohere2LayerNorm",
    "Cohere2MoeLayerNorm", "Phi3RMSNorm", "ApertusRMSNorm", "ArceeRMSNorm", "CwmRMSNorm",
    "DogeRMSNorm", "Ernie4_5RMSNorm", "Exaone4RMSNorm", "GlmRMSNorm", "Glm4RMSNorm",
    "HeliumRMSNorm", "HunYuanDenseV1RMSNorm", "HyperCLOVAXRMSNorm", "MellumRMSNorm",
    "MinistralRMSNorm", "Ministral3RMSNorm", "SeedOssRMSNorm", "SmolLM3RMSNorm",
    "GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm", "VaultGemmaRMSNorm",
    "AXK1RMSNorm", "AXK2RMSNorm", "AfmoeRMSNorm", "AriaTextRMSNorm", "BailingHybridRMSNorm",
    "BambaRMSNorm", "BeamRMSNorm", "BitNetRMSNorm", "BltRMSNorm", "DeepseekV2RMSNorm",
    "DeepseekV32RMSNorm", "DeepseekV3RMSNorm", "DeepseekV4RMSNorm", "DiffLlamaRMSNorm",
    "Ernie4_5_MoeRMSNorm", "ExaoneMoeRMSNorm", "FalconH1RMSNorm", "FalconMambaRMSNorm",
    "FlintRMSNorm", "Glm4MoeLiteRMSNorm", "Glm4MoeRMSNorm", "GlmMoeDsaRMSNorm", "GptOssRMSNorm",
    "GraniteMoeHybridRMSNorm", "GraniteMoeRMSNorm", "GraniteMoeSWARMSNorm",
    "GraniteMoeSharedRMSNorm", "GraniteSWARMSNorm", "HYV3RMSNorm", "HYV4RMSNorm",
    "HunYuanMoEV1RMSNorm", "Inkling2RMSNorm", "InklingRMSNorm", "JambaRMSNorm", "JetMoeRMSNorm",
    "KimiLinearRMSNorm", "Kolibri1RMSNorm", "LagunaRMSNorm", "Lfm2RMSNorm", "Lfm3RMSNorm",
    "Llama4TextRMSNorm", "LongcatFlashRMSNorm", "MambaRMSNorm", "MiMoV2FlashRMSNorm",
    "MiniCPM3RMSNorm", "MiniMaxM2RMSNorm", "MiniMaxM3VLRMSNorm", "MiniMaxRMSNorm",
    "MllamaTextRMSNorm", "MoshiRMSNorm", "NemotronHRMSNorm", "OlmoHybridRMSNorm",
    "Phi4MultimodalRMSNorm", "Qwen3NextRMSNorm", "Qwen3_5MoeRMSNorm", "Qwen3_5RMSNorm",
    "Qwen4ExpTextRMSNorm", "RecurrentGemmaRMSNorm", "SolarOpenRMSNorm", "YoutuRMSNorm",
}  # fmt: skip


def addmm(tr: Tracer, call: Call) -> None:
    """``addmm(bias, x, weight)`` with a model weight of shape (in, out): Hugging Face's
    Conv1D (GPT-2), a linear layer with its weight transposed."""
    bias, x, weight = call.arg(0, "input"), call.arg(1, "mat1"), call.arg(2, "mat2")
    owner = tr.claim(weight)
    if owner is None or tr.label(weight) is not None:
        for t in (bias, x, weight):
            tr.block(tr.label(t), f"{describe_op(call)} contracts over them")
        return
    bias_owner = tr.claim(bias)
    if bias_owner is None and tr.label(bias) is not None:
        tr.block(tr.label(bias), f"{describe_op(call)} adds them to its output")
    _matrix_product(tr, call, x, weight, (owner, bias_owner), 0)


def prelu(tr: Tracer, call: Call) -> None:
    x, weight = call.arg(0, "input"), call.arg(1, "weight")
    labels = tr.label(x)
    owner = tr.claim(weight)
    if labels is None:
        return
    if weight.numel() > 1:
        chan = channel_ids(tr, labels, 1, x.shape[1], describe_op(call))
        tr.record(owner, 0, "norm", torch.arange(len(chan)), chan)
        labels = along(chan, 1, call.out.shape)
    tr.set(call.out, labels)


def embedding(tr: Tracer, call: Call) -> None:
    weight = call.arg(1, "weight")
    owner = tr.claim(weight)
    if owner is None:
        return
    new = tr.new_ids(weight.shape[1])
    tr.record(owner, 1, "out", torch.arange(weight.shape[1]), new, op="embedding")
    tr.set(call.out, along(new, call.out.dim() - 1, call.out.shape), held=True)
