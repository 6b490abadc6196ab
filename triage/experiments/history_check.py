"""The failing run's own logged curve: does validation loss turn up while training loss keeps falling?"""

from __future__ import annotations

import math
from typing import Optional

import torch

from triage.experiments.base import Context, Experiment, Params
from triage.experiments.levels import loss_levels, val_nothing_level
from triage.experiments.training import autocast, loss_value, scored_loss, untouched_buffers_and_rng
from triage.outcomes.history_check import HistoryOutcome


VAL_BATCHES = 4  # validation batches the loss at the checkpoint is read on


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
        val_nothing_level=val_nothing_level(ctx.session), val_checkpoint=_val_at_checkpoint(ctx),
    )


def _val_at_checkpoint(ctx: Context) -> Optional[float]:
    """The run's loss on the first validation batches at the checkpoint, as a validation pass scores it: what
    the log's last validation figure is set against (a log summed over batches, or a perplexity, is not in
    the run's units)."""
    session = ctx.session
    if not session.val_batches:
        return None
    setup = session.setup
    try:
        with torch.no_grad(), untouched_buffers_and_rng(setup.model), autocast(setup.precision, session.device):
            values = [loss_value(scored_loss(setup, b)) for b in session.val_batches[:VAL_BATCHES]]
    except Exception:  # noqa: BLE001 - not read: the log is then not compared with it
        return None
    finally:
        ctx.restart()
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


HISTORY_CHECK = Experiment(
    name="history_check",
    summary="Reads the failing run's logged curve: where validation loss was best and how train and "
            "validation loss moved since.",
    params=HistoryParams,
    outcome=HistoryOutcome,
    measure=measure,
)
