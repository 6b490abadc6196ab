"""What a replay measures: the run's own steps from the checkpoint, with one intervention at a time
(triage/experiments/replay.py), verified against the run as it was where it is a candidate fix."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from triage.outcomes.verify import VerifiedFix


class ReplayOutcome(VerifiedFix):
    steps_run: int = Field(description="Training steps the replay ran.", json_schema_extra={"words": "steps replayed"})
    loop_used: Literal["reference", "user"] = Field(
        default="reference", description="user: the run's own train_step drove the replay; reference: triage's loop "
                                         "on loss_fn.",
        json_schema_extra={"words": "training step used"})
    loop_note: Optional[str] = Field(
        default=None, description="Why the replay ran on the reference loop although the run has its own train_step.",
        json_schema_extra={"words": "loop note"})
    optimizer_steps: Optional[int] = Field(
        default=None, description="Optimizer steps the run's own step took (fewer than steps_run under gradient "
                                  "accumulation or skipped GradScaler steps); None on the reference loop.",
        json_schema_extra={"words": "optimizer steps"})
    lr_factor: float = Field(
        default=1.0, description="The multiplier of the run's LR this replay trained at (1: the run's own).",
        json_schema_extra={"words": "LR factor", "unit": "×"})
    lr_changed_in: list[str] = Field(
        default_factory=list, description="Several optimizers (Setup.optimizers): the names of those whose LR the "
                                          "candidate scaled (every one, or lr_of's alone).",
        json_schema_extra={"words": "LR changed in"})
    scheduler_steps: int = Field(
        default=0, description="Times triage stepped the run's scheduler (per step, per epoch, or on the loss for "
                               "ReduceLROnPlateau).",
        json_schema_extra={"words": "scheduler steps"})
    search_speedup: Optional[float] = Field(
        default=None, description="Trained at the LR a search chose (lr_factor_of): how many times fewer steps the "
                                  "search's trial took than the run, replayed over these steps, to reach the trial's "
                                  "end loss (the run's running median of 5); None where the run never reached it.",
        json_schema_extra={"words": "steps the run took over the search trial's, to the same loss", "unit": "×"})
    losses: list[float] = Field(description="Training loss per step.", json_schema_extra={"words": "loss per step"})
    grad_norms: list[float] = Field(
        description="Global gradient norm per step, before clipping.",
        json_schema_extra={"words": "gradient norm per step"})
    lrs: list[float] = Field(
        description="Learning rate per step.",
        json_schema_extra={"words": "learning rate per step"})
    val_steps: list[int] = Field(default_factory=list, json_schema_extra={"words": "validation steps"})
    val_losses: list[float] = Field(default_factory=list, json_schema_extra={"words": "validation losses"})
    skipped: list[int] = Field(
        default_factory=list, description="Indices of the snapshot batches the replay left out.",
        json_schema_extra={"words": "batches skipped"})
    overflow_steps: list[int] = Field(
        default_factory=list, description="Steps (from 0) whose update a GradScaler skipped (its scale dropped: the "
                                          "reference loop's, or Setup.scaler under the run's own step); with no "
                                          "scaler declared, the run's own step that left a non-finite gradient and "
                                          "did not reach optimizer.step().",
        json_schema_extra={"words": "steps a GradScaler skipped"})
    overflow_count: int = Field(
        default=0, description="How many steps overflowed (overflow_steps).",
        json_schema_extra={"words": "steps skipped by the scaler"})
    overflowing_batches: list[int] = Field(
        default_factory=list, description="Snapshot batches that overflowed on every pass, over two passes or more: "
                                          "skipped each time they came round, never learned from (none named under "
                                          "gradient accumulation; this rank's batches).",
        json_schema_extra={"words": "batches skipped on every pass"})
    finite: bool = Field(
        description="Every loss and gradient norm stayed finite (on every rank).",
        json_schema_extra={"words": "stayed finite", "ranks": "all"})
    first_nonfinite_step: Optional[int] = Field(
        default=None, description="The replay step (from 0) whose loss or gradient was not finite.",
        json_schema_extra={"words": "first non-finite step"})
    first_nonfinite_ranks: list[int] = Field(
        default_factory=list, description="Distributed: the ranks whose loss (else gradient norm) was non-finite at "
                                          "first_nonfinite_step.",
        json_schema_extra={"words": "first non-finite ranks"})
    rank_loss_end: list[Optional[float]] = Field(
        default_factory=list, description="Distributed: each rank's end-window loss on its own batches (the replay's "
                                          "losses are the ranks' mean per step); empty in one process.",
        json_schema_extra={"words": "rank loss end"})
    truncated: bool = Field(
        default=False, description="Cut by the walk's ceiling (--max-minutes) part way.",
        json_schema_extra={"words": "cut short by the time ceiling"})
    raced_out: Optional[str] = Field(
        default=None, description="Stopped before its last step because it could no longer change the verdict "
                                  "(judge/race.py): where, and the figures that showed it. Its other figures are "
                                  "those of the steps it ran.",
        json_schema_extra={"words": "stopped out of contention"})
    loss_start: Optional[float] = Field(
        default=None, description="Median loss of the first fifth of steps.",
        json_schema_extra={"words": "loss at the start"})
    loss_end: Optional[float] = Field(
        default=None, description="Median loss of the last fifth of steps.",
        json_schema_extra={"words": "loss at the end"})
    loss_ratio: Optional[float] = Field(
        default=None, description="loss_end / loss_start for a positive loss; for a negative one (a policy-gradient "
                                  "surrogate, a log-likelihood) 1 + (loss_end - loss_start) / |loss_start|, so that "
                                  "above 1 is always a rise and below 1 a fall, by the same share of its size.",
        json_schema_extra={"words": "loss end / start", "unit": "×"})
    loss_min: Optional[float] = Field(
        default=None, description="The lowest loss of any replayed step.",
        json_schema_extra={"words": "lowest loss"})
    loss_max: Optional[float] = Field(
        default=None, description="The highest loss of any replayed step.",
        json_schema_extra={"words": "highest loss"})
    log_slope: Optional[float] = Field(
        default=None, description="Slope of ln(loss) per step: below 0 the run learns.",
        json_schema_extra={"words": "slope of log loss", "unit": "per step"})
    log_slope_se: Optional[float] = Field(
        default=None, description="The standard error of log_slope, from the scatter of ln(loss) about its line: "
                                  "how fast the run could be learning under its own step-to-step noise.",
        json_schema_extra={"words": "standard error of the log-loss slope", "unit": "per step"})
    same_batches_ratio: Optional[float] = Field(
        default=None, description="Where the weights moved under 0.1% of their norm, or a tenth of it or more: the "
                                  "end window's batches scored at the replay's end over the same batches scored at "
                                  "its start (about 1: the fall between its windows is the batches', not learning).",
        json_schema_extra={"words": "end window's batches, end / start", "unit": "×"})
    fall_kept: Optional[float] = Field(
        default=None, description="The loss's fall over the second half of the steps over its fall over the first "
                                  "(medians of the first, middle and last fifth): 1 or more at a steady or growing "
                                  "pace, well under 1 where it slows; none where it did not fall at first.",
        json_schema_extra={"words": "second half's fall over the first's", "unit": "×"})
    max_rise: Optional[float] = Field(
        default=None, description="Largest rise of the loss above its best so far, in units of loss_start.",
        json_schema_extra={"words": "largest rise of the loss", "unit": "× start loss"})
    max_grad_norm: Optional[float] = Field(
        default=None, description="The largest global gradient norm of any step, before clipping.",
        json_schema_extra={"words": "largest gradient norm"})
    median_grad_norm: Optional[float] = Field(
        default=None, description="Median global gradient norm over the steps, before clipping.",
        json_schema_extra={"words": "typical gradient norm"})
    grad_norm_start: Optional[float] = Field(
        default=None, description="Median gradient norm of the first fifth of steps: typical, before any blow-up.",
        json_schema_extra={"words": "gradient norm at the start"})
    clip_threshold: Optional[float] = Field(
        default=None, description="The global-norm clip the replay used (none: no clipping).",
        json_schema_extra={"words": "gradient clip"})
    clipped_fraction: float = Field(
        default=0.0, description="Share of steps whose gradient norm exceeded the clip.",
        json_schema_extra={"words": "steps clipped", "unit": "%"})
    weight_norm_ratio: Optional[float] = Field(
        default=None, description="Size of the weights at the end over their size at the start: |w| after / |w| "
                                  "before.",
        json_schema_extra={"words": "weight norm after / before", "unit": "×"})
    update_ratio: Optional[float] = Field(
        default=None, description="How far the weights moved, relative to their size at the start: |w_end - w_start| "
                                  "/ |w_start|.",
        json_schema_extra={"words": "weights moved", "unit": "× their size"})
    val_ratio: Optional[float] = Field(
        default=None, description="Last val loss / best val loss: above 1, validation loss rose from its best.",
        json_schema_extra={"words": "last / best validation loss", "unit": "×"})
    val_start: Optional[float] = Field(default=None, json_schema_extra={"words": "validation start"})
    val_end: Optional[float] = Field(default=None, json_schema_extra={"words": "validation end"})
    val_noise: Optional[float] = Field(
        default=None, description="The validation loss's own noise over the replay, blind to its trend: the median "
                                  "absolute second difference of successive measurements over 1.65 (about the "
                                  "standard deviation of white noise; None: under four measurements).",
        json_schema_extra={"words": "validation noise"})
    val_final: Optional[float] = Field(
        default=None, description="Validation loss at the replay's end, on the first VAL_BATCHES validation batches "
                                  "(None without validation data, or where the replay did not end finite): what a fix "
                                  "is also judged by.",
        json_schema_extra={"words": "validation loss at the end"})
    val_neighbours: Optional[float] = Field(
        default=None, description="Where the labels name groups of examples, not output columns (metric learning): "
                                  "the share of the distinct validation examples measured for val_final whose "
                                  "nearest other one, by the model's output in eval mode, has the same label, at the "
                                  "replay's end.",
        json_schema_extra={"words": "validation nearest-neighbour agreement at the end"})
    nothing_level: Optional[float] = Field(
        default=None, description="The loss of a model that learned nothing: the best constant prediction (label "
                                  "entropy, target variance), else ln K.",
        json_schema_extra={"words": "loss of learning nothing"})
    val_nothing_level: Optional[float] = Field(
        default=None, description="Where the replay measured validation: the loss of learning nothing as the training "
                                  "snapshot defines it (its class frequencies, its mean target), scored on the "
                                  "validation batches.",
        json_schema_extra={"words": "loss of learning nothing on validation"})
    level_ratio: Optional[float] = Field(
        default=None, description="loss_end / nothing_level: ~1 is a run that learned nothing.",
        json_schema_extra={"words": "end loss / learning nothing", "unit": "×"})
    pace_vs_run: Optional[float] = Field(
        default=None, description="The replay's loss fall per step over the run's average fall per step before the "
                                  "checkpoint (from its logged start, or from the loss of learning nothing): under "
                                  "0.1 a replay near the plateau threshold has stalled. Replays from the checkpoint "
                                  "only.",
        json_schema_extra={"words": "learning pace vs the run before", "unit": "×"})
    perfect_loss: Optional[float] = Field(
        default=None, description="A replay on a few examples: their loss on a perfect prediction, at the start "
                                  "(0 for cross-entropy or MSE; a listwise or soft-target loss's targets' entropy).",
        json_schema_extra={"words": "loss of a perfect prediction of the subset"})
    perfect_gap_ratio: Optional[float] = Field(
        default=None, description="A replay on a few examples: (loss_end - perfect_loss) / (loss_start - "
                                  "perfect_loss), the share of its distance to a perfect prediction it kept.",
        json_schema_extra={"words": "distance to a perfect prediction, end / start", "unit": "×"})
    loss_floor: Optional[float] = Field(
        default=None, description="The least this loss can score (0 for cross-entropy, MSE, BCE, ...), where "
                                  "measured: its value on a perfect prediction.",
        json_schema_extra={"words": "lowest loss possible"})
    below_floor: bool = Field(
        default=False, description="The loss went below its floor: a symptom (a term with the wrong sign), never a "
                                   "fix.",
        json_schema_extra={"words": "went below the lowest possible loss", "ranks": "any"})
