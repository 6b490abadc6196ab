"""A linear warm-up-and-decay schedule handed the epoch count where it counts batches (the tenth round's SASRec:
num_training_steps=15 for a run of 15 epochs of 40 batches), saved as the model's state_dict alone: the LR is 0
from step 15 of 600 and the run stalls. Without a step or the scheduler's state, where the run stood on its
schedule was not known (a fresh scheduler says step 0, warm-up), and the stall went to healthy. The schedule
traced over the run's declared total_steps is ~0 for most of it: that is measured, whatever the position."""

import torch

import triage
from tests._instrument_runs import cross_entropy, digits, mlp

EPOCHS, BATCHES = 15, 40


def warmup_decay(optimizer, total: int):
    warm = max(1, total // 10)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: step / warm if step < warm else max(0.0, (total - step) / max(1, total - warm)))


def factory(schedule_steps: int):
    def setup():
        torch.manual_seed(0)
        model = mlp()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        return triage.Setup(model=model, optimizer=optimizer, loss_fn=cross_entropy, batches=digits(BATCHES, 32),
                            val_batches=digits(4, 32, offset=BATCHES * 32),
                            scheduler=warmup_decay(optimizer, schedule_steps), total_steps=EPOCHS * BATCHES)
    return setup


def triaged(tmp_path, schedule_steps: int, save_step: bool):
    setup = factory(schedule_steps)
    run = setup()
    for step in range(EPOCHS * BATCHES // 2):
        run.optimizer.zero_grad()
        run.loss_fn(run.model, run.batches[step % BATCHES]).backward()
        run.optimizer.step()
        run.scheduler.step()
    path = tmp_path / "model.pt"
    if save_step:
        triage.save_checkpoint(path, run.model, run.optimizer, step=EPOCHS * BATCHES // 2, scheduler=run.scheduler)
    else:
        torch.save(run.model.state_dict(), path)
    return triage.run(setup, path, out=tmp_path / "report")[0]


def test_a_schedule_that_ends_long_before_the_run_is_found_without_the_checkpoints_step(tmp_path):
    report = triaged(tmp_path, schedule_steps=EPOCHS, save_step=False)
    schedule = report.experiment("schedule").outcome
    assert not schedule["position_known"] and schedule["lr_idle_from"] == EPOCHS
    assert report.root_cause == "lr_schedule_decayed", report.path
    assert "schedule_ends_early" in [f.id for f in report.findings]


def test_a_schedule_over_the_whole_run_is_not(tmp_path):
    report = triaged(tmp_path, schedule_steps=EPOCHS * BATCHES, save_step=False)
    assert report.experiment("schedule").outcome["lr_idle_from"] > EPOCHS * BATCHES * 0.9  # ~0 at its last steps
    assert report.root_cause != "lr_schedule_decayed"
    assert "schedule_ends_early" not in [f.id for f in report.findings]
