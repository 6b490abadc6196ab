"""activation_health: dead ReLU units, saturated sigmoid/tanh, spread with depth; BN stats untouched."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import triage
from triage.experiments.activations import ACTIVATION_HEALTH, ActivationOutcome, ActivationParams
from triage.experiments.base import Context
from triage.load.session import session_from_factory


def _batches(shape: tuple[int, ...], n: int = 4) -> list:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(*shape, generator=g), torch.randint(0, 3, (shape[0],), generator=g)) for _ in range(n)]


def _ce(model, batch):
    out = model(batch[0])
    return F.cross_entropy(out.reshape(out.shape[0], -1)[:, :3], batch[1])


def _run(model: nn.Module, batches: list, n: int = 8) -> ActivationOutcome:
    session = session_from_factory(lambda: triage.Setup(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=_ce, batches=batches))
    session.restore()
    out = ACTIVATION_HEALTH.measure(Context(session=session, budget_s=60), ActivationParams(batches=n))
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
    return out


def _mlp(dead_bias: float = 0.0) -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))
    with torch.no_grad():
        model[2].bias.fill_(dead_bias)
    return model


def _layer(out: ActivationOutcome, name: str):
    return next(h for h in out.layers if h.name == name)


def test_a_relu_behind_a_large_negative_bias_is_dead():
    out = _run(_mlp(dead_bias=-10.0), _batches((32, 8)))
    assert _layer(out, "3").dead_fraction == 1.0
    assert _layer(out, "1").dead_fraction < 0.5
    assert out.worst_layer == "3" and out.max_dead_fraction == 1.0
    assert out.relu_layers == 2 and out.mean_dead_fraction >= 0.5  # 32 of the 64 units at least


def test_a_healthy_relu_mlp_is_quiet():
    out = _run(_mlp(), _batches((32, 8)))
    assert out.relu_layers == 2 and out.max_dead_fraction < 0.5
    assert out.max_saturated_fraction is None
    assert 0.1 < out.std_growth < 10


def test_units_are_channels_for_convolutions_and_the_last_dim_for_sequences():
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten())
    with torch.no_grad():
        conv[0].bias.copy_(torch.tensor([-100.0, 0.0, 0.0, 0.0]))
    out = _run(conv, _batches((8, 1, 6, 6)))
    assert out.layers[0].units == 4 and out.layers[0].dead_fraction == 0.25

    seq = nn.Sequential(nn.Linear(8, 4), nn.ReLU())  # (batch, time, features)
    with torch.no_grad():
        seq[0].bias.copy_(torch.tensor([-100.0, 0.0, 0.0, 0.0]))
    out = _run(seq, _batches((8, 5, 8)))
    assert out.layers[0].units == 4 and out.layers[0].dead_fraction == 0.25


@pytest.mark.parametrize("act, gain, saturated", [(nn.Sigmoid, 50.0, True), (nn.Tanh, 50.0, True),
                                                  (nn.Sigmoid, 0.1, False), (nn.Tanh, 0.1, False)])
def test_saturation_of_sigmoid_and_tanh(act, gain, saturated):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), act(), nn.Linear(16, 3))
    with torch.no_grad():
        model[0].weight.mul_(gain)
    out = _run(model, _batches((32, 8)))
    assert out.relu_layers == 0 and out.max_dead_fraction is None
    assert (out.max_saturated_fraction > 0.8) if saturated else (out.max_saturated_fraction == 0.0)
    assert out.worst_layer == "1"


class Shared(nn.Module):
    """One activation module used twice, and a BatchNorm that must keep its running statistics."""

    def __init__(self):
        super().__init__()
        self.a, self.bn, self.b, self.act = nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 3), nn.ReLU()

    def forward(self, x):
        return self.act(self.b(self.act(self.bn(self.a(x)))))


def test_batchnorm_statistics_and_modes_are_left_as_they_were():
    model = Shared()
    with torch.no_grad():
        model.bn.running_mean.fill_(0.5)
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = _run(model, _batches((32, 8)))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert not model.training and not model.bn.training
    assert [h.name for h in out.layers] == ["act", "act#2"]
    assert [h.units for h in out.layers] == [16, 3]


def test_a_deep_stack_with_large_weights_grows_its_spread():
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [nn.Linear(16, 16), nn.LeakyReLU()]
    model = nn.Sequential(nn.Linear(8, 16), *layers)
    with torch.no_grad():
        for m in model:
            if isinstance(m, nn.Linear):
                m.weight.mul_(8.0)
    out = _run(model, _batches((32, 8)))
    assert out.std_growth > 100


def test_functional_activations_are_not_seen():
    class Functional(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 3)

        def forward(self, x):
            return F.relu(self.lin(x))

    out = _run(Functional(), _batches((32, 8)))
    assert out.hooked_layers == 0 and out.relu_layers == 0
    assert out.max_dead_fraction is None and out.worst_layer is None and out.std_growth is None
