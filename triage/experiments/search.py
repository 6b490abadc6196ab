"""Searches over one setting, each trial a paired replay from the same snapshot: the learning rate on a
wide grid, and alternative initialisations. The outcome is the chosen trial's replay (so conditions,
plots and the fix verification read it like any replay) plus every trial's figures. When to stop, the
half-decade between two grid points, and the trial chosen are the judge's (judge/search.py).
"""

from __future__ import annotations

from typing import Literal, Optional

import torch
from pydantic import Field

from triage.experiments.base import Context, Experiment, Params
from triage.experiments.inits import InitKind
from triage.experiments.lanes import run_trials
from triage.experiments.replay import REPLAY_VIEWS, ReplayOutcome, ReplayParams, measure as replay, working_end
from triage.experiments.verify import DEFAULT_LEVEL_MARGIN, DEFAULT_MARGIN, judged
from triage.judge import search as judge
from triage.views import Table
from triage.outcomes.search import LrSearchOutcome, SearchOutcome, Trial

# x1e-5 .. x1e5 of the run's LR: a unit slip (1e-3 written as 1e-7, or 10) is inside the grid.
LR_FACTORS = {"down": [1e-1, 1e-2, 1e-3, 1e-4, 1e-5], "up": [1e1, 1e2, 1e3, 1e4, 1e5]}


class LrSearchParams(ReplayParams):
    direction: Literal["down", "up"] = Field(description="Lower the LR (divergence) or raise it (plateau).")
    factors: Optional[list[float]] = Field(
        default=None, description="LR multipliers to try, in order; default x0.1..x1e-5 down, x10..x1e5 up.")


class InitSearchParams(Params):
    steps: int = Field(default=40, ge=1, le=100_000)
    inits: list[InitKind] = Field(default_factory=lambda: ["default", "kaiming", "xavier", "scaled"],
                                  description="Initialisations to restart from, in order.")
    init_scale: float = Field(default=0.1, gt=0, description="Weight scale of the `scaled` init.")
    against: Optional[str] = Field(
        default=None, description="The replay from setup()'s own init (the run as it was, restarted).",
        json_schema_extra={"node_runs": ["replay"]})
    margin: float = Field(default=DEFAULT_MARGIN, gt=0, le=1)
    level_margin: float = Field(default=DEFAULT_LEVEL_MARGIN, gt=0, le=1)
    extend_to: int = Field(default=0, ge=0, le=100_000, description="As the replay's.")
    init_of: Optional[str] = Field(
        default=None, description="The init_loss node that measured whether setup()'s init is PyTorch's default "
                                  "scheme (else measured here).", json_schema_extra={"node_runs": "init_loss"})


def lr_search(ctx: Context, p: LrSearchParams) -> LrSearchOutcome:
    """Replays at each LR multiplier until one works and the next is no better (or the grid ends); when
    none works but the best beat the run, one more between it and the next higher LR."""
    base = p.model_dump(exclude={"direction", "factors"})
    ctx.restart()
    checkpoint_lrs = _lrs(ctx.session.setup.optimizer)  # as restored, before any trial scales it

    def params_at(factor: float) -> ReplayParams:
        return ReplayParams(**{**base, "lr_scale": p.lr_scale * factor})

    measure = _trial_of(params_at)

    def bar(earlier, factor: float):
        return _bar(ctx, params_at(factor), earlier, _lr_setting, factor)

    trials = run_trials(ctx, p.factors or LR_FACTORS[p.direction], measure, bar,
                        lambda so_far: judge.settled(so_far, p.direction))
    between = judge.between(trials, p.direction)
    if between is not None:
        trials.append((between, measure(ctx, between, bar(trials, between))))
    factor, chosen = judge.choose(trials)
    settings = [_lr_setting(f) for f, _ in trials]
    owner, alone = _whose_lr(ctx, base, p.lr_scale * factor, chosen) if p.lr_of is None else (None, [])
    settings += [f"{_lr_setting(factor)} of '{name}' alone" for name, _ in alone]
    if owner is not None:
        chosen = dict(alone)[owner]
    least = judge.least_working(trials)
    kind, lr = _scaled(checkpoint_lrs, owner or p.lr_of)
    return LrSearchOutcome(**{**chosen.model_dump(), "lr_factor": factor}, lr_owner=owner,
                           least_working_factor=least, optimizer_kind=kind,
                           least_working_lr=None if least is None or lr is None else lr * least * p.lr_scale,
                           chosen=_lr_setting(factor) + (f" of '{owner}'" if owner else ""),
                           trials=[_trial(s, o) for s, o in zip(settings, [o for _, o in trials + alone])])


def _lrs(optimizer: torch.optim.Optimizer) -> dict[str, tuple[str, float]]:
    """Each optimizer's class and the LR of its first param group, by name ("" for a single optimizer)."""
    named = dict(getattr(optimizer, "optimizers", {})) or {"": optimizer}
    return {name: (type(o).__name__, float(o.param_groups[0]["lr"])) for name, o in named.items()
            if o.param_groups and isinstance(o.param_groups[0].get("lr"), (int, float))}


def _scaled(lrs: dict[str, tuple[str, float]], name: Optional[str]) -> tuple[Optional[str], Optional[float]]:
    """The class and checkpoint LR of the optimizer a search scales: the one named, the only one, or the
    first of several of one class (scaled together); (None, None) for several of different classes."""
    if name is not None:
        return lrs.get(name, (None, None))
    kinds = {kind for kind, _ in lrs.values()}
    return next(iter(lrs.values())) if len(kinds) == 1 else (None, None)


def _whose_lr(ctx: Context, base: dict, lr_scale: float, chosen: ReplayOutcome) -> tuple[Optional[str], list]:
    """With several optimizers (a GAN's G and D) and a factor that works for all of them together: the factor
    on each one's LR alone. The owner is the one optimizer whose LR alone is the fix (None if none or several:
    then the LRs are changed together)."""
    names = list(getattr(ctx.session.setup.optimizer, "optimizers", {}))
    if len(names) < 2 or not chosen.fix_works or ctx.session.setup.train_step is None:
        return None, []
    alone = []
    for name in names:
        ctx.restart()
        alone.append((name, _trial_replay(ctx, ReplayParams(**{**base, "lr_scale": lr_scale, "lr_of": name}),
                                          race=ctx.race)))
    working = [name for name, outcome in alone if outcome.fix_works]
    return (working[0] if len(working) == 1 else None), alone


def init_search(ctx: Context, p: InitSearchParams) -> SearchOutcome:
    """Restarts from each alternative initialisation, each verified against the run's own init. PyTorch's
    default is left out where setup()'s init is that very scheme: it is the control redrawn, never a fix."""
    inits = [i for i in p.inits if not (i == "default" and _setup_init_is_default(ctx, p.init_of))]

    def params_of(init: str) -> ReplayParams:
        return ReplayParams(steps=p.steps, init=init, init_scale=p.init_scale, against=p.against,
                            margin=p.margin, level_margin=p.level_margin, extend_to=p.extend_to)

    trials = run_trials(ctx, inits, _trial_of(params_of), lambda earlier, init: _bar(ctx, params_of(init), earlier,
                                                                         lambda i: f"init={i}"),
                        lambda so_far: False)  # every init is tried
    init, chosen = judge.choose(trials)
    return SearchOutcome(**chosen.model_dump(), chosen=f"init={init}",
                         trials=[_trial(f"init={i}", o) for i, o in trials])


def _trial_of(params_of):
    """How a search measures the trial at a setting (experiments/lanes.Measure): from the snapshot restored,
    raced as its context says, against `beat`."""
    def measure(trial_ctx: Context, setting, beat) -> ReplayOutcome:
        trial_ctx.restart()
        return _trial_replay(trial_ctx, params_of(setting), race=trial_ctx.race, beat=beat)
    return measure


def _trial_replay(ctx: Context, params: ReplayParams, **race) -> ReplayOutcome:
    """A trial's replay with the judge's reading of it: the search chooses its next trial by it."""
    outcome = replay(ctx, params, **race)
    return outcome.model_copy(update=judged(outcome, margin=params.margin, level_margin=params.level_margin))


def _bar(ctx: Context, params: ReplayParams, trials: list, setting, factor: Optional[float] = None):
    """What the next trial, raced, must end under to change the search's outcome (judge/search.py): once one
    works, end below the best that works; before, where another node reads the search's choice (ctx.race
    off), work or end below every trial so far (the choice when none works). None: not racing."""
    if not ctx.racing:
        return None
    beat = judge.to_beat(trials, setting, factor)
    return beat if beat is not None or ctx.race else judge.to_matter(trials, setting, working_end(ctx, params))


def _setup_init_is_default(ctx: Context, init_of: Optional[str]) -> bool:
    """As the init_loss node `init_of` measured it, else measured here (two calls of setup())."""
    from triage.experiments.init_check import matrix_spreads, same_scheme

    measured = getattr(ctx.outcomes.get(init_of), "setup_init_is_default", None) if init_of else None
    if measured is not None:
        return measured
    own = matrix_spreads(ctx.session.fresh_setup().model)
    return bool(same_scheme(own, matrix_spreads(ctx.session.fresh_setup(default_init=True).model)))


def _lr_setting(factor: float) -> str:
    """`lr x1000`, `lr x0.316`, `lr x1e-05`: three digits at most (a half-decade is irrational)."""
    return f"lr x{float(f'{factor:.3g}'):g}"


def _trial(setting: str, o: ReplayOutcome) -> Trial:
    return Trial(setting=setting, finite=o.finite, loss_end=o.loss_end, improvement=o.improvement,
                 fix_works=o.fix_works, steps_run=o.steps_run, raced_out=o.raced_out)


# A replay's views, the headline naming the trial chosen as what this run changed.
SEARCH_VIEWS = tuple(v.model_copy(update={"setting": "chosen"}) if getattr(v, "headline", False) else v
                     for v in REPLAY_VIEWS) + (
    Table(title="Every trial, in the order run", fields=("trials",),
          columns=("setting", "finite", "loss_end", "improvement", "fix_works", "steps_run")),
)

LR_SEARCH = Experiment(
    name="lr_search",
    summary="Replays at learning rates on a x10 grid (down to x1e-5 or up to x1e5 of the run's), each "
            "verified against the run as it was; keeps the one that works best.",
    params=LrSearchParams,
    outcome=LrSearchOutcome,
    measure=lr_search,
    views=SEARCH_VIEWS,
)

INIT_SEARCH = Experiment(
    name="init_search",
    summary="Restarts the run from alternative initialisations (PyTorch default, Kaiming, Xavier, its own "
            "scaled down), each verified against a restart from its own init.",
    params=InitSearchParams,
    outcome=SearchOutcome,
    measure=init_search,
    views=SEARCH_VIEWS,
)
