"""What the model outputs: raw scores, probabilities or log-probabilities, and how far the loss is from
the floor a cross-entropy on probabilities can reach (the double-softmax bug)."""

from __future__ import annotations

import math
from typing import Optional

import torch
from pydantic import Field

from triage.experiments.base import Context, Experiment, Params
from triage.experiments.interventions import unsquash
from triage.experiments.confident import unstable_when_confident
from triage.experiments.levels import loss_levels
from triage.experiments.loss_inputs import score_losses
from triage.experiments.neighbours import labels_name_groups
from triage.experiments.probes import mean_loss, model_outputs
from triage.experiments.standard_loss import Comparison, compare_at_checkpoint, standard_levels, standard_rule
from triage.batches import named_tensors
from triage.outcomes.outputs import OutputCheckOutcome


UNSTABLE_BATCHES = 1  # batches the loss's gradient at confident predictions is read on (every example at once)


class OutputCheckParams(Params):
    batches: int = Field(default=4, ge=1, description="Look at the outputs of the first N snapshot batches.")
    tolerance: Optional[float] = Field(
        default=None, gt=0, description="How far row sums may be from 1; None: 1e-3 in fp32, 1e-2 under "
                                        "bf16/fp16 autocast (their softmax rounds at ~4e-3).")
    against_standard: bool = Field(
        default=True, description="Also compare the run's loss with the standard loss for its outputs and targets "
                                  "(a gradient through the model; off where only the outputs are read).")


def measure(ctx: Context, p: OutputCheckParams) -> OutputCheckOutcome:
    session = ctx.session
    setup, device = session.setup, session.device
    batches = session.batches[:p.batches]
    every = [o for o in (model_outputs(setup, b, device) for b in batches) if o]
    outputs = [o[0] for o in every]
    spread = least_spread(every)
    with score_losses() as seen:
        loss = mean_loss(setup, batches, device)
    ctx.restart()  # the forwards may have moved BatchNorm statistics
    scores = dict(scores_squashed=seen.squashed, targets_discrete=all(_discrete_targets(b) for b in batches),
                  scores_unsquashed_loss=None, scores_min=seen.low if math.isfinite(seen.low) else None,
                  scores_max=seen.high if math.isfinite(seen.high) else None)
    if seen.squashed:  # one more pass of forwards, with the scores unsquashed
        scores["scores_unsquashed_loss"] = _scores_unsquashed_loss(setup, batches, device)
        ctx.restart()
    if not outputs:
        return OutputCheckOutcome(has_output=False, loss_checkpoint=loss, **scores)
    scores["least_spread"] = spread
    k = int(outputs[0].shape[-1])
    rows = torch.cat([o.reshape(-1, o.shape[-1]) for o in outputs if o.shape[-1] == k])  # (N, K)
    tol = p.tolerance or (1e-3 if setup.precision == "fp32" else 1e-2)
    finite = bool(torch.isfinite(rows).all())
    probabilities = finite and k >= 2 and bool(
        (rows >= -tol).all() and (rows <= 1 + tol).all() and ((rows.sum(-1) - 1).abs() <= tol).all())
    log_probabilities = finite and k >= 2 and bool(
        (rows <= tol).all() and (torch.logsumexp(rows, -1).abs() <= tol).all())
    floor = math.log(math.e + k - 1) - 1 if k >= 2 else None
    squashed = finite and bool((rows >= -tol).all() and (rows <= 1 + tol).all())
    # Logits only: a confident prediction swapped into probabilities (log of 0) or into an embedding whose labels
    # name groups (a distance of 0) has a non-finite gradient where the run's own outputs never do. The probe's
    # forwards are not the same count on every rank: one process only.
    if not (squashed or log_probabilities or seen.squashed or ctx.ranks.distributed or labels_name_groups(session)):
        unstable = unstable_when_confident(setup, batches[:UNSTABLE_BATCHES], loss_levels(session).kind, device)
        if unstable is not None:
            scores.update(unstable_margin=unstable.margin, unstable_op=unstable.op,
                          unstable_source=unstable.source, unstable_line=unstable.line)
    unsquashed = _unsquashed_loss(setup, batches, device, probabilities) if squashed else None
    ctx.restart()
    rule, compared = _against_standard(session) if p.against_standard else (None, None)
    nothing = standard_levels(session, rule).nothing_learned if compared else None
    ctx.restart()
    return OutputCheckOutcome(
        standard_rule=rule, standard_loss=compared.standard if compared else None,
        loss_vs_standard=compared.own / compared.standard
        if compared and compared.standard and math.isfinite(compared.own / compared.standard) else None,
        gradient_vs_standard=compared.gradient_gap if compared and math.isfinite(compared.gradient_gap) else None,
        weighting_spread=compared.weighting_spread if compared else None,
        standard_level_ratio=compared.standard / nothing if compared and nothing else None,
        squashed=squashed, unsquashed_loss=unsquashed, **scores,
        unsquash_ratio=unsquashed / loss if unsquashed is not None and loss > 0 and math.isfinite(loss) else None,
        has_output=True, output_dim=k, output_min=float(rows.min()), output_max=float(rows.max()),
        looks_like_probabilities=probabilities, looks_like_log_probabilities=log_probabilities,
        loss_checkpoint=loss, probability_ce_floor=floor,
        loss_floor_ratio=loss / floor if floor and math.isfinite(loss) else None,
    )


def least_spread(outputs: list[list[torch.Tensor]], min_rows: int = 8) -> Optional[float]:
    """How far the model's outputs spread over examples, for its least spread output: each output's rows
    (examples, or positions of examples) scaled to unit length, their std over the rows averaged over the
    output's d dimensions, times sqrt(d). Outputs spread evenly over every direction score 1; outputs that are
    the same vector for every example score 0 (the collapse monitor of SimSiam, Chen & He 2021). None where no
    output has min_rows finite rows of d >= 2 in every batch."""
    least: Optional[float] = None
    for position in range(min((len(o) for o in outputs), default=0)):
        tensors = [o[position] for o in outputs]
        d = tensors[0].shape[-1]
        if d < 2 or any(t.shape[-1] != d for t in tensors):
            continue
        rows = torch.cat([t.reshape(-1, d) for t in tensors])
        if len(rows) < min_rows or not bool(torch.isfinite(rows).all()):
            continue
        value = float(torch.nn.functional.normalize(rows, dim=1).std(0).mean()) * math.sqrt(d)
        least = value if least is None else min(least, value)
    return least


def _against_standard(session) -> tuple[Optional[str], Optional[Comparison]]:
    """The standard loss's rule, and the run's own loss against it at the checkpoint."""
    rule = standard_rule(session)
    if rule is None:
        return None, None
    try:
        return rule, compare_at_checkpoint(session, rule)
    except ValueError:  # the output and targets do not pair batch by batch
        return None, None


def _discrete_targets(batch) -> bool:
    """The batch's targets (its last tensor) are integers, or floats that are all 0 or 1."""
    tensors = [t for _, t in named_tensors(batch)]
    if not tensors:
        return False
    target = tensors[-1]
    if not target.is_floating_point():
        return True
    return bool(((target == 0) | (target == 1)).all())


def _unsquashed_loss(setup, batches, device, rows_are_probabilities: bool) -> Optional[float]:
    """The mean loss with the model's output swapped for the scores it squashed (a forward hook's
    return value replaces the module's output)."""
    def undo(module, inputs, output):
        if not isinstance(output, torch.Tensor):
            return output
        if rows_are_probabilities:
            return torch.log(output.clamp_min(1e-12))
        return torch.logit(output.clamp(1e-6, 1 - 1e-6))

    handle = setup.model.register_forward_hook(undo)
    try:
        loss = mean_loss(setup, batches, device)
    except Exception:  # e.g. BCELoss refuses values outside [0, 1]: it did want probabilities
        return None
    finally:
        handle.remove()
    return loss if math.isfinite(loss) else None


def _scores_unsquashed_loss(setup, batches, device) -> Optional[float]:
    """The mean loss with the scores handed to a score loss unsquashed where that loss receives them."""
    try:
        with score_losses(unsquash):
            loss = mean_loss(setup, batches, device)
    except Exception:  # noqa: BLE001 - the loss refuses the unsquashed values: it wanted them squashed
        return None
    return loss if math.isfinite(loss) else None


OUTPUT_CHECK = Experiment(
    name="output_check",
    summary="Looks at what the model outputs (scores, probabilities or log-probabilities) and how close "
            "the loss sits to the floor a cross-entropy on probabilities cannot go below.",
    params=OutputCheckParams,
    outcome=OutputCheckOutcome,
    measure=measure,
)
