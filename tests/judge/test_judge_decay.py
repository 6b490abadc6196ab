"""How far weight decay can have shrunk the weights, from the optimizer's settings alone."""

import pytest
import torch

from triage.judge.decay import decay_reach


def test_decay_reach_bounds_what_weight_decay_can_have_removed():
    """lr x weight_decay summed over the checkpoint's steps and 100 more (x1/(1-momentum) for SGD);
    unknown where the decay does not act so simply (Adam's coupled L2)."""
    params = [torch.nn.Parameter(torch.ones(2))]
    sgd = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.5)
    assert decay_reach(sgd, checkpoint_step=60) == pytest.approx(0.1 * 0.5 * 10 * 160)
    adamw = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    assert decay_reach(adamw, checkpoint_step=100) == pytest.approx(1e-3 * 0.01 * 200)  # 0.2%: harmless
    assert decay_reach(torch.optim.Adam(params, lr=1e-3, weight_decay=0.01), checkpoint_step=100) is None
    assert decay_reach(sgd, checkpoint_step=None) is None
    # A schedule that has decayed the LR: the decay acted at the initial LR before.
    scheduler = torch.optim.lr_scheduler.StepLR(sgd, step_size=1, gamma=0.01)
    sgd.step()
    scheduler.step()
    assert sgd.param_groups[0]["lr"] == pytest.approx(1e-3)
    assert decay_reach(sgd, checkpoint_step=60) == pytest.approx(0.1 * 0.5 * 10 * 160)
