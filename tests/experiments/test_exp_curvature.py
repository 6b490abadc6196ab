"""The curvature instrument: the top Hessian eigenvalue at the checkpoint, against the edge of stability."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import triage
from tests._instrument_runs import run, session_of
from triage.experiments.curvature import CURVATURE


def quadratic(curvatures, optimizer):
    """loss = 1/2 sum_i c_i w_i^2 on a 'model' whose one parameter is w: its Hessian is diag(c)."""
    def make() -> triage.Setup:
        model = nn.Linear(len(curvatures), 1, bias=False)
        with torch.no_grad():
            model.weight.fill_(1.0)
        c = torch.tensor(curvatures)

        def loss_fn(model, batch):
            return 0.5 * (c * model.weight[0] ** 2).sum() + 0 * batch[0].sum()

        return triage.Setup(model=model, optimizer=optimizer(model.parameters()), loss_fn=loss_fn,
                            batches=[(torch.zeros(1),)])
    return make


def test_the_top_eigenvalue_of_a_known_hessian_is_found_and_set_against_2_over_lr():
    out = run(CURVATURE, session_of(quadratic([1.0, 4.0, 30.0], lambda ps: torch.optim.SGD(ps, lr=0.1))))
    assert out.sharpness == pytest.approx(30.0, rel=1e-3) and out.converged
    assert out.edge == pytest.approx(2 / 0.1) and out.edge_ratio == pytest.approx(30.0 / 20.0, rel=1e-3)
    assert out.stable_lr_scale == pytest.approx(20.0 / 30.0, rel=1e-3)  # lr x0.67 sits at the edge


def test_momentum_moves_the_edge():
    out = run(CURVATURE, session_of(quadratic([5.0], lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))))
    assert out.edge == pytest.approx(2 * 1.9 / 0.1) and out.edge_ratio < 1


def test_adam_is_judged_on_its_preconditioned_hessian():
    from tests._instrument_runs import trained_checkpoint

    make = quadratic([1.0, 100.0], lambda ps: torch.optim.Adam(ps, lr=0.01))
    out = run(CURVATURE, session_of(make, trained_checkpoint(make, 3)))
    assert out.preconditioned and out.edge == pytest.approx(38 / 0.01)
    assert out.sharpness is not None and out.sharpness > 0


def test_attention_models_get_their_sharpness_measured():
    """The fused attention kernels have no double backward ("derivative for ..._flash_attention_... is not
    implemented"): the instrument runs attention through its math kernel."""
    def make() -> triage.Setup:
        torch.manual_seed(0)
        model = nn.Sequential(nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, dropout=0.0),
                              nn.Flatten(), nn.Linear(8 * 4, 3))
        g = torch.Generator().manual_seed(0)
        batches = [(torch.randn(6, 4, 8, generator=g), torch.randint(0, 3, (6,), generator=g)) for _ in range(2)]
        return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                            loss_fn=lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]), batches=batches)

    out = run(CURVATURE, session_of(make))
    assert out.sharpness is not None and out.sharpness > 0 and out.edge == pytest.approx(20.0)
