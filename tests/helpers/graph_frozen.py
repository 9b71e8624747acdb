"""Frozen groups: a digest of everything ``channel_groups`` says of a few models, written once
by a known-good build and compared by tests/structure/graph/test_frozen.py, so a faster tracer or
grouping must give the very same groups (slices, indices, reasons, order).

    PYTHONPATH=src python tests/helpers/graph_frozen.py   # rewrites graph_frozen.json beside it

Each model keeps one digest per group and the group's name, so a difference says which group
changed first.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import prunekit
from prunekit.structure.graph.groups import ChannelGroup

FILE = Path(__file__).with_name("graph_frozen.json")

VISION = ["resnet18", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "densenet121",
          "regnet_x_400mf", "regnet_y_400mf", "shufflenet_v2_x0_5", "squeezenet1_1",
          "convnext_tiny", "googlenet", "mnasnet0_5", "resnext50_32x4d"]  # fmt: skip
TRANSFORMERS = ["llama", "llama-group", "bert", "gpt2", "mixtral"]


def form(model: nn.Module, groups: list[ChannelGroup]) -> list[str]:
    """One line per group: every field of the group and of each slice (its module by name,
    checked to be the model's module of that name)."""
    modules = dict(model.named_modules())
    lines = []
    for g in groups:
        for s in g.slices:
            assert modules[s.module_name] is s.module, s.qualified
        slices = [(s.module_name, s.name, s.dim, s.role, s.indices, s.channels, s.op)
                  for s in g.slices]  # fmt: skip
        lines.append(repr((g.kind, g.size, g.reason, g.blocks, g.outputs, slices)))
    return lines


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def summary(model: nn.Module, groups: list[ChannelGroup]) -> dict[str, Any]:
    return {"groups": [[g.name, g.size, digest(line)] for g, line in
                       zip(groups, form(model, groups), strict=True)]}  # fmt: skip


def vision_case(vision: Any, name: str) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = vision.get_model(name).eval()
    return model, torch.randn(1, 3, 64, 64)


def vit_case(vision: Any) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    vit = vision.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                   hidden_dim=16, mlp_dim=24).eval()  # fmt: skip
    return vit, torch.randn(1, 3, 32, 32)


def masked_case(vision: Any) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = vision.resnet18().eval()
    x = torch.randn(1, 3, 32, 32)
    prunekit.prune_channels(model, x, 0.3)
    return model, x


def hf_case(name: str) -> tuple[nn.Module, Any]:
    import transformers as T

    torch.manual_seed(0)
    ids = {"input_ids": torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(1))}
    small = dict(vocab_size=100, max_position_embeddings=32)
    if name.startswith("llama"):
        config = T.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                               num_attention_heads=8, num_key_value_heads=2,
                               tie_word_embeddings=True, **small)  # fmt: skip
        return T.LlamaForCausalLM(config).eval(), ids
    if name == "bert":
        config = T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=48, **small)  # fmt: skip
        return T.BertForMaskedLM(config).eval(), ids
    if name == "gpt2":
        config = T.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=16)
        return T.GPT2LMHeadModel(config).eval(), ids
    config = T.MixtralConfig(hidden_size=32, intermediate_size=16, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                             num_experts_per_tok=2, **small)  # fmt: skip
    return T.MixtralForCausalLM(config).eval(), ids


def cases(vision: Any) -> dict[str, Callable[[], tuple[nn.Module, Any, str]]]:
    """name -> a builder of (model, inputs, gqa)."""
    found: dict[str, Callable[[], tuple[nn.Module, Any, str]]] = {}
    for name in VISION:
        found[name] = lambda name=name: (*vision_case(vision, name), "query")
    found["vit_small"] = lambda: (*vit_case(vision), "query")
    found["resnet18_masked"] = lambda: (*masked_case(vision), "query")
    for name in TRANSFORMERS:
        gqa = "group" if name.endswith("-group") else "query"
        found[name] = lambda name=name, gqa=gqa: (*hf_case(name), gqa)
    return found


def compute(build: Callable[[], tuple[nn.Module, Any, str]]) -> dict[str, Any]:
    model, inputs, gqa = build()
    return summary(model, prunekit.channel_groups(model, inputs, gqa=gqa))


def dumps(found: dict[str, Any]) -> str:
    """The JSON, one line per group."""
    models = []
    for name, entry in found.items():
        rows = ",\n".join("  " + json.dumps(row) for row in entry["groups"])
        models.append(f'{json.dumps(name)}: {{"groups": [\n{rows}\n]}}')
    return "{\n" + ",\n".join(models) + "\n}\n"


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for helpers.vision
    from helpers.vision import torchvision_models

    found = {name: compute(build) for name, build in cases(torchvision_models()).items()}
    FILE.write_text(dumps(found))
    print(f"wrote {FILE}: {sum(len(v['groups']) for v in found.values())} groups")


if __name__ == "__main__":
    main()
