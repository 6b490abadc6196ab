"""The run's own init scaled down: which constant matrices it draws afresh, and which it keeps."""

import torch
from torch import nn

import triage
from triage.experiments.inits import apply_init, stuck_constants


class LowRank(nn.Module):
    """A frozen base layer beside a LoRA-style adapter: A drawn, B zeroed on purpose."""

    def __init__(self, zero_a: bool = False):
        super().__init__()
        self.base = nn.Linear(8, 4)
        self.base.requires_grad_(False)
        self.a = nn.Parameter(torch.zeros(2, 8) if zero_a else torch.randn(2, 8) * 0.1)
        self.b = nn.Parameter(torch.zeros(4, 2))

    def forward(self, x):
        return self.base(x) + x @ self.a.T @ self.b.T


def _setup(model):
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                        loss_fn=lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]), batches=[(x, y)])


def test_a_zeroed_adapter_whose_rows_get_different_gradients_is_kept_at_zero():
    setup = _setup(LowRank())
    stuck = stuck_constants(setup, setup.batches[0], torch.device("cpu"))
    assert stuck == frozenset()  # B is zero by design: its gradient tells its rows apart
    apply_init(setup.model, "scaled", 0.1, stuck)
    assert bool((setup.model.b == 0).all())


def test_both_factors_zeroed_get_no_gradient_and_are_drawn_afresh():
    setup = _setup(LowRank(zero_a=True))
    stuck = stuck_constants(setup, setup.batches[0], torch.device("cpu"))
    assert stuck == {id(setup.model.a), id(setup.model.b)}
    apply_init(setup.model, "scaled", 0.1, stuck)
    assert setup.model.a.abs().max() > 0 and setup.model.b.abs().max() > 0
    assert setup.model.a.abs().max() <= 1 / 8 and setup.model.b.abs().max() <= 1 / 2


def test_a_zeroed_one_output_head_that_gets_a_gradient_is_kept():
    """A one-row matrix has no rows to tell apart: it is drawn afresh only where its gradient is zero."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    nn.init.zeros_(model[2].weight)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    setup = triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                         loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]), batches=[(x, y)])
    assert stuck_constants(setup, setup.batches[0], torch.device("cpu")) == frozenset()
