"""Searches: the learning rate on a wide grid, and alternative initialisations, each a paired replay."""

import torch
from torch import nn

import triage
from tests.tiny import blobs, context, cross_entropy, mlp_setup
from triage.experiments.replay import REPLAY, ReplayParams
from triage.experiments.search import INIT_SEARCH, LR_FACTORS, LR_SEARCH, InitSearchParams, LrSearchParams


def with_baseline(factory, **replay):
    ctx = context(factory)
    ctx.outcomes["base"] = REPLAY.measure(ctx, ReplayParams(steps=30, **replay))
    ctx.restart()
    return ctx


def test_a_unit_slip_of_ten_thousand_is_inside_the_grid():
    """An lr of 500 where 0.05 trains: x0.1 .. x0.001 still blow up, x1e-4 works."""
    ctx = with_baseline(lambda: mlp_setup(lr=500.0))
    assert not ctx.outcomes["base"].finite or ctx.outcomes["base"].loss_ratio > 1.5
    out = LR_SEARCH.measure(ctx, LrSearchParams(steps=30, direction="down", against="base"))
    assert out.fix_works and out.lr_factor <= 1e-3
    assert [t.setting for t in out.trials][:3] == ["lr x0.1", "lr x0.01", "lr x0.001"]
    assert out.lrs[0] == 500.0 * out.lr_factor
    # What the least working factor trains at, and of which optimizer: how the judge tells a slip from a
    # fix that is far-fetched for that optimizer.
    assert out.optimizer_kind == "SGD"
    assert abs(out.least_working_lr - 500.0 * out.least_working_factor) < 1e-9 * out.least_working_lr


def test_going_up_it_finds_the_lr_that_trains_and_stops_once_higher_is_worse():
    ctx = with_baseline(lambda: mlp_setup(lr=5e-6))
    out = LR_SEARCH.measure(ctx, LrSearchParams(steps=30, direction="up", against="base"))
    assert out.fix_works and out.lr_factor >= 1e3  # a slip of 1e4 is found

    ctx = with_baseline(lambda: mlp_setup(lr=5e-4))
    out = LR_SEARCH.measure(ctx, LrSearchParams(steps=30, direction="up", against="base"))
    assert out.fix_works and len(out.trials) < 5  # it stopped once a higher lr did worse
    assert out.trials[-1].setting != out.chosen and out.loss_end < out.trials[-1].loss_end


def test_going_down_it_stops_once_the_lr_is_too_small_to_move_the_loss():
    """A run whose lr is already too low: x0.1 and x0.01 barely move the loss, so x0.001 .. x1e-5
    (which move it less still) are not tried."""
    ctx = with_baseline(lambda: mlp_setup(lr=5e-4))
    out = LR_SEARCH.measure(ctx, LrSearchParams(steps=30, direction="down", against="base"))
    assert out.fix_works is False
    # Nor the half-decade above x0.1: no lr on the grid beat the run, so the lr is not what holds it back.
    assert [t.setting for t in out.trials] == ["lr x0.1", "lr x0.01"]
    assert out.trials[1].loss_end >= out.trials[0].loss_end > out.reference_end


def test_when_no_lr_on_the_grid_works_the_half_decade_under_the_best_one_is_tried():
    """lr 3 over 3 steps: x0.1 ends no clearly lower than the run, x0.01 and below are too slow to get
    anywhere in 3 steps; lr x0.316 (between x0.1 and the run's own) trains."""
    ctx = context(lambda: mlp_setup(lr=3.0))
    ctx.outcomes["base"] = REPLAY.measure(ctx, ReplayParams(steps=3))
    ctx.restart()
    out = LR_SEARCH.measure(ctx, LrSearchParams(steps=3, direction="down", against="base"))
    grid, between = out.trials[:-1], out.trials[-1]
    assert not any(t.fix_works for t in grid) and grid[0].setting == "lr x0.1"
    assert between.setting == "lr x0.316" and between.fix_works
    assert out.chosen == "lr x0.316" and abs(out.lr_factor - 10 ** -0.5) < 1e-9


def test_when_no_lr_works_the_search_says_so():
    """Labels that are noise: no learning rate makes the loss clearly better than the run and sane."""
    def noise():
        s = mlp_setup()
        g = torch.Generator().manual_seed(3)
        batches = [(torch.randn(32, 8, generator=g), torch.randint(0, 3, (32,), generator=g)) for _ in range(6)]
        return s.model_copy(update={"batches": batches})

    ctx = with_baseline(noise)
    out = LR_SEARCH.measure(ctx, LrSearchParams(steps=30, direction="up", against="base"))
    assert out.fix_works is False
    grid = [t for t in out.trials if t.setting in {f"lr x{f:g}" for f in LR_FACTORS["up"]}]
    last = grid[-1]  # up to where a higher lr only blows up sooner: non-finite, or its loss up 50%+
    assert len(grid) == 5 or not last.finite or last.loss_end > 1.5 * out.reference_end


def test_a_broken_init_is_repaired_by_a_standard_one():
    def zero_init():  # every weight 0: no hidden unit ever moves, only the output bias learns
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                            loss_fn=cross_entropy, batches=blobs())

    ctx = with_baseline(zero_init, init="setup")
    assert ctx.outcomes["base"].level_ratio > 0.95  # learned nothing
    out = INIT_SEARCH.measure(ctx, InitSearchParams(steps=30, against="base"))
    assert out.fix_works and out.chosen in ("init=default", "init=kaiming", "init=xavier", "init=scaled")
    assert {t.setting for t in out.trials} == {"init=default", "init=kaiming", "init=xavier", "init=scaled"}


def test_a_search_leaves_the_users_objects_as_they_were():
    ctx = context(mlp_setup)
    before = {k: v.clone() for k, v in ctx.session.setup.model.state_dict().items()}
    ctx.outcomes["base"] = REPLAY.measure(ctx, ReplayParams(steps=5))
    ctx.restart()
    LR_SEARCH.measure(ctx, LrSearchParams(steps=5, direction="up", against="base"))
    ctx.session.restore()
    after = ctx.session.setup.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
