"""The standard loss for what the model outputs, and the counterfactual that trains on it.

A fault inside `loss_fn` (a softmax before cross_entropy, label_smoothing=0.9 for 0.1, a sigmoid on a
regressor's output, a (B, 1) - (B,) MSE that broadcasts) leaves the model's outputs looking normal:
only training on the standard loss shows it. The standard loss is cross-entropy on the raw scores for
class targets, binary cross-entropy for 0/1 float targets (on the raw outputs as logits, or on them as
probabilities where the model squashes them itself), and MSE on the raw values for other float
targets, read from the model's own output (a forward hook) and the batch's targets.

`standard_loss_swap` replays the run twice from the same start, for the same steps on the same
batches: as it was, and trained on the standard loss. Both are scored by the standard loss at every
step, so the two curves are in one unit, and the fix is verified (triage/judge/fix.py) against
the run as it was, at a level measured in that unit (the label entropy, the target variance).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, Callable, Literal, NamedTuple, Optional

import torch
import torch.nn.functional as F
from pydantic import Field

from triage.experiments.base import Context, Experiment, Params
from triage.experiments.levels import (PROBE_BATCHES, LossLevels, best_constant_loss, binary_constants,
                                       class_prior, constant_loss, loss_levels, regression_target,
                                       target_mean, top_output)
from triage.experiments.neighbours import labels_name_groups
from triage.experiments.probes import IGNORE_INDEX, class_targets, output_gradient
from triage.experiments.replay import ReplayParams
from triage.experiments.replay import measure as replay
from triage.experiments.training import autocast, loss_value, start_end
from triage.experiments.verify import DEFAULT_LEVEL_MARGIN, DEFAULT_MARGIN, paired_with
from triage.views import Curve, Line
from triage.outcomes.standard_loss import Rule, StandardLossOutcome

RULE_WORDS = {"cross_entropy": "cross-entropy on the raw scores",
              "soft_cross_entropy": "cross-entropy on the raw scores against the target distributions",
              "binary_cross_entropy": "binary cross-entropy on the raw outputs as logits",
              "binary_cross_entropy_on_probabilities": "binary cross-entropy on the outputs as probabilities",
              "mse": "MSE on the raw outputs"}
EPS = 1e-7  # probabilities are kept this far from 0 and 1 (BCELoss clamps its log at -100 instead)


def standard_rule(session: Any) -> Optional[Rule]:
    """The standard loss for the session's model and targets: cross-entropy for a classifier whose
    output is one tensor, binary cross-entropy for 0/1 targets (on probabilities when every output at the
    checkpoint lies in [0, 1]: the model applies the sigmoid itself), MSE for a regressor; None when none
    can be read (a structured output such as a Hugging Face ModelOutput computes its own loss, with its
    own label shift) or where the labels name groups of examples, not output columns (a triplet loss on an
    embedding). Decided once per session, so every node holds the run to the same loss."""
    return session.memoised("standard_rule", lambda: _standard_rule(session))


def _standard_rule(session: Any) -> Optional[Rule]:
    if labels_name_groups(session):  # metric learning: the labels are no output's columns, no loss is standard
        return None
    levels = loss_levels(session)
    if levels.kind == "classification" and levels.constant is not None:
        return "cross_entropy"
    if levels.kind == "binary":
        output = top_output(session.setup, session.batches[0])
        squashed = output is not None and bool(((output >= 0) & (output <= 1)).all())
        rule = "binary_cross_entropy_on_probabilities" if squashed else "binary_cross_entropy"
    elif levels.kind == "regression":
        if _distributions(session.batches[:PROBE_BATCHES]):
            return "soft_cross_entropy"
        rule = "mse"
    else:
        return None
    return None if _scores_outputs_against_one_another(session) else rule


def _scores_outputs_against_one_another(session: Any) -> bool:
    """The run's loss does not move when one constant is added to every output of the first batch: its
    gradient on the outputs sums to nothing against its size (to 1e-4), as ListNet's softmax over a query's
    documents or a pairwise ranking loss does, so it scores the outputs against one another, and MSE or BCE,
    which read their level, are no standard for it (a healthy ListNet run drifts its scores' level while its
    ranking holds: the MSE of its outputs rose 2.2 -> 5.1 in 60 steps). A gradient, not a loss compared
    before and after a shift: a sigmoid on a regressor's output saturates, and a shift then moves the loss by
    nothing either, while its gradient, small, pushes every output the same way."""
    grad = output_gradient(session, session.batches[0], None)
    if grad is None:
        return False
    grad = grad.double()
    size = float(grad.abs().sum())
    return size > 0 and math.isfinite(size) and abs(float(grad.sum())) <= 1e-4 * size


def _distributions(batches: list[Any]) -> bool:
    """Every batch's target is a row of K >= 2 probabilities summing to 1 (mixup, label smoothing, a
    teacher's softmax): the loss of such targets is a cross-entropy, whose floor is their entropy, and MSE's
    values say nothing of it."""
    for batch in batches:
        target = regression_target(batch, None)
        if target is None or target.dim() < 2 or target.shape[-1] < 2:
            return False
        rows = target.reshape(-1, target.shape[-1]).float()
        if not bool(((rows >= 0) & (rows <= 1)).all() and ((rows.sum(-1) - 1).abs() <= 1e-3).all()):
            return False
    return True


def standard_loss(rule: Rule, output: Any, batch: Any) -> Optional[torch.Tensor]:
    """The standard loss of one batch's `output` against its targets; None when the shapes do not pair."""
    if not isinstance(output, torch.Tensor) or not output.is_floating_point() or output.dim() < 1:
        return None
    if rule == "cross_entropy":
        y = class_targets(batch)
        k = output.shape[-1]
        if y is None or output.dim() < 2 or y.numel() * k != output.numel():
            return None
        return F.cross_entropy(output.reshape(-1, k).float(), y.reshape(-1).to(output.device).long(),
                               ignore_index=IGNORE_INDEX)
    target = regression_target(batch, output.numel())
    if target is None:
        return None
    if rule == "soft_cross_entropy":
        k = output.shape[-1]
        return F.cross_entropy(output.reshape(-1, k).float(), target.reshape(-1, k).to(output.device).float())
    output, target = output.reshape(-1).float(), target.reshape(-1).to(output.device).float()
    if rule == "binary_cross_entropy":
        return F.binary_cross_entropy_with_logits(output, target)
    if rule == "binary_cross_entropy_on_probabilities":
        return F.binary_cross_entropy(output.clamp(EPS, 1 - EPS), target)
    return F.mse_loss(output, target)


def _own_and_standard(loss_fn: Callable[..., Any], rule: Rule, model: torch.nn.Module,
                      batch: Any) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """The run's own loss of `batch` (its `loss_fn` drives the forward: only it knows how to call the
    model), the model's output (a forward hook) and the standard loss of that output."""
    seen: list[Any] = []
    handle = model.register_forward_hook(lambda module, inputs, output: seen.append(output))
    try:
        own = loss_fn(model, batch)
    finally:
        handle.remove()
    output = seen[0] if seen else None
    standard = standard_loss(rule, output, batch)
    if standard is None:
        raise ValueError(f"the model's output does not pair with the batch's targets for {RULE_WORDS[rule]}")
    return own, output, standard


def scored_by_standard(loss_fn: Callable[..., Any], rule: Rule, *, train_on: Literal["run", "standard"],
                       scores: list[float]) -> Callable[..., Any]:
    """A loss_fn(model, batch) that appends the standard loss of the model's output to `scores` and
    returns the loss to train on: the run's own or the standard one."""
    def loss(model: torch.nn.Module, batch: Any) -> Any:
        own, _, standard = _own_and_standard(loss_fn, rule, model, batch)
        scores.append(loss_value(standard))
        return standard if train_on == "standard" else own
    return loss


def standard_levels(session: Any, rule: Rule) -> LossLevels:
    """The loss of learning nothing in the standard loss's unit: the label entropy (the class frequencies
    as logits) for cross-entropy, the binary entropy (the frequency of 1s, or its logit) for binary
    cross-entropy, the target variance (the mean target) for MSE. Data alone decides it: measured once
    per session."""
    return session.memoised(f"standard_levels:{rule}", lambda: _standard_levels(session, rule))


def _standard_levels(session: Any, rule: Rule) -> LossLevels:
    setup, batches = session.setup, session.batches[:PROBE_BATCHES]
    scorer = setup.model_copy(update={"loss_fn": scored_by_standard(setup.loss_fn, rule, train_on="standard",
                                                                    scores=[])})
    run_levels = loss_levels(session)
    if rule == "cross_entropy":
        prior = class_prior(session.batches, run_levels.num_classes)
        return LossLevels(kind="classification", num_classes=run_levels.num_classes, chance=run_levels.chance,
                          constant=None if prior is None else constant_loss(scorer, batches, prior.log()))
    output = top_output(setup, batches[0])
    mean = None if output is None else target_mean(session.batches, output)
    if mean is None:
        return LossLevels(kind=run_levels.kind)
    if rule == "mse":
        return LossLevels(kind="regression", constant=constant_loss(scorer, batches, mean))
    if rule == "soft_cross_entropy":  # the best constant: the mean target distribution, as logits
        return LossLevels(kind="regression", constant=constant_loss(scorer, batches, mean.clamp_min(EPS).log()))
    return LossLevels(kind="binary", constant=best_constant_loss(scorer, batches, binary_constants(mean)))


class Comparison(NamedTuple):
    own: float  # the run's loss, mean over the batches compared
    standard: float  # the standard loss on the same forwards
    gradient_gap: float  # |d own/d output - d standard/d output| / |d standard/d output|, summed over batches
    weighting_spread: Optional[float]  # how far the run's gradient is from the standard's times a weight per group


# Elements of the output whose standard loss treats them alike: a class's rows (cross-entropy), a column's
# positives or negatives (binary cross-entropy). Where the run's gradient is the standard's times one positive
# weight per group, its loss is the standard one weighted (pos_weight, class weights): a choice, and the
# standard loss wins on its own scale by construction.
class Groups(NamedTuple):
    width: int  # elements per row: a row is one example's scores (cross-entropy) or one element (binary)
    of_rows: torch.Tensor  # each row's group, (rows,)


def _groups(rule: Rule, output: torch.Tensor, batch: Any) -> Optional[Groups]:
    if rule == "cross_entropy":
        labels = class_targets(batch)
        if labels is None or labels.numel() * output.shape[-1] != output.numel():
            return None
        return Groups(output.shape[-1], labels.reshape(-1).to(output.device).long())
    if rule in ("binary_cross_entropy", "binary_cross_entropy_on_probabilities"):
        target = regression_target(batch, output.numel())
        if target is None:
            return None
        columns = torch.arange(output.shape[-1], device=output.device).expand(output.shape)
        return Groups(1, (columns * 2 + (target.reshape(output.shape).to(output.device) > 0.5).long()).reshape(-1))
    return None


def _weighting_spread(g_own: torch.Tensor, g_standard: torch.Tensor, groups: Optional[Groups]) -> Optional[float]:
    """The largest spread of d own / d standard within a group, (max - min) / the larger of the two in size, over
    the elements the standard gradient moves: 0 for one weight per group, under 1 for positive weights, 1 or more
    where the two point different ways; None where no groups are known. Each row is reduced to its least and
    largest ratio first, so a language model's (batch, time, vocabulary) output costs a few copies of itself."""
    if groups is None:
        return None
    g_own = g_own.detach().float().reshape(-1, groups.width)
    g_standard = g_standard.detach().float().reshape(-1, groups.width)
    moved = g_standard.abs() > 1e-6 * g_standard.abs().max()
    ratio = g_own / torch.where(moved, g_standard, torch.ones_like(g_standard))
    if not bool(moved.any()) or bool(torch.isnan(ratio[moved]).any()):  # nothing to read, or NaN: not told
        return None
    if bool(((ratio <= 0) & moved).any()):  # no gradient, or one pointing the other way: no positive weight makes it
        return 1.0
    low = torch.where(moved, ratio, torch.full_like(ratio, math.inf)).amin(-1)
    high = torch.where(moved, ratio, torch.full_like(ratio, -math.inf)).amax(-1)
    rows = moved.any(-1)
    low, high, of_rows = low[rows], high[rows], groups.of_rows[rows]
    of_rows = of_rows - of_rows.min()
    count = int(of_rows.max()) + 1
    low = torch.full((count,), math.inf, device=low.device).scatter_reduce(0, of_rows, low, "amin")
    high = torch.full((count,), -math.inf, device=high.device).scatter_reduce(0, of_rows, high, "amax")
    present = torch.isfinite(low)
    low, high = low[present].double(), high[present].double()
    return float(((high - low) / torch.maximum(high.abs(), low.abs()).clamp_min(1e-12)).max())


def compare_at_checkpoint(session: Any, rule: Rule) -> Comparison:
    """The run's own loss against the standard one at the checkpoint, on the same forwards of the first
    batches (eval mode: no BatchNorm statistics move, no dropout). The gradients they send into the
    model's output tell them apart where their values do not: near a uniform output, a cross-entropy
    with label_smoothing=0.9 has the plain one's value but not its gradient."""
    setup = session.setup
    own_losses, standard_losses, gap, size, spreads = [], [], 0.0, 0.0, []
    was_training = setup.model.training
    setup.model.eval()
    try:
        for batch in session.batches[:PROBE_BATCHES]:
            with autocast(setup.precision, session.device):
                own, output, standard = _own_and_standard(setup.loss_fn, rule, setup.model, batch)
            if not standard.requires_grad:
                raise ValueError("the model's output carries no gradient: nothing to compare the losses by")
            (g_standard,) = torch.autograd.grad(standard, output, retain_graph=True)
            g_own = torch.autograd.grad(own, output, allow_unused=True)[0] \
                if isinstance(own, torch.Tensor) and own.requires_grad else None
            g_own = torch.zeros_like(g_standard) if g_own is None else g_own
            gap += float((g_own.float() - g_standard.float()).norm())
            spreads.append(_weighting_spread(g_own, g_standard, _groups(rule, output, batch)))
            size += float(g_standard.float().norm())
            own_losses.append(loss_value(own))
            standard_losses.append(loss_value(standard))
            # Dropped before the next batch's forward: held across it, this batch's graph (a training
            # step's activations) would be alive beside the next one's.
            del own, output, standard, g_standard, g_own
    finally:
        setup.model.train(was_training)
    return Comparison(own=sum(own_losses) / len(own_losses), standard=sum(standard_losses) / len(standard_losses),
                      gradient_gap=gap / size if size > 0 else math.inf,
                      weighting_spread=None if None in spreads or not spreads else max(spreads))


class StandardLossParams(Params):
    steps: int = Field(default=60, ge=1, le=100_000, description="Optimizer steps of each of the two replays.")
    margin: float = Field(default=DEFAULT_MARGIN, gt=0, le=1,
                          description="Clearly better: the end window at most margin x the run's, both scored "
                                      "by the standard loss.")
    level_margin: float = Field(default=DEFAULT_LEVEL_MARGIN, gt=0, le=1,
                                description="Sane: the end window at most level_margin x the standard loss of "
                                            "learning nothing (label entropy, target variance).")


def measure(ctx: Context, p: StandardLossParams) -> StandardLossOutcome:
    session = ctx.session
    rule = standard_rule(session)
    if rule is None:
        raise ValueError("no standard loss for this model's output: it needs one tensor output, and class "
                         "targets (an integer tensor in the batch) or float targets of the output's size "
                         "(0/1 targets: binary cross-entropy)")
    levels = standard_levels(session, rule)
    steps = ReplayParams(steps=p.steps)
    as_run: list[float] = []
    run = replay(ctx, steps, loss_fn=scored_by_standard(session.setup.loss_fn, rule, train_on="run", scores=as_run))
    ctx.restart()
    fixed = replay(ctx, steps, loss_fn=scored_by_standard(session.setup.loss_fn, rule, train_on="standard",
                                                          scores=[]))
    run_finite = run.finite and all(math.isfinite(x) for x in as_run)
    _, run_end = start_end(as_run)
    reference = SimpleNamespace(finite=run_finite, loss_end=run_end)
    paired = paired_with(reference=reference, against="run", levels=levels)
    nothing = levels.nothing_learned
    return StandardLossOutcome(**{
        **fixed.model_dump(), **paired, "against": None, "rule": rule, "run_losses": as_run,
        "nothing_level": nothing,
        "level_ratio": fixed.loss_end / nothing if fixed.finite and fixed.loss_end is not None and nothing else None})


STANDARD_LOSS_SWAP = Experiment(
    name="standard_loss_swap",
    summary="Replays the run twice from the checkpoint, on its own loss and on the standard loss for its "
            "outputs and targets (cross-entropy on raw scores, binary cross-entropy for 0/1 targets, MSE "
            "on raw values), both scored by the "
            "standard loss: a fault inside loss_fn shows as a run that learns only on the standard one.",
    params=StandardLossParams,
    outcome=StandardLossOutcome,
    measure=measure,
    views=(
        Curve(title="Loss per step, both runs scored by the standard loss", field="losses", ylabel="standard loss",
              label="trained on the standard loss", headline=True, start="loss_start", end="loss_end",
              lines=(Line(field="run_losses", label="the run as it was (its own loss)", style="reference"),),
              nonfinite_step="first_nonfinite_step"),
    ),
)
