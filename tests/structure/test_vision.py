"""A few small torchvision models end to end (the full sweep: benchmarks/structure.py)."""

from __future__ import annotations

import pytest
import torch

import prunekit

pytestmark = pytest.mark.torchvision


@pytest.fixture(scope="module")
def models():  # type: ignore[no-untyped-def]
    vision = pytest.importorskip("helpers.vision")
    try:
        return vision.torchvision_models()
    except ImportError as error:  # torchvision not installed
        pytest.skip(f"torchvision: {error}")


@pytest.mark.parametrize(
    ("name", "kept"),
    [("resnet18", 0.55), ("mobilenet_v3_small", 0.65), ("shufflenet_v2_x0_5", 0.75),
     ("squeezenet1_1", 0.65)],
)  # fmt: skip
def test_prune_then_compact_equals_the_masked_model(models, name: str, kept: float) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = models.get_model(name).eval()
    x = torch.randn(2, 3, 32, 32)
    before = sum(p.numel() for p in model.parameters())
    prunekit.prune_channels(model, x, 0.3)
    with torch.no_grad():
        masked = model(x)
    report = prunekit.compact(model, x, latency_runs=0)
    with torch.no_grad():
        out = model(x)
    assert float((out - masked).abs().max() / masked.abs().max()) < 1e-4
    assert report.params_before == before and report.params_after < kept * before
    assert report.macs_after < report.macs_before


def test_shufflenet_says_why_its_block_outputs_stay(models) -> None:  # type: ignore[no-untyped-def]
    groups = prunekit.channel_groups(models.shufflenet_v2_x0_5().eval(), torch.randn(1, 3, 64, 64))
    reasons = " ".join(g.reason or "" for g in groups)
    assert "channel shuffle" in reasons and any(g.prunable for g in groups)
