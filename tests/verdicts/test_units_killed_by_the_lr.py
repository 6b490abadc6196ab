"""ReLU units killed by an Adam learning rate (the ninth round's DeepSets at Adam 0.2, the twelfth round's
hypernetwork at Adam 0.05): a restart at the run's LR kills them again, one at a tenth of it keeps them alive.
Adam moves each weight about the LR a step, whatever the gradient, so the step that killed them is the LR's:
both authors named it lr_too_high, and triage said dead_relu (high). Under SGD the step scales with the
gradient, and a table fed in raw units kills them at an ordinary LR (the held-out family's
dead_relu_raw_table_first_step, fixed by standardising the inputs): that one stays dead_relu."""

import torch
from torch import nn

import triage
from tests._instrument_runs import cross_entropy, digits


def setup() -> triage.Setup:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.3), loss_fn=cross_entropy,
                        batches=digits(16, 64))


def test_units_an_adam_learning_rate_killed_are_the_learning_rates_fault(tmp_path):
    run = setup()
    for step in range(60):
        run.optimizer.zero_grad()
        run.loss_fn(run.model, run.batches[step % len(run.batches)]).backward()
        run.optimizer.step()
    checkpoint = triage.save_checkpoint(tmp_path / "ckpt.pt", run.model, run.optimizer, step=60)
    report = triage.run(setup, checkpoint, out=tmp_path / "report")[0]
    activations = report.experiment("activations").outcome
    assert activations["mean_dead_fraction"] > 0.5 or activations["max_dead_fraction"] > 0.9
    assert (report.root_cause, report.path[-1]) == ("lr_too_high", "lr_too_high_units_killed"), report.path
    assert report.experiment("restart_dead_lower_lr").outcome["optimizer_kind"] == "Adam"
