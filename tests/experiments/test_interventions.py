"""The fixes a replay applies, each put back afterwards: unfreeze, unsquash, the schedule's peak, revived
dead units, sigmoid/tanh swapped for ReLU."""

import pydantic
import pytest
import torch
from torch import nn

import triage
from tests.tiny import blobs, context, cross_entropy, mlp_setup
from triage.experiments.dead_units import find_dead_units, revive
from triage.experiments.interventions import held_at_peak, swap_saturating, unfrozen, unsquash
from triage.experiments.replay import REPLAY, ReplayParams


def frozen_setup():
    s = mlp_setup()
    first = s.model[0]
    first.weight.requires_grad_(False)
    optimizer = torch.optim.SGD([p for p in s.model.parameters() if p is not first.bias], lr=0.05)
    return s.model_copy(update={"optimizer": optimizer})


def test_unfrozen_trains_everything_then_puts_the_optimizer_and_flags_back():
    s = frozen_setup()
    groups = len(s.optimizer.param_groups)
    with unfrozen(s.model, s.optimizer):
        assert all(p.requires_grad for p in s.model.parameters())
        held = {id(p) for g in s.optimizer.param_groups for p in g["params"]}
        assert all(id(p) in held for p in s.model.parameters())
    assert len(s.optimizer.param_groups) == groups
    assert not s.model[0].weight.requires_grad


def test_an_unfreeze_replay_moves_the_frozen_weights_and_the_next_experiment_starts_clean():
    ctx = context(frozen_setup)
    weight = ctx.session.setup.model[0].weight
    before = weight.detach().clone()
    REPLAY.measure(ctx, ReplayParams(steps=5, unfreeze=True))
    assert not torch.equal(weight, before)
    ctx.restart()  # the snapshot loads: the optimizer has the groups it was saved with
    assert torch.equal(weight, before) and not weight.requires_grad


def test_unsquash_undoes_softmax_rows_and_sigmoid_values_and_leaves_scores_alone():
    logits = torch.tensor([[2.0, 0.0, -1.0]])
    assert torch.allclose(unsquash(logits.softmax(-1)).softmax(-1), logits.softmax(-1))
    assert torch.allclose(unsquash(torch.sigmoid(torch.tensor([0.5, -2.0]))), torch.tensor([0.5, -2.0]), atol=1e-4)
    assert unsquash(logits) is logits


def test_held_at_peak_gives_the_factor_to_the_peak_and_restores_the_lr():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    opt.param_groups[0]["lr"] = 0.001

    class Trace:
        lr_peak = 0.1

    with held_at_peak(opt, Trace()) as factor:
        assert factor == pytest.approx(100)
    assert opt.param_groups[0]["lr"] == 0.001


def test_swap_saturating_replaces_hidden_sigmoids_but_not_the_output():
    model = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1), nn.Sigmoid())
    assert swap_saturating(model) == 2
    assert [type(m).__name__ for m in model] == ["Linear", "ReLU", "Linear", "ReLU", "Linear", "Sigmoid"]


def test_swap_is_refused_on_the_checkpoints_own_model():
    with pytest.raises(pydantic.ValidationError, match="not the checkpoint"):
        ReplayParams(swap_saturating=True)


def dead_setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    with torch.no_grad():
        model[0].bias[:24] = -50.0  # 24 of 32 units never fire
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                        loss_fn=cross_entropy, batches=blobs())


def test_revive_finds_the_dead_units_and_reinitialises_only_them():
    setup = dead_setup()
    dead = find_dead_units(setup, setup.batches, torch.device("cpu"))
    assert len(dead) == 1 and int(dead[0][2].sum()) == 24
    alive_rows = setup.model[0].weight[24:].detach().clone()
    assert revive(dead, setup.optimizer) == 24
    assert torch.equal(setup.model[0].weight[24:], alive_rows)
    assert float(setup.model[0].bias[:24].min().detach()) > -1  # a default bias, not -50
    assert find_dead_units(setup, setup.batches, torch.device("cpu")) == []


def test_unfreezing_under_a_lambda_schedule_extends_it_to_the_added_group():
    """A warmup LambdaLR on an optimizer built from the trainable parameters only: the unfreeze candidate
    adds a param group, and the schedule must step it with the first group's lambda (it raised before)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    for p in model[0].parameters():
        p.requires_grad_(False)  # the leftover line
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
    first = model[0].weight.detach().clone()
    with unfrozen(model, optimizer, scheduler):
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(16, 4)).pow(2).mean().backward()
            optimizer.step()
            scheduler.step()
        lrs = [group["lr"] for group in optimizer.param_groups]
    assert len(lrs) == 2 and lrs[0] == lrs[1] == pytest.approx(0.1 * 4 / 10)
    assert not torch.equal(first, model[0].weight), "the frozen layer trained"
    assert len(optimizer.param_groups) == 1 and len(scheduler.lr_lambdas) == 1 and len(scheduler.base_lrs) == 1
    assert not model[0].weight.requires_grad


def test_unfreezing_under_a_schedule_that_cannot_take_the_group_is_not_applicable():
    from triage.experiments import NotApplicable

    class OneGroupOnly(torch.optim.lr_scheduler.LRScheduler):
        def get_lr(self):
            if len(self.optimizer.param_groups) != 1:
                raise ValueError("expected one param group")
            return list(self.base_lrs)

    model = nn.Sequential(nn.Linear(4, 2), nn.Linear(2, 2))
    for p in model[0].parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.SGD(model[1].parameters(), lr=0.1)
    scheduler = OneGroupOnly(optimizer)
    with pytest.raises(NotApplicable, match="OneGroupOnly cannot schedule"):
        with unfrozen(model, optimizer, scheduler):
            pass
    assert len(optimizer.param_groups) == 1 and not model[0].weight.requires_grad
