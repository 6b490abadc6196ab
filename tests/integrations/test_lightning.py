"""Lightning: TriageCallback captures a real lightning.Trainer run, and triage derives the Setup from the
LightningModule (no hand-written setup())."""

import json

import pytest
import torch

from tests.lightning_tiny import LitManual, LitMLP, fit, module_with_data
import triage
from triage.load.checkpoint import read_checkpoint
from triage.integrations.lightning import TriageCallback
from triage.load.lightning_setup import StepEvery, _optimizers
from triage.load.session import open_session


def captured(tmp_path, module, **trainer_args):
    callback = TriageCallback(dir=tmp_path / "captures", settings=triage.RecorderSettings(snapshot_every=25))
    fit(module, tmp_path, [callback], **trainer_args)
    assert len(callback.captures) == 1, "the run diverges after its LR jump: the callback must capture it"
    return callback.captures[0]


def test_the_callback_captures_a_lightning_checkpoint_with_the_trainers_settings(tmp_path):
    folder = captured(tmp_path, LitMLP(), gradient_clip_val=5.0)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["framework"] == "lightning" and manifest["checkpoint"] == "checkpoint.ckpt"
    assert (manifest["precision"], manifest["grad_clip"], manifest["total_steps"]) == ("fp32", 5.0, 120)
    assert manifest["entry"] == "tests.lightning_tiny:LitMLP"
    ckpt = read_checkpoint(folder)
    assert ckpt.layout == "lightning" and ckpt.hyper_parameters["jump"] == 20.0
    assert ckpt.step == manifest["checkpoint_step"] < manifest["step"]


def test_triage_derives_the_setup_from_the_module_and_finds_the_cause(tmp_path):
    folder = captured(tmp_path, LitMLP(), gradient_clip_val=5.0)
    session = open_session("tests.lightning_tiny:LitMLP", folder)
    setup = session.setup
    assert isinstance(setup.model, LitMLP) and setup.grad_clip == 5.0 and setup.train_step is None
    assert setup.scheduler.last_epoch == read_checkpoint(folder).step  # the checkpoint's scheduler state
    assert len(session.batches) == len(json.loads((folder / "manifest.json").read_text())["batch_steps"])
    assert len(session.val_batches) == 4, "val_dataloader() is the validation data"
    report, _ = triage.run("tests.lightning_tiny:LitMLP", folder, out=tmp_path / "report")
    assert report.root_cause == "lr_too_high"


def test_manual_optimization_becomes_the_runs_train_step(tmp_path):
    folder = captured(tmp_path, LitManual())
    setup = open_session(LitManual, folder).setup
    assert setup.train_step is not None
    before = setup.model.net[0].weight.detach().clone()
    loss = setup.train_step(setup.model, setup.optimizer, setup.batches[0])
    assert torch.isfinite(loss) and not torch.equal(before, setup.model.net[0].weight)
    assert setup.model.net[0].weight.grad is not None
    report, _ = triage.run(LitManual, folder, out=tmp_path / "report")
    assert report.root_cause == "lr_too_high"


def test_a_plain_lightning_checkpoint_with_a_datamodule_and_saved_hparams(tmp_path):
    module, data = module_with_data()
    trainer = fit(module, tmp_path, max_steps=5, datamodule=data)
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    state = torch.load(tmp_path / "run.ckpt", weights_only=True)
    state["hyper_parameters"].update(precision="bf16-mixed", gradient_clip_val=0.5, lr=0.07)
    torch.save(state, tmp_path / "run.ckpt")
    setup = open_session(module_with_data, tmp_path / "run.ckpt").setup
    assert (setup.precision, setup.grad_clip) == ("bf16", 0.5)
    assert len(list(setup.batches)) == 16  # the datamodule's train_dataloader
    assert torch.equal(setup.model.net[0].weight, module.net[0].weight)


def test_a_module_class_is_built_with_the_checkpoints_hyper_parameters(tmp_path):
    module = LitMLP(lr=0.003, hidden=48)
    trainer = fit(module, tmp_path, max_steps=3)
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    setup = open_session(LitMLP, tmp_path / "run.ckpt").setup
    assert setup.model.net[0].out_features == 48
    assert setup.scheduler.get_last_lr() == [pytest.approx(0.003)]


def test_every_return_form_of_configure_optimizers():
    params = [torch.nn.Parameter(torch.zeros(2))]
    opt = torch.optim.SGD(params, lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)
    assert _optimizers(opt) == (opt, None, 1)
    assert _optimizers([opt]) == (opt, None, 1)
    assert _optimizers(([opt], [sched])) == (opt, sched, -1)  # Lightning's default interval is the epoch
    assert _optimizers({"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}) == (opt, sched, 1)
    assert _optimizers([{"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step",
                                                             "frequency": 4}}]) == (opt, sched, 4)
    every = StepEvery(sched, 3)
    for _ in range(6):
        every.step()
    assert (every.last_epoch, sched.last_epoch) == (6, 2)
