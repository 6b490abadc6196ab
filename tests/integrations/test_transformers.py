"""Hugging Face: TriageCallback captures a real transformers.Trainer run, and triage derives the Setup from
the Trainer that `make_trainer()` returns (no hand-written setup())."""

import json

import torch

from tests import hf_tiny
from tests.hf_tiny import transformers
import triage
from triage.load.checkpoint import read_checkpoint
from triage.integrations.transformers import TriageCallback
from triage.load.session import open_session


def test_a_trainer_checkpoint_of_tied_gpt2_opens_with_the_derived_setup(tmp_path):
    """The issue's case: a plain checkpoint-N/ of GPT-2 (model.safetensors without lm_head.weight)."""
    trainer = hf_tiny.healthy_trainer()
    trainer.args.output_dir = str(tmp_path)
    trainer.args.save_strategy, trainer.args.save_steps = "steps", 40
    trainer.train()
    folder = tmp_path / "checkpoint-40"
    session = open_session("tests.hf_tiny:healthy_trainer", folder)
    setup = session.setup
    assert torch.equal(setup.model.lm_head.weight, trainer.model.transformer.wte.weight)
    assert len(setup.optimizer.param_groups) == 2, "the Trainer's decay / no-decay groups, loaded"
    assert (setup.precision, setup.grad_clip, setup.total_steps) == ("fp32", 1.0, 40)
    assert setup.scheduler.last_epoch == 40
    assert [p.step for p in session.history][:2] == [5, 10], "trainer_state.json is the history"
    assert session.val_batches and set(session.batches[0]) >= {"input_ids", "labels"}


def test_the_callback_captures_and_triage_finds_the_learning_rate(tmp_path):
    trainer = hf_tiny.diverging_trainer()
    callback = TriageCallback(dir=tmp_path / "captures", entry="tests.hf_tiny:diverging_trainer",
                              settings=triage.RecorderSettings(snapshot_every=10))
    trainer.add_callback(callback)
    trainer.train()
    assert len(callback.captures) == 1
    folder = callback.captures[0]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["framework"] == "transformers" and manifest["checkpoint_layout"] == "huggingface"
    assert manifest["trigger"]["kind"] == "spike" and manifest["checkpoint_step"] < manifest["step"]
    assert (manifest["grad_clip"], manifest["total_steps"]) == (1.0, 150)
    inner = folder / manifest["checkpoint"]
    from safetensors.torch import load_file
    assert "lm_head.weight" not in load_file(str(inner / "model.safetensors")), "tied: saved once"
    assert set(triage.load_batches(folder)[0]) == {"input_ids", "labels"}, "the collator's batch, as it was"
    assert read_checkpoint(folder).step == manifest["checkpoint_step"]
    report, _ = triage.run("tests.hf_tiny:diverging_trainer", folder, out=tmp_path / "report")
    assert report.root_cause == "lr_too_high"


def test_a_nan_the_trainers_log_hides_is_still_caught(tmp_path):
    """From the 12th step an MLP outputs NaN; logging_nan_inf_filter keeps it out of the Trainer's log."""
    model = hf_tiny.gpt2()
    calls = {"n": 0}

    def poison(module, args, output):
        calls["n"] += 1
        return output * float("nan") if calls["n"] >= 12 and module.training else output

    model.transformer.h[0].mlp.register_forward_hook(poison)
    args = hf_tiny.training_args(tmp_path, max_steps=20, logging_steps=5)
    callback = TriageCallback(dir=tmp_path / "captures", settings=triage.RecorderSettings(snapshot_every=5))
    transformers.Trainer(model=model, args=args, train_dataset=hf_tiny.TokenDataset(),
                         callbacks=[callback]).train()
    manifest = json.loads((callback.captures[0] / "manifest.json").read_text())
    assert (manifest["trigger"]["kind"], manifest["step"], manifest["checkpoint_step"]) == ("nonfinite_loss", 12, 10)
