"""The failing run's own logged curve: does validation loss turn up while training loss keeps falling?"""

from __future__ import annotations

from triage.experiments.base import Context, Experiment, Params
from triage.experiments.levels import loss_levels
from triage.outcomes.history_check import HistoryOutcome


class HistoryParams(Params):
    pass


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
        nothing_level=loss_levels(ctx.session).nothing_learned,
    )


HISTORY_CHECK = Experiment(
    name="history_check",
    summary="Reads the failing run's logged curve: where validation loss was best and how train and "
            "validation loss moved since.",
    params=HistoryParams,
    outcome=HistoryOutcome,
    measure=measure,
)
