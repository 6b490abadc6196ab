"""gradient_flow: parameters that cannot train (detached, frozen, outside the optimizer) and vanishing."""

from __future__ import annotations

from typing import Callable, Optional

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import triage
from triage.experiments.base import Context
from triage.experiments.gradient_flow import GRADIENT_FLOW, GradientFlowOutcome, GradientFlowParams
from triage.load.session import session_from_factory


def _mlp(depth: int, act: type[nn.Module], width: int = 32, kaiming: bool = False) -> nn.Sequential:
    torch.manual_seed(0)
    sizes = [8] + [width] * (depth - 1) + [3]
    layers: list[nn.Module] = []
    for i in range(depth):
        layer = nn.Linear(sizes[i], sizes[i + 1])
        if kaiming:
            nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
            nn.init.zeros_(layer.bias)
        layers += [layer, act()] if i < depth - 1 else [layer]
    return nn.Sequential(*layers)


class EncoderHead(nn.Module):
    def __init__(self, detach: bool = False):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
        self.head = nn.Linear(16, 3)
        self.detach = detach

    def forward(self, x):
        h = self.encoder(x)
        return self.head(h.detach() if self.detach else h)


def _ce(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


def _run(model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, loss_fn: Callable = _ce,
         batches: int = 1) -> GradientFlowOutcome:
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g)) for _ in range(3)]
    optimizer = optimizer or torch.optim.SGD([q for q in model.parameters() if q.requires_grad], lr=0.1)
    session = session_from_factory(lambda: triage.Setup(model=model, optimizer=optimizer, loss_fn=loss_fn,
                                                        batches=data))
    session.restore()
    return GRADIENT_FLOW.measure(Context(session=session, budget_s=60), GradientFlowParams(batches=batches))


ENCODER = ["encoder.0.weight", "encoder.0.bias", "encoder.2.weight", "encoder.2.bias"]


def test_a_detached_encoder_gets_no_gradient():
    out = _run(EncoderHead(detach=True))
    assert out.no_grad == ENCODER and out.no_grad_count == 4
    encoder, head = 8 * 16 + 16 + 16 * 16 + 16, 16 * 3 + 3
    assert out.no_grad_fraction == pytest.approx(encoder / (encoder + head))
    assert out.loss_has_grad and not out.frozen and not out.not_in_optimizer
    assert [layer.name for layer in out.layer_norms if layer.norm > 0] == ["head.weight", "head.bias"]


def test_frozen_parameters_are_listed_and_not_counted_as_gradient_less():
    model = EncoderHead()
    model.encoder.requires_grad_(False)
    out = _run(model)
    assert out.frozen == ENCODER and out.frozen_count == 4
    assert out.frozen_fraction == pytest.approx(416 / (416 + 51))
    assert out.no_grad == [] and out.trainable_count == 2


def test_parameters_missing_from_the_optimizer_are_listed():
    model = EncoderHead()
    out = _run(model, optimizer=torch.optim.Adam(model.head.parameters(), lr=1e-3))
    assert out.not_in_optimizer == ENCODER and out.not_in_optimizer_count == 4
    assert out.not_in_optimizer_fraction == pytest.approx(416 / (416 + 51))
    assert out.frozen == [] and out.no_grad == [] and out.trainable_count == 2


def test_a_detached_loss_has_no_grad_anywhere():
    out = _run(EncoderHead(), loss_fn=lambda model, batch: _ce(model, batch).detach())
    assert not out.loss_has_grad
    assert out.no_grad_count == out.trainable_count == 6 and out.no_grad_fraction == 1.0
    assert out.early_late_ratio is None and out.max_layer_norm is None


def test_a_deep_sigmoid_mlp_has_vanishing_gradients():
    out = _run(_mlp(depth=10, act=nn.Sigmoid))
    assert out.early_late_ratio < 1e-3
    assert out.no_grad == []  # vanishing, not absent


@pytest.mark.parametrize("batches", [1, 3])
def test_a_healthy_mlp_is_quiet(batches):
    model = _mlp(depth=4, act=nn.ReLU, kaiming=True)
    out = _run(model, batches=batches)
    assert out.no_grad == [] and out.frozen == [] and out.not_in_optimizer == []
    assert out.no_grad_fraction == out.frozen_fraction == out.not_in_optimizer_fraction == 0.0
    assert 0.1 < out.early_late_ratio < 10  # within an order of magnitude; vanishing is orders below
    assert [layer.name for layer in out.layer_norms] == [n for n, _ in model.named_parameters()]
    assert 0 < out.min_layer_norm <= out.max_layer_norm


def test_dead_units_zero_the_gradient_through_an_intact_graph():
    import torch
    from torch import nn

    from tests.tiny import context, cross_entropy, blobs
    import triage

    def dead():
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        with torch.no_grad():
            model[0].bias.fill_(-100.0)  # every unit of the first layer is off for every example
        return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                            loss_fn=cross_entropy, batches=blobs())

    from triage.experiments.gradient_flow import GRADIENT_FLOW, GradientFlowParams

    out = GRADIENT_FLOW.measure(context(dead), GradientFlowParams())
    # behind the dead units nothing learns, and the next layer sees only zeros: its weight neither
    assert out.no_grad == [] and set(out.zero_grad) == {"0.weight", "0.bias", "2.weight"}
    assert out.zero_grad_fraction > 0.5
