"""The replay: the run's own steps from the checkpoint, with one intervention at a time.

Every intervention of the checklist that is "the same steps, but ..." is a parameter here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import numpy as np
import torch
from pydantic import Field, model_validator

from triage.contract import Precision
from triage.experiments.alongside import Alongside, ready_alongside
from triage.experiments.base import Abandoned, Context, Experiment, NotApplicable, Params
from triage.experiments.inits import InitKind, apply_init, stuck_constants
from triage.experiments.dead_units import find_dead_units, revive
from triage.experiments.fingerprint import first_examples
from triage.experiments.interventions import held_at_peak, swap_saturating, unfrozen, unsquash, unsquashed
from triage.experiments.loss_inputs import score_losses
from triage.experiments.label_shift import realigned
from triage.experiments.levels import loss_levels, perfect_loss, val_nothing_level
from triage.experiments.neighbours import NeighbourAgreement, labels_name_groups, neighbour_agreement
from triage.experiments.own_step import Candidate, OwnStep
from triage.experiments.probes import IGNORE_INDEX
from triage.experiments.pace import pace_vs_run
from triage.experiments.same_batches import same_batches_ratio
from triage.experiments.schedule import RunSchedule
from triage.experiments.training import (autocast, current_lr, grad_scaler, loss_value,
                                         param_vector_norm, reference_step, scale_weight_decay,
                                         scored_loss, start_end, trainable, untouched_buffers_and_rng)
from triage.experiments.verify import DEFAULT_LEVEL_MARGIN, DEFAULT_MARGIN, paired_with
from triage.judge.extension import ReferenceFigures, worth_more_steps
from triage.judge.fix import end_of, highest_working_end, sane_level
from triage.judge.levels import below_floor, gap_ratio
from triage.judge.named import DIVERGES_LOSS_RATIO, WEIGHTS_BUSY, WEIGHTS_STILL
from triage.judge.race import Bar, lowest, noise, out_of_contention
from triage.views import Curve, Line
from triage.outcomes.replay import ReplayOutcome
from triage.judge.readings import RISE_WINDOW
from triage.load.loss_terms import scaled_terms, terms_of


class ReplayParams(Params):
    steps: int = Field(default=40, ge=1, le=100_000, description="Optimizer steps to replay.")
    lr_scale: float = Field(default=1.0, gt=0, description="Multiply the learning rate at every step.")
    clip: Optional[float] = Field(default=None, gt=0, description="Global grad-norm clip; None: as the run.")
    clip_scale: float = Field(default=1.0, gt=0, description="Multiply the run's own clip threshold.")
    no_clip: bool = Field(default=False, description="Remove gradient clipping entirely.")
    clip_at_norm_of: Optional[str] = Field(
        default=None, description="Clip at the typical gradient norm (grad_norm_start) a replay node measured: "
                                  "only the spikes above it are cut.", json_schema_extra={"node_runs": "replay"})
    precision: Optional[Precision] = Field(default=None, description="Autocast dtype; None: as the run.")
    subset: Optional[int] = Field(default=None, ge=1, description="Train on the first N examples only.")
    skip_batches: list[int] = Field(default_factory=list, description="Snapshot batch indices to leave out.")
    skip_outliers_of: Optional[str] = Field(
        default=None, description="Leave out the batches a batch_scan node flagged (its node id).",
        json_schema_extra={"node_runs": "batch_scan"})
    skip_nonfinite_of: Optional[str] = Field(
        default=None, description="Leave out the batches whose loss a batch_scan node found non-finite at the "
                                  "checkpoint's weights (its node id).", json_schema_extra={"node_runs": "batch_scan"})
    realign_labels_of: Optional[str] = Field(
        default=None, description="Move the labels back so that each output is trained on the next token, where "
                                  "a label_check node measured them further ahead (its node id).",
        json_schema_extra={"node_runs": "label_check"})
    lr_factor_of: Optional[str] = Field(
        default=None, description="Multiply the lr by the factor an lr_search node chose (its lr_factor): that "
                                  "LR replayed over other steps.", json_schema_extra={"node_runs": "lr_search"})
    lr_scale_from: Optional[str] = Field(
        default=None, description="Multiply the lr by the suggested_ratio an lr_range_test node measured.",
        json_schema_extra={"node_runs": "lr_range_test"})
    hold_peak_of: Optional[str] = Field(
        default=None, description="Hold the LR at the schedule's peak that an lr_trace node measured "
                                  "(the scheduler is not stepped).", json_schema_extra={"node_runs": "lr_trace"})
    wd_scale: float = Field(default=1.0, ge=0, description="Multiply the weight decay (0 removes it).")
    aux_scale: float = Field(default=1.0, ge=0, description="Multiply the loss's auxiliary terms in the gradient "
                                                            "(Setup.auxiliary_terms; 0 removes them). The loss "
                                                            "read is the objective's either way.")
    unfreeze: bool = Field(default=False, description="Train every parameter: requires_grad on, and the "
                                                      "ones the optimizer lacks added to it.")
    unsquash: bool = Field(default=False, description="Undo a squashing output (log of softmax rows, "
                                                      "logit of sigmoid values) before the loss sees it.")
    unsquash_scores: bool = Field(
        default=False, description="Undo the squashing of the scores the run's loss hands a loss on raw scores "
                                   "(binary_cross_entropy_with_logits, cross_entropy), where it receives them.")
    revive_dead: bool = Field(default=False, description="Re-initialise the ReLU units that never fire on the "
                                                         "snapshot (their producing rows), keep the rest.")
    swap_saturating: bool = Field(default=False, description="Replace sigmoid/tanh activations by ReLU (on a "
                                                             "restart only: init other than checkpoint).")
    loop: Literal["auto", "reference", "user"] = Field(
        default="auto", description="Whose step to run. auto: the run's own train_step where it has one (the "
                                    "candidate's change reached inside it), else triage's reference loop.")
    lr_of: Optional[str] = Field(default=None, description="With several optimizers (Setup.optimizers): scale "
                                                           "the LR of this one only (None: all of them).")
    init: InitKind = Field(
        default="checkpoint", description="Start from the checkpoint, from setup() called again (its own "
                                          "init), or from setup()'s model re-initialised: default "
                                          "(reset_parameters), kaiming, xavier, or scaled (its own init x init_scale).")
    init_scale: float = Field(default=0.1, gt=0, description="Weight scale of init=scaled.")
    val_every: int = Field(default=0, ge=0, description="Measure val loss every N steps (0: never).")
    against: Optional[str] = Field(
        default=None, description="The replay node of the run as it was, from the same start: the fix is "
                                  "verified against it.", json_schema_extra={"node_runs": "replay"})
    margin: float = Field(default=DEFAULT_MARGIN, gt=0, le=1,
                          description="Clearly better: the end window at most margin x the reference's.")
    extend_to: int = Field(
        default=0, ge=0, le=100_000,
        description="A fix still improving but not yet verified after `steps`, paired with a run that was "
                    "not improving (flat, rising or non-finite), goes on up to this many steps before it is "
                    "judged: a slow fix is not a wrong one (0: never).")
    level_margin: float = Field(default=DEFAULT_LEVEL_MARGIN, gt=0, le=1,
                                description="Sane: the end window at most level_margin x the loss of "
                                            "learning nothing (a constant prediction).")

    @model_validator(mode="after")
    def _swap_on_a_restart(self) -> "ReplayParams":
        if self.swap_saturating and self.init == "checkpoint":
            raise ValueError("swap_saturating changes the model's layers: use it with init setup/default/"
                             "kaiming/xavier, not the checkpoint's weights")
        return self


@dataclass
class _Trace:
    """What one replay recorded, step by step."""

    start_weights: list[torch.Tensor]
    weight_norm_start: float
    losses: list[float] = field(default_factory=list)
    norms: list[float] = field(default_factory=list)
    rank_losses: list[list[float]] = field(default_factory=list)  # per step, each rank's own loss
    lrs: list[float] = field(default_factory=list)
    val_steps: list[int] = field(default_factory=list)
    val_losses: list[float] = field(default_factory=list)
    first_bad: Optional[int] = None
    first_bad_ranks: list[int] = field(default_factory=list)
    truncated: bool = False
    loop_used: str = "reference"
    loop_note: Optional[str] = None
    not_applicable: list[str] = field(default_factory=list)
    optimizer_steps: Optional[int] = None
    val_final: Optional[float] = None
    val_neighbours: Optional[NeighbourAgreement] = None
    lr_factor: float = 1.0
    scheduler_steps: int = 0
    lr_changed_in: list[str] = field(default_factory=list)
    unknown_optimizers: Optional[str] = None  # train_step stepped an optimizer setup() did not hand triage
    raced_out: Optional[str] = None  # why racing stopped it before its last step (judge/race.py)
    batch_order: list[int] = field(default_factory=list)  # call k trains on snapshot batch batch_order[k % len]
    overflowed: list[bool] = field(default_factory=list)  # per call: a scaler skipped its update
    accumulates: bool = False  # the run's own step took calls that neither stepped nor were skipped
    perfect: Optional[float] = None  # a subset's loss on a perfect prediction, at the start

    def record(self, rows: list[list[float]]) -> tuple[float, float]:
        """One step's (loss, gradient norm, ...) on every rank. The step's figures are their means (a DDP step
        trains on the mean of the ranks' losses); a non-finite value on any rank makes them non-finite,
        so every rank sees the same step and stops at the same one. One process: its own figures."""
        loss = sum(r[0] for r in rows) / len(rows)
        norm = sum(r[1] for r in rows) / len(rows)
        self.losses.append(loss)
        self.norms.append(norm)
        if len(rows) > 1:
            self.rank_losses.append([r[0] for r in rows])
        return loss, norm


def measure(ctx: Context, p: ReplayParams, *, loss_fn=None, race: bool = False,
            beat: Optional[Bar] = None) -> ReplayOutcome:
    """The replay from the restored snapshot, verified against `p.against` when it names one. `loss_fn`,
    when given, trains in place of the run's own (for an experiment that replays on another loss). `race`:
    it may stop once it can no longer work; `beat`: once it can no longer end under that bar (judge/race.py)."""
    session = ctx.session
    loss_levels(session)  # measured (once) at the checkpoint's weights, before this replay moves them
    alongside = _reference_alongside(ctx, p)  # forked now, while nothing is applied yet
    try:
        return _measured(ctx, p, loss_fn, race, beat, alongside)
    finally:
        if alongside is not None:
            alongside.close()


def _measured(ctx: Context, p: ReplayParams, loss_fn, race: bool, beat: Optional[Bar],
              alongside: Optional[Alongside]) -> ReplayOutcome:
    session = ctx.session
    setup = session.setup if p.init == "checkpoint" else session.fresh_setup()
    if loss_fn is not None:
        setup = setup.model_copy(update={"loss_fn": loss_fn})
    if p.swap_saturating:
        swap_saturating(setup.model)
    apply_init(setup.model, p.init, p.init_scale,
               stuck_constants(setup, session.batches[0], session.device) if p.init == "scaled" else frozenset())
    if p.revive_dead:
        revive(find_dead_units(setup, session.batches[:8], session.device), setup.optimizer)
    with contextlib.ExitStack() as undo:  # interventions that change the user's objects are put back
        if p.unfreeze:
            undo.enter_context(unfrozen(setup.model, setup.optimizer, setup.scheduler))
        if p.unsquash:
            undo.enter_context(unsquashed(setup.model))
        if p.unsquash_scores:
            undo.enter_context(score_losses(unsquash))
        peak_ratio = undo.enter_context(held_at_peak(setup.optimizer, ctx.outcomes.get(p.hold_peak_of))) \
            if p.hold_peak_of else None
        own = _own_loop(setup, p, other_loss=loss_fn is not None)
        trace, clip, skip = _run(ctx, p, setup, peak_ratio, lambda t: _worth_extending(t, ctx, p, alongside), own,
                                 _contention(ctx, p, beat, race) if race or beat is not None else None)
    if trace.unknown_optimizers:  # not a controlled experiment: that optimizer's state is never restored
        raise NotApplicable(trace.unknown_optimizers + ".")
    if trace.not_applicable:  # not tried: neither a fix nor ruled out
        raise NotApplicable("The run's own train_step does not let this candidate in: "
                            + "; ".join(trace.not_applicable) + ".")
    outcome = _summarise(trace, setup.model, clip, skip, ctx, p)
    still_or_busy = outcome.update_ratio is not None and (outcome.update_ratio < WEIGHTS_STILL
                                                          or outcome.update_ratio >= WEIGHTS_BUSY)
    if still_or_busy and _scored_as_trained(p, loss_fn):
        outcome = outcome.model_copy(update={"same_batches_ratio": same_batches_ratio(
            session, setup, trace.start_weights, trace.batch_order, len(trace.losses))})
    # A restart's fresh model, its moments and its start weights, freed before a longer reference replay
    # (below) builds a model of its own: held, two restarts' state would be alive at once.
    del setup, trace
    return _over_the_same_steps(ctx, p, outcome, alongside)


def _over_the_same_steps(ctx: Context, p: ReplayParams, outcome: "ReplayOutcome",
                         alongside: Optional[Alongside] = None) -> "ReplayOutcome":
    """A fix that went on past the length of the run it is paired with (`extend_to`) is verified against
    that run replayed as long, once per reference and length: an end at step 120 set against the
    reference's end at step 40 credits the fix with 80 steps of training the reference never had (a run
    still warming up gains most of all). Replayed alongside the fix where a copy of this process did it."""
    reference = _longer_reference(ctx, p)
    if reference is None or outcome.steps_run <= reference[0].steps_run:
        return outcome
    key = _reference_key(p, outcome.steps_run)

    def longer() -> ReplayOutcome:
        found = alongside.result() if alongside is not None and alongside.key == key else None
        return found if found is not None else _replayed_as_long(ctx, reference[1], outcome.steps_run)

    extended = ctx.session.memoised(key, longer)
    own = NeighbourAgreement(outcome.val_neighbours, outcome.val_neighbour_examples or 0) \
        if outcome.val_neighbours is not None else None
    return outcome.model_copy(update=paired_with(reference=extended, against=p.against, levels=loss_levels(ctx.session),
                                                 val_end=outcome.val_final, neighbours=own)
                              | {"search_speedup": _search_speedup(ctx, p, extended)})


def _search_speedup(ctx: Context, p: ReplayParams, reference: "ReplayOutcome") -> Optional[float]:
    """Trained at the LR a search chose (`lr_factor_of`): the step at which the run, replayed as long as this
    replay (`reference`), first reaches the loss the search's trial ended at (its running median, as a rise is
    read), over the trial's steps; None where it never does, or no search is read."""
    search = ctx.outcomes.get(p.lr_factor_of) if p.lr_factor_of else None
    if search is None or not search.finite or search.loss_end is None or not search.steps_run:
        return None
    smoothed = _running_median(reference.losses)
    reached = next((step for step, loss in enumerate(smoothed, 1) if loss <= search.loss_end), None)
    return reached / search.steps_run if reached is not None else None


def _own_loop(setup, p: ReplayParams, other_loss: bool) -> tuple[bool, Optional[str]]:
    """Whether the run's own train_step drives this replay, and, where it has one but does not, why."""
    if p.loop == "reference" or setup.train_step is None:
        return False, None
    if other_loss:
        if p.loop == "user":
            raise ValueError("a replay on another loss runs triage's reference loop: the run's train_step "
                             "computes its own loss")
        return False, ("this replay trains on another loss than the run's, which its train_step cannot take: "
                       "it ran on triage's reference loop (zero_grad, forward, backward, step) with loss_fn")
    return True, None


def working_end(ctx: Context, p: ReplayParams) -> Optional[float]:
    """The highest end window at which this replay could still work against its reference (None: no reference,
    or any end could)."""
    reference = ctx.outcomes.get(p.against) if p.against else None
    if reference is None:
        return None
    return highest_working_end(reference_end=end_of(reference.finite, reference.loss_end),
                               levels=loss_levels(ctx.session), margin=p.margin, level_margin=p.level_margin)


def _contention(ctx: Context, p: ReplayParams, beat: Optional[Bar], work: bool):
    """The check that stops a raced replay once it is out of contention: once it cannot work (`work`), or
    cannot end under `beat` (None: nothing to race against, as without a reference)."""
    reference = ctx.outcomes.get(p.against) if p.against else None
    if reference is None:
        return None
    working = working_end(ctx, p) if work else None
    bar = lowest([Bar(working, f"work against '{p.against}'") if working is not None else None, beat])
    if bar is None:
        return None
    run_noise = noise(getattr(reference, "losses", []))

    def extendable(start: float, end: float) -> bool:
        return _extendable(start, end, reference, ctx, p)
    level, kind = sane_level(loss_levels(ctx.session), None, p.level_margin)
    # Paired only with a reference that ran finite and held its level (its end within DIVERGES_LOSS_RATIO of its
    # start either way: a stall, a slow fall), where its batches' spread is what hides a candidate's gain; a
    # run falling from a blow-up varies too widely for a gap to it to mean anything.
    ratio = getattr(reference, "loss_ratio", None)
    paired = list(reference.losses) if (_batches_as_the_run(p) and getattr(reference, "finite", False)
                                        and ratio is not None
                                        and 1 / DIVERGES_LOSS_RATIO <= ratio <= DIVERGES_LOSS_RATIO) else []
    return lambda losses: out_of_contention(losses, steps=p.steps, extend_to=p.extend_to, bar=bar,
                                            run_noise=run_noise, extendable=extendable,
                                            restart=p.init != "checkpoint",
                                            learned_nothing=level if kind != "start" else None, paired=paired)


def _batches_as_the_run(p: ReplayParams) -> bool:
    """From the checkpoint, on the run's batches in the run's order, scored by the run's loss: its steps pair
    with its reference's one by one (judge/race.py also checks that their first losses agree)."""
    return (p.init == "checkpoint" and not p.subset and not p.skip_batches and not p.skip_outliers_of
            and not p.skip_nonfinite_of and not p.realign_labels_of and not p.unsquash and not p.unsquash_scores)


def _longer_reference(ctx: Context, p: ReplayParams) -> Optional[tuple["ReplayOutcome", ReplayParams]]:
    """The replay this one is paired with, and its parameters, where a longer one of it can be measured."""
    reference = ctx.outcomes.get(p.against) if p.against else None
    reference_params = ctx.params.get(p.against) if p.against else None
    if reference is None or not isinstance(reference_params, ReplayParams) or not reference.finite:
        return None
    return reference, reference_params


def _reference_key(p: ReplayParams, steps: int) -> str:
    return f"replay {p.against} over {steps} steps"


def _replayed_as_long(ctx: Context, reference_params: ReplayParams, steps: int) -> ReplayOutcome:
    ctx.restart()
    return measure(ctx, reference_params.model_copy(update={"steps": steps, "extend_to": 0}))


def _reference_alongside(ctx: Context, p: ReplayParams) -> Optional[Alongside]:
    """Where this replay may go on past its reference (`extend_to`), a copy of this process, forked before the
    replay changes anything, ready to replay the reference as long the moment it does (experiments/alongside.py).
    The copy shows no progress: the replay in this process does."""
    reference = _longer_reference(ctx, p)
    if reference is None or p.extend_to <= max(p.steps, reference[0].steps_run):
        return None
    # (abandon: this process's question, which reads its pipes to the other copies; never the copy's)
    quiet = dataclasses.replace(ctx, progress=lambda done, total: None, abandon=None)
    return ready_alongside(ctx.session, _reference_key(p, p.extend_to),
                           lambda: _replayed_as_long(quiet, reference[1], p.extend_to))


def _worth_extending(trace: "_Trace", ctx: Context, p: ReplayParams, alongside: Optional[Alongside] = None) -> bool:
    """After `steps`: whether the judge gives this fix, not verified yet, more steps (judge/extension.py). Where it
    does, the reference's replay as long starts alongside."""
    reference = ctx.outcomes.get(p.against) if p.against else None
    if reference is None or p.extend_to <= p.steps or trace.first_bad is not None:
        return False
    worth = _extendable(*start_end(trace.losses), reference, ctx, p)
    if worth and alongside is not None:
        alongside.start()
    return worth


def _extendable(start: Optional[float], end: Optional[float], reference, ctx: Context, p: ReplayParams) -> bool:
    figures = ReferenceFigures(finite=reference.finite, loss_end=reference.loss_end,
                               loss_ratio=reference.loss_ratio, level_ratio=reference.level_ratio)
    return worth_more_steps(start=start, end=end, reference=figures, levels=loss_levels(ctx.session),
                            margin=p.margin, level_margin=p.level_margin)


def _run(ctx: Context, p: ReplayParams, setup, peak_ratio: Optional[float], keep_going,
         own: tuple[bool, Optional[str]] = (False, None), contention=None):
    session = ctx.session
    model, optimizer = setup.model, setup.optimizer
    held = peak_ratio is not None  # a held LR does not follow the schedule
    precision = p.precision or setup.precision
    clip = None if p.no_clip else (p.clip if p.clip is not None else setup.grad_clip)
    if p.clip_at_norm_of:
        clip = _typical_norm(ctx, p.clip_at_norm_of)
    clip = clip * p.clip_scale if clip is not None else None
    scaler = grad_scaler(setup, precision, session.device)
    skip = sorted(set(p.skip_batches) | set(_flagged_batches(ctx, p.skip_outliers_of))
                  | set(_flagged_batches(ctx, p.skip_nonfinite_of, "nonfinite_batches")))
    order = [i for i in range(len(session.batches)) if i not in skip] or [0]  # the snapshot batch of each call
    batches = [session.batches[i] for i in order]
    if p.subset:
        order, batches = order[:1], [first_examples(batches[0], p.subset)]
    val_batches = session.val_batches
    if p.realign_labels_of:
        batches, val_batches = (_realigned(ctx, p.realign_labels_of, b) for b in (batches, val_batches))
    lr_scale = p.lr_scale * _suggested_ratio(ctx, p.lr_scale_from) * _chosen_factor(ctx, p.lr_factor_of) \
        * (peak_ratio or 1.0)
    user, note = own[0] or p.loop == "user", own[1]
    names = list(getattr(optimizer, "optimizers", {}))
    if p.lr_of is not None and p.lr_of not in names:
        raise ValueError(f"expected lr_of to name one of the run's optimizers {names or '(it has one, unnamed)'}, "
                         f"found '{p.lr_of}'; name one of Setup.optimizers, or leave lr_of out")
    trace = _Trace(start_weights=_start_weights(session, setup, p), weight_norm_start=param_vector_norm(model),
                   loop_used="user" if user else "reference", loop_note=note,
                   lr_factor=lr_scale / (peak_ratio or 1.0),
                   lr_changed_in=([p.lr_of] if p.lr_of else names) if lr_scale != 1.0 else [], batch_order=order)
    if not user and p.lr_of is not None:
        trace.not_applicable.append(f"the LR of '{p.lr_of}' alone: only the run's own train_step steps "
                                    "optimizers one by one")
    if user and setup.manual_update and lr_scale != 1.0 and not optimizer.declared:
        trace.not_applicable.append("the LR: train_step updates the weights itself and setup() declares no "
                                    "manual_lr")
    if user and setup.manual_update and p.wd_scale != 1.0:
        trace.not_applicable.append("the weight decay: train_step updates the weights itself, with no "
                                    "optimizer whose param groups hold a weight decay")
    if p.aux_scale != 1.0 and (user or terms_of(setup) is None):
        trace.not_applicable.append("the loss's auxiliary terms: " + (
            "the run's own train_step computes its loss itself" if user
            else "Setup.auxiliary_terms names none"))
    if trace.not_applicable:
        return trace, clip, skip
    if p.subset:
        trace.perfect = _perfect_on(ctx, setup, batches)
    scale_weight_decay(optimizer, p.wd_scale)
    schedule = RunSchedule(None if held else setup.scheduler, setup.scheduler_interval, setup.steps_per_epoch,
                           getattr(session.checkpoint, "step", None))
    params = trainable(model)
    with contextlib.ExitStack() as stack:
        stack.enter_context(scaled_terms(setup, p.aux_scale))
        if user:
            candidate = Candidate(lr_scale=lr_scale, lr_of=p.lr_of, clip=clip,
                                  changes_clip=p.no_clip or p.clip is not None or p.clip_at_norm_of is not None
                                  or p.clip_scale != 1.0, clip_scale=p.clip_scale,
                                  precision=p.precision if p.precision and p.precision != setup.precision else None)
            step_own = stack.enter_context(OwnStep(setup, candidate, params, session.device).installed())
            trace.optimizer_steps = 0
        else:
            model.train()  # the user's loop keeps whatever mode it sets: that may be the bug
        _steps(ctx, p, setup, batches, val_batches, trace, keep_going, schedule, lr_scale, contention,
               own=step_own if user else None,
               reference=lambda batch: reference_step(setup, batch, precision, clip, scaler, session.device,
                                                      params, lr_scale),
               scaler_free=scaler is None, watched=setup.scaler if user else scaler)
        if user:
            trace.not_applicable += step_own.unreached(len(trace.losses))
            trace.unknown_optimizers = step_own.unknown_optimizers()
    trace.scheduler_steps = schedule.scheduler_steps
    if val_batches and trace.first_bad is None and not trace.truncated:
        trace.val_final = ctx.ranks.mean(_val_loss(setup, val_batches[:VAL_BATCHES], precision, session.device))
        if labels_name_groups(session):  # the same on every rank; each rank's share averaged, so all judge alike
            found = neighbour_agreement(setup, val_batches[:VAL_BATCHES], session.device)
            if ctx.ranks.all(found is not None):
                trace.val_neighbours = NeighbourAgreement(ctx.ranks.mean(found.agreement),
                                                          round(ctx.ranks.mean(found.examples)))
    return trace, clip, skip


def _realigned(ctx: Context, node: str, batches: list) -> list:
    """The batches with their labels moved back to next-token prediction, as label_check `node` measured them."""
    found = ctx.outcomes.get(node)
    ahead = getattr(found, "predicts_ahead", None)
    if ahead is None or ahead <= 1 or not found.target:
        raise NotApplicable(f"'{node}' measured no labels beyond the next token to move back.")
    return [realigned(b, found.target, ahead, IGNORE_INDEX) for b in batches]


# Validation batches a replay's end is measured on: enough to see generalisation, cheap beside 40 steps.
VAL_BATCHES = 8


def _steps(ctx: Context, p: ReplayParams, setup, batches, val_batches, trace: "_Trace", keep_going,
           schedule: RunSchedule, lr_scale: float, contention, own: Optional[OwnStep], reference, scaler_free: bool,
           watched: Any = None) -> None:
    """The replay's steps, one batch each, until `p.steps` (or `extend_to`) steps, the first non-finite loss,
    the budget, or, raced (`contention`), the step at which it can no longer change the verdict. Each is the
    run's own train_step (`own`) or the reference step; the scheduler is stepped after each optimizer step,
    as the run stepped it, unless the run's step stepped it itself.

    With the run's own step, `steps` counts its optimizer steps (a loop that accumulates k micro-batches
    is called k times a step, at most MAX_CALLS_PER_STEP), so every replay trains as many updates as the
    reference loop would; a loop that has not stepped yet counts its calls (one that never steps stops
    after `steps` calls). The figures per step are per call."""
    session, optimizer = ctx.session, setup.optimizer
    over_budget = ctx.out_of_time()
    target, asked_to_extend, call = max(p.steps, p.extend_to), False, 0
    while call < target * MAX_CALLS_PER_STEP:
        done = trace.optimizer_steps if own is not None and trace.optimizer_steps else call
        if done >= p.steps and not asked_to_extend:
            asked_to_extend = True
            if not keep_going(trace):
                break
        if done >= target:
            break
        if over_budget:  # the walk's ceiling (--max-minutes), on some rank: cut, not measured to its end
            trace.truncated = ctx.cut = True
            break
        if ctx.abandon is not None and ctx.abandon():
            raise Abandoned
        batch = batches[call % len(batches)]
        stepped, scale = True, _scale_of(watched)  # (the run's own step: whether it reached optimizer.step())
        if own is not None:
            figures = own(batch)
            loss, norm, stepped = figures.loss, figures.norm, figures.stepped
            trace.lrs.append(figures.lr)
            trace.optimizer_steps += figures.stepped
            if figures.stepped and not figures.scheduler_stepped_by_loop:
                schedule.after_step(loss)
        else:
            trace.lrs.append(current_lr(optimizer) * lr_scale)
            loss, norm = reference(batch)
            schedule.after_step(loss)
        call += 1
        # One collective a step: every rank's figures, and whether any rank is past the ceiling.
        rows = ctx.ranks.gather_floats((loss, norm, float(ctx.past_budget())))
        loss, norm = trace.record(rows)
        trace.overflowed.append(_skipped(scale, _scale_of(watched), loss, norm, stepped, own is not None))
        trace.accumulates |= own is not None and not stepped and not trace.overflowed[-1]
        over_budget = any(row[2] for row in rows)
        if p.val_every and val_batches and call % p.val_every == 0:
            trace.val_steps.append(call)
            trace.val_losses.append(ctx.ranks.mean(_val_loss(setup, val_batches, p.precision or
                                                             setup.precision, session.device)))
        ctx.progress(min(done + 1, target), max(p.steps, done + 1))
        # Under a GradScaler an inf gradient is routine (the step is skipped); elsewhere it is fatal.
        # The run's own step may hold a scaler triage does not see: there a finite loss is what counts.
        fatal_norm = scaler_free and own is None and not math.isfinite(norm)
        if not math.isfinite(loss) or fatal_norm:
            trace.first_bad = call - 1
            trace.first_bad_ranks = _nonfinite_ranks(rows, scaler_free) if len(rows) > 1 else []
            break
        # The losses are every rank's mean: every rank stops at the same step.
        if contention is not None and (reason := contention(trace.losses)) is not None:
            trace.raced_out = reason
            break


MAX_CALLS_PER_STEP = 64  # calls of the run's own step per optimizer step at most (gradient accumulation)


def _scale_of(scaler: Any) -> Optional[float]:
    """A GradScaler's scale now (None: no scaler, or one that is off)."""
    return float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else None


def _skipped(scale_before: Optional[float], scale_after: Optional[float], loss: float, norm: float,
             stepped: bool, own: bool) -> bool:
    """A GradScaler skipped this step's update because its gradient overflowed: its scale dropped (update()
    halves it after a skipped step). With no scaler triage can see, the run's own step that left a
    non-finite gradient and never reached optimizer.step() (a scaler of its own, or a hand-written guard)."""
    if scale_before is not None and scale_after is not None:
        return scale_after < scale_before
    return own and not stepped and math.isfinite(loss) and not math.isfinite(norm)


def _start_weights(session, setup, p: ReplayParams) -> list[torch.Tensor]:
    """The weights the replay starts from, to measure how far it moved them: the snapshot's own copy
    when it starts from the checkpoint as restored (no second copy of the model in memory), else a copy."""
    if setup.model is session.setup.model and not p.revive_dead:
        saved = session.snapshot.model
        names = [name for name, _ in setup.model.named_parameters()]
        if all(name in saved for name in names):
            return [saved[name] for name in names]
    return [q.detach().clone() for q in setup.model.parameters()]


def _nonfinite_ranks(rows: list[list[float]], norms_count: bool) -> list[int]:
    """The ranks where a step went non-finite: those whose own loss did (the origin: under DDP every
    rank's gradient is non-finite once one rank's is), else those whose gradient norm did."""
    by_loss = [r for r, row in enumerate(rows) if not math.isfinite(row[0])]
    return by_loss or ([r for r, row in enumerate(rows) if not math.isfinite(row[1])] if norms_count else [])


def _measured_by(ctx: Context, node: Optional[str], field: str, what: str) -> float:
    """A positive figure an earlier node measured (1.0 where no node is named); a replay that reads one
    its node did not measure cannot run as asked."""
    if node is None:
        return 1.0
    value = getattr(ctx.outcomes.get(node), field, None)
    if not value or not math.isfinite(value) or value <= 0:
        raise NotApplicable(f"node '{node}' measured no {what}")
    return float(value)


def _suggested_ratio(ctx: Context, node: Optional[str]) -> float:
    return _measured_by(ctx, node, "suggested_ratio", "suggested_ratio to scale the lr by")


def _chosen_factor(ctx: Context, node: Optional[str]) -> float:
    return _measured_by(ctx, node, "lr_factor", "LR factor it chose, to replay")


def _typical_norm(ctx: Context, node: str) -> float:
    return _measured_by(ctx, node, "grad_norm_start", "typical gradient norm to clip at")


# Margins a perfect classifier's prediction is tried at: the least loss of them is the floor a subset is read
# against (a label-smoothed cross-entropy over 1000 classes scores 1.04 at 10, 3.0 at 30).
SUBSET_MARGINS = (5.0, 10.0, 20.0, 30.0)


def _perfect_on(ctx: Context, setup: Any, batches: list[Any]) -> Optional[float]:
    """The loss of a perfect prediction of `batches`, the same on every rank (their mean; None on all where
    one rank could not build it). Its forwards draw no random numbers the replay would."""
    with untouched_buffers_and_rng(setup.model):
        mine = perfect_loss(setup, batches, loss_levels(ctx.session).kind, SUBSET_MARGINS)
    every = ctx.ranks.gather(mine)
    return None if None in every else sum(every) / len(every)


def _flagged_batches(ctx: Context, node: Optional[str], field: str = "outliers") -> list[int]:
    if node is None:
        return []
    scan = ctx.outcomes.get(node)
    return list(getattr(scan, field, []) or [])


@torch.no_grad()
def _val_loss(setup, val_batches, precision, device) -> float:
    with autocast(precision, device):
        values = [loss_value(scored_loss(setup, b)) for b in val_batches]
    return float(np.mean(values))


def _summarise(t: _Trace, model: torch.nn.Module, clip: Optional[float], skipped: list[int],
               ctx: Context, p: ReplayParams) -> ReplayOutcome:
    finite_losses = [x for x in t.losses if math.isfinite(x)]
    finite_norms = [x for x in t.norms if math.isfinite(x)]
    start, end = start_end(finite_losses)
    norm_start, _ = start_end(finite_norms)
    with torch.no_grad():
        moved = torch.stack([(q.detach() - w.to(q.device)).float().norm()
                             for q, w in zip(model.parameters(), t.start_weights)])
    weight_norm_end = param_vector_norm(model)
    ended_finite = ctx.ranks.all(math.isfinite(weight_norm_end))  # on every rank, so all judge alike
    weights_finite = ended_finite and t.weight_norm_start > 0
    finite = t.first_bad is None and ended_finite
    levels = loss_levels(ctx.session)
    nothing = levels.nothing_learned
    slope, slope_se = _log_trend(finite_losses)
    neighbours = t.val_neighbours if t.val_final is not None and math.isfinite(t.val_final) else None
    return ReplayOutcome(
        **paired_with(reference=ctx.outcomes.get(p.against), against=p.against, levels=levels, val_end=t.val_final,
                      neighbours=neighbours),
        loop_used=t.loop_used, loop_note=t.loop_note,
        optimizer_steps=t.optimizer_steps, scheduler_steps=t.scheduler_steps, lr_changed_in=t.lr_changed_in,
        lr_factor=t.lr_factor,
        nothing_level=nothing, loss_floor=levels.floor,
        val_nothing_level=val_nothing_level(ctx.session) if t.val_losses else None,
        below_floor=below_floor(levels, min(finite_losses) if finite_losses else None),
        level_ratio=end / nothing if end is not None and nothing and nothing > 0 and finite else None,
        perfect_loss=t.perfect, perfect_gap_ratio=gap_ratio(start, end, t.perfect) if finite else None,
        pace_vs_run=pace_vs_run(ctx.session, finite_losses, nothing) if finite and p.init == "checkpoint" else None,
        steps_run=len(t.losses), losses=t.losses, grad_norms=t.norms, lrs=t.lrs,
        val_steps=t.val_steps, val_losses=t.val_losses, skipped=skipped, **_overflows(t),
        finite=finite,
        first_nonfinite_step=t.first_bad, truncated=t.truncated, first_nonfinite_ranks=t.first_bad_ranks,
        raced_out=t.raced_out,
        rank_loss_end=[start_end(list(column))[1] for column in zip(*t.rank_losses)],
        loss_start=start, loss_end=end,
        loss_ratio=_ratio(start, end) if t.first_bad is None else None,
        loss_min=min(finite_losses) if finite_losses else None,
        loss_max=max(finite_losses) if finite_losses else None,
        log_slope=slope, log_slope_se=slope_se, fall_kept=_fall_kept(finite_losses),
        max_rise=_max_rise(finite_losses, start),
        max_grad_norm=max(finite_norms) if finite_norms else None,
        median_grad_norm=float(np.median(finite_norms)) if finite_norms else None,
        grad_norm_start=norm_start,
        clip_threshold=clip,
        clipped_fraction=sum(n > clip for n in finite_norms) / len(finite_norms) if clip and finite_norms else 0.0,
        weight_norm_ratio=weight_norm_end / t.weight_norm_start if weights_finite else None,
        update_ratio=float(moved.norm().item()) / t.weight_norm_start if weights_finite else None,
        val_ratio=t.val_losses[-1] / min(t.val_losses) if t.val_losses and min(t.val_losses) > 0 else None,
        val_start=t.val_losses[0] if t.val_losses else None,
        val_end=t.val_losses[-1] if t.val_losses else None,
        val_noise=_noise(t.val_losses),
        val_final=t.val_final if t.val_final is not None and math.isfinite(t.val_final) else None,
        val_neighbours=neighbours.agreement if neighbours else None,
        val_neighbour_examples=neighbours.examples if neighbours else None,
    )


def _noise(values: list[float]) -> Optional[float]:
    """The step-to-step noise of a series, blind to its trend and to a turn in it: the median absolute second
    difference over 1.65 (for white noise of standard deviation s it is about 1.65 s; a straight line or a
    smooth U scores about 0). None under four values."""
    if len(values) < 4 or not all(math.isfinite(v) for v in values):
        return None
    return float(np.median(np.abs(np.diff(values, n=2)))) / 1.65


def _scored_as_trained(p: ReplayParams, loss_fn) -> bool:
    """The replay trained the checkpoint's model on the run's own loss, batches and precision, with nothing put
    in the model that is taken out after it (so loss_fn, called after it, scores what it trained on)."""
    return (p.init == "checkpoint" and loss_fn is None and p.precision is None and not p.subset
            and not p.realign_labels_of and not p.unsquash and not p.unsquash_scores and p.aux_scale == 1.0
            and not p.swap_saturating and not p.revive_dead and not p.unfreeze)


def _fall_kept(losses: list[float]) -> Optional[float]:
    """The loss's fall over the second half of the steps over its fall over the first (medians of the first,
    middle and last fifth): about 1 or more for a loss that falls at a steady or growing pace, well under 1
    for one that slows as it settles; inf where it falls only in the second half; None where it did not fall
    over the second half either, or over under 10 steps."""
    if len(losses) < 10:
        return None
    k = len(losses) // 5
    middle = len(losses) // 2 - k // 2
    first, mid, last = (float(np.median(part)) for part in (losses[:k], losses[middle:middle + k], losses[-k:]))
    if first > mid:
        return (mid - last) / (first - mid)
    return math.inf if last < mid else None


def _overflows(t: _Trace) -> dict:
    """The steps a scaler skipped, and the batches skipped on every pass: a scaler's own calibration
    overflows a step now and then; a batch that overflows each time it comes round is one the run never
    learns from. Under gradient accumulation a skip shows at the micro-batch that stepped, not at the one
    that overflowed, so no batch is named there."""
    steps = [k for k, skipped in enumerate(t.overflowed) if skipped]
    passes: dict[int, list[bool]] = {}
    for k, skipped in enumerate(t.overflowed):
        passes.setdefault(t.batch_order[k % len(t.batch_order)], []).append(skipped)
    batches = [] if t.accumulates else sorted(b for b, overflowed in passes.items()
                                              if len(overflowed) >= 2 and all(overflowed))
    return dict(overflow_steps=steps, overflow_count=len(steps), overflowing_batches=batches)


def _ratio(start: Optional[float], end: Optional[float]) -> Optional[float]:
    """How much the loss moved, as a share of its start: end / start where the start is positive, the same
    share of its size where it is negative (-0.41 -> -0.17 is a rise by 59%: 1.59)."""
    if start is None or end is None or start == 0:
        return None
    return end / start if start > 0 else 1 + (end - start) / abs(start)


def _log_trend(losses: list[float]) -> tuple[Optional[float], Optional[float]]:
    """The slope of a line fitted to ln(loss) per step, and its standard error (the residuals' scatter over
    the spread of the steps); (None, None) with fewer than 3 positive losses."""
    positive = [x for x in losses if x > 0]
    if len(positive) < 3:
        return None, None
    steps, logs = np.arange(len(positive)), np.log(positive)
    slope, intercept = np.polyfit(steps, logs, 1)
    residuals = logs - (slope * steps + intercept)
    spread = float(((steps - steps.mean()) ** 2).sum())
    return float(slope), float(np.sqrt((residuals ** 2).sum() / (len(positive) - 2) / spread))




def _running_median(losses: list[float]) -> list[float]:
    """The median of each loss and the RISE_WINDOW - 1 before it: one hard minibatch moves it not at all."""
    return [float(np.median(losses[max(0, t - RISE_WINDOW + 1):t + 1])) for t in range(len(losses))]


def _max_rise(losses: list[float], scale: Optional[float]) -> Optional[float]:
    """max_t (m_t - min_{s<t} m_s) / scale, on m = the running median of the last 5 losses.

    A spike measured against where the replay began, so that a healthy run whose loss nears zero
    does not count its noise as spikes; on a running median, so that one hard minibatch among easy
    ones is not a spike either.
    """
    if len(losses) < 2 or not scale or scale <= 0:
        return None
    smooth = _running_median(losses)
    best, rise = smooth[0], 0.0
    for x in smooth[1:]:
        rise = max(rise, x - best)
        best = min(best, x)
    return float(rise / scale)


# What the report draws of a replay (and of every replay-like outcome): each against the run as it was.
REPLAY_VIEWS = (
    Curve(title="Loss per step", field="losses", ylabel="loss", against="reference",
          lines=(Line(field="val_losses", steps="val_steps", step_offset=-1, label="validation loss"),),
          nonfinite_step="first_nonfinite_step", headline=True, start="loss_start", end="loss_end"),
    Curve(title="Gradient norm per step, before clipping", field="grad_norms", ylabel="global grad norm",
          against="reference", threshold="clip_threshold", threshold_label="clip"),
    Curve(title="Learning rate per step", field="lrs", ylabel="learning rate", hide_if_constant=True),
)

REPLAY = Experiment(
    name="replay",
    summary="Replays the run's steps from the checkpoint, with at most a few changes "
            "(lr, clipping, precision, subset, skipped batches, weight decay, whose loop).",
    params=ReplayParams,
    outcome=ReplayOutcome,
    measure=lambda ctx, p: measure(ctx, p, race=ctx.race),
    views=REPLAY_VIEWS,
    idle_without_val=("val_every",),
)
