"""lr_trace: the schedule from step 0, without touching the run's scheduler."""

import math

import torch

from tests._instrument_runs import classifier_setup, run, session_of, trained_checkpoint
from triage.experiments.lr_trace import LR_TRACE


def _step_lr_setup():
    setup = classifier_setup(lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(setup.optimizer, step_size=10, gamma=0.01)
    return setup.model_copy(update={"scheduler": scheduler})


def test_a_step_schedule_decayed_by_100x_every_10_steps_is_flagged_near_zero():
    session = session_of(_step_lr_setup, trained_checkpoint(_step_lr_setup, steps=30))
    out = run(LR_TRACE, session)
    assert out.has_scheduler and out.checkpoint_step == 30
    assert out.lr_peak == 0.1
    assert out.lr_now_ratio < 1e-3
    assert out.horizon == 100 and out.steps[0] == 0 and out.steps[-1] == 100  # no total_steps: max(3x30, 100)
    assert math.isclose(out.lrs[out.steps.index(25)], 0.1 * 0.01 ** 2)
    # The run's own scheduler and optimizer were not moved.
    assert session.setup.scheduler.last_epoch == 30
    assert math.isclose(session.setup.optimizer.param_groups[0]["lr"], 0.1 * 0.01 ** 3)


def test_without_a_scheduler_the_lr_now_is_the_peak():
    out = run(LR_TRACE, session_of(lambda: classifier_setup(lr=0.1)))
    assert not out.has_scheduler
    assert out.lr_now_ratio == 1.0


def test_early_in_a_long_cosine_schedule_the_lr_is_near_its_peak():
    def factory():
        setup = classifier_setup(lr=0.1, total_steps=5000)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(setup.optimizer, T_max=5000)
        return setup.model_copy(update={"scheduler": scheduler})

    out = run(LR_TRACE, session_of(factory, trained_checkpoint(factory, steps=30)))
    assert out.lr_now_ratio > 0.99
    assert out.horizon == 5000 and out.steps[-1] == 5000
    assert len(out.lrs) <= 501  # subsampled (plus the checkpoint's step)
    assert out.lr_end < 1e-6  # cosine to zero at T_max


def test_a_low_lr_during_warmup_is_not_past_the_peak():
    def warmup():
        setup = classifier_setup(lr=0.1, total_steps=200)
        scheduler = torch.optim.lr_scheduler.LinearLR(setup.optimizer, start_factor=1e-4, total_iters=100)
        return setup.model_copy(update={"scheduler": scheduler})

    out = run(LR_TRACE, session_of(warmup, trained_checkpoint(warmup, steps=1)))
    assert out.lr_now_ratio < 0.02 and not out.past_peak  # step 1 of a 1e-4 → 1 warmup
    assert run(LR_TRACE, session_of(_step_lr_setup, trained_checkpoint(_step_lr_setup, steps=30))).past_peak
