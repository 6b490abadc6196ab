"""locate_nonfinite: names the module, op and source line that first produce a NaN/Inf."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import triage
from triage.experiments.base import Context
from triage.experiments.locate import LOCATE_NONFINITE, LocateParams
from triage.load.session import session_from_factory


def _line_of(marker: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# {marker}"))


class UnitNorm(nn.Module):
    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return x / (x.norm(dim=-1, keepdim=True) + self.eps)  # unit-norm-div


class Magnitude(nn.Module):
    """Appends |x| as a feature: finite forward, but d sqrt/dx at 0 is Inf."""

    def forward(self, x):
        magnitude = torch.sqrt((x ** 2).sum(-1, keepdim=True))  # magnitude-sqrt
        return x + magnitude


class Block(nn.Module):
    def __init__(self, norm: nn.Module, width: int = 8):
        super().__init__()
        self.lin = nn.Linear(width, width, bias=False)  # no bias: a zero row stays zero
        self.norm = norm

    def forward(self, x):
        return self.norm(self.lin(x))


class Net(nn.Module):
    def __init__(self, norms: list[nn.Module], width: int = 8):
        super().__init__()
        self.blocks = nn.ModuleList(Block(n, width) for n in norms)
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _batches(zero_row_in: int | None, n: int = 4) -> list:
    g = torch.Generator().manual_seed(0)
    batches = []
    for i in range(n):
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
        if i == zero_row_in:
            x[3] = 0.0
        batches.append((x, y))
    return batches


def _mse(model, batch):
    return F.mse_loss(model(batch[0]), batch[1])  # mse-loss


def _context(model: nn.Module, batches: list, loss_fn=_mse) -> Context:
    def factory() -> triage.Setup:
        torch.manual_seed(0)
        return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                            loss_fn=loss_fn, batches=batches)
    session = session_from_factory(factory)
    session.restore()
    return Context(session=session, budget_s=60)


def _assert_clean(model: nn.Module) -> None:
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks and not module._backward_hooks
    for param in model.parameters():
        assert not param._backward_hooks
    assert not torch.is_anomaly_enabled()


def test_division_by_a_zero_norm_is_named_in_the_forward():
    model = Net([UnitNorm(eps=1e-6), UnitNorm(eps=0.0)])
    ctx = _context(model, _batches(zero_row_in=2))
    out = LOCATE_NONFINITE.measure(ctx, LocateParams(steps=10))
    assert out.found and out.step == 2  # steps 0 and 1 are finite and move the weights
    assert out.stage == "forward" and not out.loss_finite
    assert out.module == out.forward_module == "blocks.1.norm"
    assert out.forward_module_type == "UnitNorm"
    assert out.inputs_finite is True
    assert "div" in out.op and out.domain_edge  # a division by 0: an eps guards it
    assert out.source.endswith(f"test_exp_locate.py:{_line_of('unit-norm-div')}")
    assert "x.norm(dim=-1" in out.source_line
    assert any(line.is_culprit and "x.norm" in line.text for line in out.source_context)
    _assert_clean(model)


def test_sqrt_at_zero_is_named_in_the_backward():
    model = Net([UnitNorm(eps=1e-6), Magnitude()])
    ctx = _context(model, _batches(zero_row_in=1))
    out = LOCATE_NONFINITE.measure(ctx, LocateParams(steps=10))
    assert out.found and out.step == 1
    assert out.stage == "backward" and out.loss_finite
    assert out.forward_module is None
    assert out.module == out.backward_module == "blocks.1.norm"
    assert out.op == "SqrtBackward0"  # the Inf it makes; anomaly mode flags the NaN one node later
    assert out.domain_edge
    assert out.anomaly_op == "PowBackward0"
    assert out.source.endswith(f"test_exp_locate.py:{_line_of('magnitude-sqrt')}")
    _assert_clean(model)


class ConvNet(nn.Module):
    """Conv -> BN -> ReLU(inplace): module backward hooks would break on this; node hooks must not."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=True))
        self.scale = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        h = self.features(x).mean(dim=(2, 3))
        return h.sum(-1, keepdim=True) * self.scale.sqrt()  # scale-sqrt


def test_backward_nan_behind_inplace_relu_is_found_without_breaking_the_forward():
    model = ConvNet()
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(4, 1, 6, 6, generator=g), torch.randn(4, 1, generator=g))]
    ctx = _context(model, batches)
    running_mean = model.features[1].running_mean.clone()
    out = LOCATE_NONFINITE.measure(ctx, LocateParams(steps=5))
    assert out.found and out.step == 0 and out.stage == "backward"
    assert out.op == "SqrtBackward0" and out.module == "(model)"
    assert out.source.endswith(f"test_exp_locate.py:{_line_of('scale-sqrt')}")
    # the failing step's own forward passes left the BatchNorm statistics as they were before it
    assert torch.equal(model.features[1].running_mean, running_mean)
    _assert_clean(model)


def _log_prob_loss(model, batch):
    probs = torch.softmax(model(batch[0]), dim=-1)
    return -(probs * 0.0).log().mean()  # log-of-zero


def test_a_loss_function_nan_names_the_op_and_no_module():
    model = nn.Sequential(nn.Linear(8, 4))
    ctx = _context(model, _batches(zero_row_in=None), loss_fn=_log_prob_loss)
    out = LOCATE_NONFINITE.measure(ctx, LocateParams(steps=3))
    assert out.found and out.step == 0 and out.stage == "forward" and not out.loss_finite
    assert out.module is None and out.forward_module is None
    assert out.op == "Tensor.log"
    assert out.source.endswith(f"test_exp_locate.py:{_line_of('log-of-zero')}")


@pytest.mark.parametrize("anomaly, precision", [(True, None), (False, None), (True, "bf16")])
def test_a_healthy_run_finds_nothing(anomaly, precision):
    model = Net([UnitNorm(eps=1e-6), UnitNorm(eps=1e-6)])
    ctx = _context(model, _batches(zero_row_in=2))
    out = LOCATE_NONFINITE.measure(ctx, LocateParams(steps=12, anomaly=anomaly, precision=precision))
    assert not out.found and out.steps_run == 12
    assert out.step is None and out.module is None and out.op is None and out.source is None
    _assert_clean(model)


def test_a_diverging_run_is_followed_to_the_op_that_overflows():
    model = Net([UnitNorm(eps=1e-6), UnitNorm(eps=1e-6)])
    ctx = _context(model, _batches(zero_row_in=None))
    assert not LOCATE_NONFINITE.measure(ctx, LocateParams(steps=40)).found
    ctx.session.restore()
    out = LOCATE_NONFINITE.measure(ctx, LocateParams(steps=40, lr_scale=1e4))
    assert out.found and out.step > 0 and out.stage == "forward" and not out.loss_finite
    assert out.op == "nn.functional.mse_loss"  # the squared error of a huge output overflows
    assert out.domain_edge is False  # no eps helps an overflow (issue 20, situation 4: "add an eps" was said)
    assert out.source.endswith(f"test_exp_locate.py:{_line_of('mse-loss')}")
    assert out.nonfinite_parameters == []


def test_a_bare_sequential_index_is_named_with_its_type_and_the_layer_before_it():
    model = nn.Sequential(nn.Linear(8, 8, bias=False), UnitNorm(eps=0.0), nn.Linear(8, 1))
    out = LOCATE_NONFINITE.measure(_context(model, _batches(zero_row_in=1)), LocateParams(steps=5))
    assert out.module == "1" and out.module_type == "UnitNorm"
    assert (out.previous_module, out.previous_module_type) == ("0", "Linear")


def test_a_named_module_needs_no_neighbour():
    model = Net([UnitNorm(eps=0.0)])
    out = LOCATE_NONFINITE.measure(_context(model, _batches(zero_row_in=0)), LocateParams(steps=3))
    assert out.module == "blocks.0.norm" and out.module_type == "UnitNorm" and out.previous_module is None


def test_a_weight_that_is_already_infinite_is_reported_as_such():
    model = Net([UnitNorm(eps=1e-6), UnitNorm(eps=1e-6)])
    with torch.no_grad():
        model.blocks[0].lin.weight[0, 0] = float("inf")
    out = LOCATE_NONFINITE.measure(_context(model, _batches(zero_row_in=None)), LocateParams(steps=3))
    assert out.found and out.step == 0 and out.module == "blocks.0.lin" and out.inputs_finite
    assert out.nonfinite_parameters == ["blocks.0.lin.weight"]
    assert out.op is None  # no op made it: F.linear was handed the Inf


class MaskedAttention(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)

    def forward(self, x, pad):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = (q @ k.transpose(1, 2)).masked_fill(pad[:, None, :], float("-inf"))  # a -inf mask is routine
        return self.out(torch.softmax(scores, dim=-1) @ v)  # attention-softmax


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.attn, self.head = nn.Embedding(20, 16), MaskedAttention(), nn.Linear(16, 20)

    def forward(self, ids, pad):
        return self.head(self.attn(self.emb(ids), pad))


def test_softmax_over_a_fully_masked_row_is_named_not_the_mask():
    g = torch.Generator().manual_seed(0)
    batches = []
    for i in range(3):
        pad = torch.zeros(4, 6, dtype=torch.bool)
        pad[:, -1] = True  # every sequence has one padded position: -inf scores every step
        if i == 1:
            pad[2] = True  # one sequence entirely padding: its softmax row is all -inf
        batches.append({"ids": torch.randint(0, 20, (4, 6), generator=g), "pad": pad})
    model = TinyLM()
    ctx = _context(model, batches, loss_fn=lambda m, b: F.cross_entropy(
        m(b["ids"], b["pad"]).reshape(-1, 20), b["ids"].reshape(-1)))
    out = LOCATE_NONFINITE.measure(ctx, LocateParams(steps=6))
    assert out.found and out.step == 1 and out.stage == "forward"
    assert out.module == "attn" and out.forward_module_type == "MaskedAttention"
    assert out.op == "softmax"
    assert out.source.endswith(f"test_exp_locate.py:{_line_of('attention-softmax')}")
    _assert_clean(model)
