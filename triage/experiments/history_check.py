"""The failing run's own logged curve: does validation loss turn up while training loss keeps falling?"""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from triage.experiments.base import Context, Experiment, Outcome, Params


class HistoryParams(Params):
    pass


class HistoryOutcome(Outcome):
    points: int = Field(description="Logged points in the run's history.")
    has_val: bool = Field(description="The history logs a validation loss.")
    loss_first: Optional[float] = None
    loss_last: Optional[float] = None
    val_best: Optional[float] = None
    val_best_step: Optional[int] = None
    val_last: Optional[float] = None
    val_ratio: Optional[float] = Field(default=None, description="Last val loss / best val loss.")
    train_ratio_since_val_best: Optional[float] = Field(
        default=None, description="Train loss at the end / train loss when val was best.")


def measure(ctx: Context, p: HistoryParams) -> HistoryOutcome:
    history = ctx.session.history
    train = [(h.step, h.loss) for h in history if h.loss is not None]
    val = [(h.step, h.val_loss) for h in history if h.val_loss is not None]
    out = dict(points=len(history), has_val=bool(val),
               loss_first=train[0][1] if train else None, loss_last=train[-1][1] if train else None)
    if not val:
        return HistoryOutcome(**out)
    best_step, best = min(val, key=lambda sv: sv[1])
    train_at_best = next((loss for step, loss in reversed(train) if step <= best_step), None)
    return HistoryOutcome(
        **out, val_best=best, val_best_step=best_step, val_last=val[-1][1],
        val_ratio=val[-1][1] / best if best > 0 else None,
        train_ratio_since_val_best=train[-1][1] / train_at_best if train and train_at_best else None,
    )


HISTORY_CHECK = Experiment(
    name="history_check",
    summary="Reads the failing run's logged curve: where validation loss was best and how train and "
            "validation loss moved since.",
    params=HistoryParams,
    outcome=HistoryOutcome,
    measure=measure,
)
