"""The Hugging Face Trainer callback, in tiny runs: the schedule follows global_step, and a
run resumed from a checkpoint ends with the same masks and weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import prunekit as prune

transformers = pytest.importorskip("transformers")
from prunekit.schedule.hf_callback import GradualPruningCallback  # noqa: E402


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 3)

    def forward(self, x: Tensor, labels: Tensor | None = None) -> dict[str, Tensor]:
        logits = self.fc2(F.relu(self.fc1(x)))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits, labels)
        return out


def data() -> list[dict[str, Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return [{"x": x[i], "labels": y[i]} for i in range(64)]


def trainer(out: Path, model: nn.Module, pruner: Any, **kw: Any) -> Any:
    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=12,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        save_steps=5,
        save_strategy="steps",
        logging_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
        **kw,
    )
    callback = GradualPruningCallback(pruner)
    return transformers.Trainer(model=model, args=args, train_dataset=data(), callbacks=[callback])


def make(method: str = "l1") -> tuple[nn.Module, prune.GradualPruner]:
    torch.manual_seed(0)
    model = Tiny()
    pruner = prune.GradualPruner(model, 0.8, start_step=2, end_step=10, every=2, method=method)
    return model, pruner


def assert_same_run(a: tuple[nn.Module, Any], b: tuple[nn.Module, Any]) -> None:
    """The same weights and masks, and the same pruner state (steps, amount, generator)."""
    (model, pruner), (again, again_pruner) = a, b
    for key, value in model.state_dict().items():
        assert torch.equal(value, again.state_dict()[key]), key
    mine, theirs = pruner.state_dict(), again_pruner.state_dict()
    assert (mine["steps"], mine["amount"]) == (theirs["steps"], theirs["amount"]) == (12, 0.8)
    assert torch.equal(mine["generator"], theirs["generator"])
    assert mine["masks"].keys() == theirs["masks"].keys()
    assert all(torch.equal(mine["masks"][k], theirs["masks"][k]) for k in mine["masks"])


def test_trainer_steps_the_pruner_and_resumes(tmp_path: Path) -> None:
    model, pruner = make()
    run = trainer(tmp_path / "a", model, pruner)
    assert list(model.state_dict()) == [
        "fc1.bias",
        "fc1.weight_orig",
        "fc1.weight_mask",
        "fc2.bias",
        "fc2.weight_orig",
        "fc2.weight_mask",
    ]
    run.train()
    assert pruner.steps == 12 and pruner.amount == 0.8
    assert prune.report(model)["fc1.weight"].method == "Gradual(L1, 0.8)"
    assert prune.report(model)["fc1.weight"].zeros == round(0.8 * 256)
    assert (tmp_path / "a" / "checkpoint-5" / "gradual_pruner.pt").is_file()

    again, again_pruner = make()
    resumed = trainer(tmp_path / "a", again, again_pruner)
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-5"))
    assert again_pruner.steps == 12
    for key, value in model.state_dict().items():
        assert torch.equal(value, again.state_dict()[key]), key


@pytest.mark.parametrize("method", ["l1", "random"])
def test_resuming_from_a_checkpoint_in_another_folder(tmp_path: Path, method: str) -> None:
    """The pruner's state travels in the checkpoint the Trainer resumes from, wherever it
    was moved: the resumed run ends as the uninterrupted one did."""
    run = make(method)
    trainer(tmp_path / "a", *run).train()
    moved = tmp_path / "elsewhere" / "kept"
    shutil.copytree(tmp_path / "a" / "checkpoint-5", moved)
    shutil.rmtree(tmp_path / "a")
    again = make(method)
    trainer(tmp_path / "b", *again).train(resume_from_checkpoint=str(moved))
    assert_same_run(run, again)


def test_resuming_from_the_last_checkpoint_with_true(tmp_path: Path) -> None:
    run = make("random")
    trainer(tmp_path / "a", *run).train()
    shutil.copytree(tmp_path / "a" / "checkpoint-5", tmp_path / "b" / "checkpoint-5")
    (tmp_path / "b" / "checkpoint-5" / "gradual_pruner.pt").unlink()  # trainer_state.json holds it
    again = make("random")
    trainer(tmp_path / "b", *again).train(resume_from_checkpoint=True)
    assert_same_run(run, again)


def test_gradient_accumulation_counts_optimizer_steps(tmp_path: Path) -> None:
    model, pruner = make()
    trainer(tmp_path, model, pruner, gradient_accumulation_steps=2).train()
    assert pruner.steps == 12  # 24 batches, 12 optimizer steps


def test_resuming_without_the_pruner_state_is_an_error(tmp_path: Path) -> None:
    model, pruner = make()
    trainer(tmp_path / "a", model, pruner).train()
    checkpoint = tmp_path / "a" / "checkpoint-5"
    (checkpoint / "gradual_pruner.pt").unlink()
    saved = json.loads((checkpoint / "trainer_state.json").read_text())
    entry = saved["stateful_callbacks"].pop("prunekit.GradualPruner")
    assert entry["steps"] == 5 and entry["masks"] == ["fc1.weight", "fc2.weight"]
    (checkpoint / "trainer_state.json").write_text(json.dumps(saved))
    again, again_pruner = make()
    with pytest.raises(
        ValueError,
        match=r"resumes at step 5 but the pruner is at step 0, the "
        r"checkpoint's trainer_state.json holds no 'prunekit.GradualPruner'",
    ):
        trainer(tmp_path / "a", again, again_pruner).train(resume_from_checkpoint=str(checkpoint))
    saved["stateful_callbacks"]["prunekit.GradualPruner"] = {**entry, "generator": "not base64"}
    (checkpoint / "trainer_state.json").write_text(json.dumps(saved))
    again, again_pruner = make()
    with pytest.raises(ValueError, match=r"trainer_state.json \('prunekit.GradualPruner'\): "
                       "invalid saved pruner state"):  # fmt: skip
        trainer(tmp_path / "a", again, again_pruner).train(resume_from_checkpoint=str(checkpoint))
    assert again_pruner.steps == 0
    with pytest.raises(TypeError, match=r"expected a prunekit\.GradualPruner"):
        GradualPruningCallback(model)  # type: ignore[arg-type]


def test_each_step_records_the_state_without_copying_the_masks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state written into the Trainer's at every step names the masks, and is made
    without state_dict (which copies every mask to bool): it is called at saves only."""
    import base64

    from prunekit.schedule.hf_callback import STATE_KEY

    model, pruner = make()
    calls: list[int] = []
    full = pruner.state_dict

    def counted() -> dict[str, Any]:
        calls.append(pruner.steps)
        return full()

    monkeypatch.setattr(pruner, "state_dict", counted)
    run = trainer(tmp_path / "run", model, pruner)
    run.train()
    saved = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "run").glob("checkpoint-*"))
    assert len(saved) >= 2 and calls == saved  # once a save, not once a step (12 steps)
    recorded = run.state.stateful_callbacks[STATE_KEY]
    state = full()
    assert recorded == {
        "version": state["version"],
        "steps": 12,
        "amount": state["amount"],
        "generator": base64.b64encode(state["generator"].numpy().tobytes()).decode("ascii"),
        "masks": ["fc1.weight", "fc2.weight"],
        "setup": state["setup"],
    }
    assert sorted(state["masks"]) == recorded["masks"]
    json.dumps(recorded)  # as trainer_state.json holds it
