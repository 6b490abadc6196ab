"""A search's trials two at a time: this process measures one trial while a forked copy of it measures
another, so that a search of several replays costs about half their length where a second core is free.

The trials are the search's, in its order, and it stops where it would one at a time: at the first trial
after which the search is settled (judge/search.py). A trial started before that was known is dropped,
whichever process measured it: the one here stops at its next step (Context.abandon), the copy's is
killed. Each trial is measured exactly as one at a time (the snapshot restored, torch on one thread) but for
its racing bar: one at a time, a trial is raced against every trial before it; two at a time, against every
trial before it but the one just before, which may still be running. The bar never depends on which trial
finished first, so two searches on one machine measure the same figures. A search measured one at a time
and one measured two at a time differ only where a trial raced against the trial just before it would have
stopped, and their verdicts only where that race stopped a trial that would have won (judge/race.py).

Part of the speed machinery (Speedups.fork), wherever a fork is safe (triage/forks.can_fork): there every
search is raced two at a time, whichever process measures it, and a copy measures beside this process where
this process is not a copy itself and runs torch on one thread, and only while no other copy of the walk owes
an answer (forks.busy_elsewhere: a trial ahead pays only on a free core). A copy that dies or hangs leaves
its trial to this process.
"""

from __future__ import annotations

import logging
import pickle
from dataclasses import replace
from typing import Any, Callable, Optional, Sequence

import torch

from triage.experiments.base import Abandoned, Context
from triage.forks import POLL_S, Forked, busy_elsewhere, can_fork, is_copy, training_state_bytes
from triage.judge.race import Bar
from triage.load.ranks import current as current_ranks
from triage.outcomes.replay import ReplayOutcome
from triage.speedups import active

log = logging.getLogger(__name__)

Trials = list[tuple[Any, ReplayOutcome]]
# (ctx, setting, bar) -> the trial's outcome, measured from the snapshot restored (measure restores it).
Measure = Callable[[Context, Any, Optional[Bar]], ReplayOutcome]
# (the trials a trial is raced against, its setting) -> its bar (None: not raced against them).
BarOf = Callable[[Trials, Any], Optional[Bar]]
Settled = Callable[[Trials], bool]


def run_trials(ctx: Context, settings: Sequence[Any], measure: Measure, bar: BarOf, settled: Settled) -> Trials:
    """Each setting's trial, in order, until the trials so far are `settled` (or the settings end)."""
    lanes = _Lanes.open(ctx, settings, measure, bar, settled)
    if lanes is None:
        trials: Trials = []
        for setting in settings:
            trials.append((setting, measure(ctx, setting, bar(trials, setting))))
            if settled(trials):
                break
        return trials
    try:
        return lanes.run()
    finally:
        lanes.close()


class _Lanes:
    """This process and one forked copy, each taking the next trial not started once its bar is known."""

    def __init__(self, ctx: Context, settings: Sequence[Any], measure: Measure, bar: BarOf, settled: Settled,
                 copy: Optional[Forked]) -> None:
        self.ctx, self.settings, self.measure, self.bar_of, self.settled = ctx, list(settings), measure, bar, settled
        self.copy: Optional[Forked] = copy
        self.done: dict[int, ReplayOutcome] = {}
        self.failed: dict[int, Exception] = {}  # raised by a trial here: raised once the search reaches it
        self.started = 0  # trials started, in order
        self.in_copy: Optional[tuple[int, Optional[Bar]]] = None  # the trial the copy measures, and its bar
        self.redo: list[tuple[int, Optional[Bar]]] = []  # trials a lost copy left, to measure here

    @classmethod
    def open(cls, ctx: Context, settings: Sequence[Any], measure: Measure, bar: BarOf,
             settled: Settled) -> Optional["_Lanes"]:
        """None where one at a time is all there is: one trial, the speed machinery off, or no safe fork.
        Lanes with no copy (every trial here, raced as two at a time) in a copy itself, or with torch on
        more threads than one here: which process measures a search must not change its figures."""
        session = ctx.session
        if (len(settings) < 2 or not active().fork
                or not can_fork(session.device, current_ranks().world_size,
                                training_state_bytes(session.setup.model, session.setup.optimizer))):
            return None
        copy = None
        if not is_copy() and torch.get_num_threads() == 1:
            # (abandon: this process's question, which reads its pipes to the other copies; never the copy's)
            quiet = replace(ctx, progress=lambda done, total: None, abandon=None)
            known = set(session.memo)

            def in_copy(index: int, trial_bar: Optional[Bar]) -> tuple[ReplayOutcome, dict, bool]:
                outcome = measure(quiet, settings[index], trial_bar)
                return outcome, _picklable({k: v for k, v in session.memo.items() if k not in known}), quiet.cut
            try:
                copy = Forked(in_copy)
            except OSError:
                copy = None
        return cls(ctx, settings, measure, bar, settled, copy)

    def run(self) -> Trials:
        while True:
            trials = self._ordered()
            stop = self._settled_at(trials, len(trials))
            if stop is not None or len(trials) == len(self.settings):
                return trials[:stop]
            if len(trials) in self.failed:  # one at a time, this trial would have raised here too
                raise self.failed[len(trials)]
            self._feed_copy()
            if self.redo:
                self._here(*self.redo.pop(0))
            elif self._may_start(self.started):
                index = self.started
                self.started += 1
                self._here(index, self._bar(index))
            elif self.in_copy is not None:
                self._collect(block=True)
            else:  # cannot be: a trial not finished is in the copy, to redo, or dropped once the search settled
                raise RuntimeError("a search's trials two at a time lost track of its trials")

    def _ordered(self) -> Trials:
        """The finished trials from the first on, up to the first not finished."""
        trials: Trials = []
        while len(trials) in self.done:
            trials.append((self.settings[len(trials)], self.done[len(trials)]))
        return trials

    def _settled_at(self, trials: Trials, upto: int) -> Optional[int]:
        """The number of trials at which the search stops, looking at the first `upto` of them (None: not yet)."""
        return next((n for n in range(1, min(len(trials), upto) + 1) if self.settled(trials[:n])), None)

    def _may_start(self, index: int) -> bool:
        """A trial starts once every trial before it has finished but the one just before (its bar's)."""
        return index < len(self.settings) and not self.failed and all(i in self.done for i in range(index - 1))

    def _bar(self, index: int) -> Optional[Bar]:
        return self.bar_of(self._ordered()[:max(0, index - 1)], self.settings[index])

    def _feed_copy(self) -> None:
        if (self.copy is None or self.in_copy is not None or not self._may_start(self.started)
                or busy_elsewhere(but=self.copy)):  # a trial ahead pays only on a core nothing else uses
            return
        index = self.started
        trial_bar = self._bar(index)
        try:
            self.copy.send(index, trial_bar)
        except Exception as exc:  # noqa: BLE001  (it died, or the bar would not pickle)
            self._lost(exc)
            return
        self.started += 1
        self.in_copy = (index, trial_bar)

    def _here(self, index: int, trial_bar: Optional[Bar]) -> None:
        """Trial `index` measured in this process; dropped where the search settles before it (the copy's
        answer, looked at between its steps, settles it), and the copy fed between its steps."""
        def abandon() -> bool:
            self._collect(block=False)
            self._feed_copy()
            return self._settled_at(self._ordered(), index) is not None
        outer = self.ctx.abandon  # the search itself measured ahead of time (walk/differential.py)
        trial_ctx = replace(self.ctx, abandon=lambda: abandon() or (outer is not None and outer()))
        try:
            outcome = self.measure(trial_ctx, self.settings[index], trial_bar)
        except Abandoned:
            if outer is not None and outer():
                raise
            return
        except Exception as exc:  # noqa: BLE001  (kept: a search that settles before this trial never ran it)
            self.failed[index] = exc
            return
        finally:
            self.ctx.cut |= trial_ctx.cut
        self.done[index] = outcome

    def _collect(self, block: bool) -> None:
        """The copy's answer, where it has one (waiting for it with `block`)."""
        if self.copy is None or self.in_copy is None:
            return
        index, trial_bar = self.in_copy
        try:
            if not self.copy.ready(0):
                if not block:
                    return
                while not self.copy.ready(POLL_S):
                    if self.copy.stuck():
                        raise TimeoutError("no answer and no CPU time used")
            outcome, memo, cut = self.copy.receive()
        except Exception as exc:  # noqa: BLE001  (it died, was stuck, or its answer is unreadable)
            self._lost(exc)
            self.in_copy = None
            self.redo.append((index, trial_bar))  # measured here instead, with the very bar it was sent
            return
        self.in_copy = None
        self.ctx.session.memo.update({k: v for k, v in memo.items() if k not in self.ctx.session.memo})
        self.ctx.cut |= cut
        self.done[index] = outcome

    def _lost(self, exc: Exception) -> None:
        log.warning("the copy measuring a search's trials ended (%s); measuring them here instead", exc)
        self.close()

    def close(self) -> None:
        if self.copy is not None:
            self.copy.close()
            self.copy = None


def _picklable(memo: dict[str, Any]) -> dict[str, Any]:
    """The figures the copy measured once (session.memo) that can cross the pipe back."""
    kept = {}
    for key, value in memo.items():
        try:
            pickle.dumps(value)
        except Exception:  # noqa: BLE001  (a figure holding a tensor with a grad_fn, a lambda, ...)
            continue
        kept[key] = value
    return kept
