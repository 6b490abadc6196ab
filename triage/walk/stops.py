"""How a walk ends before a leaf: the ranks of a distributed run could not go on together (StopWalk), or the
user's ceiling on the walk passed (CeilingReached); and the leaf each shows in the report."""

from __future__ import annotations

from typing import Optional

from triage.records import ExperimentRun
from triage.walk.playbook.schema import LeafNode
from triage.walk.settle import RankFailure

STOPPED = "stopped"  # the last node of a path whose walk stopped before reaching a leaf


class StopWalk(Exception):
    """Ends the walk before a leaf (the ranks of a distributed run could not go on together): carries
    the leaf the report shows, and the experiment that could not finish."""

    def __init__(self, leaf: LeafNode, run: Optional[ExperimentRun], reason: str, silent_ranks: list[int]) -> None:
        super().__init__(reason)
        self.leaf, self.run, self.reason, self.silent_ranks = leaf, run, reason, silent_ranks


class CeilingReached(Exception):
    """The user's ceiling on the walk (--max-minutes) passed: `node`'s experiment was cut part way (`run`
    says where) or, with `run` None, never began."""

    def __init__(self, node: str, run: Optional[ExperimentRun]) -> None:
        super().__init__(node)
        self.node, self.run = node, run


def cut_reason(reached: CeilingReached, max_seconds: Optional[float]) -> str:
    ceiling = f"the --max-minutes ceiling ({_minutes(max_seconds)} min)"
    if reached.run is None:
        return f"{ceiling} passed before '{reached.node}' began"
    steps_run, steps = (reached.run.outcome or {}).get("steps_run"), reached.run.params.get("steps")
    where = f" after {steps_run} of its {steps} steps" if steps_run is not None and steps else ""
    return f"{ceiling} cut '{reached.node}'{where}"


def cut_leaf(reached: CeilingReached, reason: str, max_seconds: Optional[float]) -> LeafNode:
    return LeafNode(
        diagnosis="inconclusive", title="The walk was cut short by its time ceiling (--max-minutes)",
        confidence="low",
        fix=(f"No verdict: {reason}. A cut experiment is unmeasured, not ruled out, so the walk stopped there; "
             "the experiments before it are reported as measured. Re-run with a larger --max-minutes "
             f"(this walk needs more than {_minutes(max_seconds)} min), or without it, to let every experiment "
             "run its steps."),
        evidence=[reached.node] if reached.run is not None else [])


def _minutes(seconds: Optional[float]) -> str:
    return f"{(seconds or 0.0) / 60:.3g}"


def stopped_leaf(failure: RankFailure) -> LeafNode:
    what = "stopped responding" if failure.silent else "raised"
    return LeafNode(
        diagnosis="inconclusive", title=f"The walk stopped: {failure.summary}", confidence="low",
        fix=(f"Make every rank run the experiment: the rank that {what} is named above"
             + (", with its traceback in the experiment's record. " if not failure.silent else
                " (a deadlock, an endless loop, a collective only some ranks call). ")
             + "The experiments before it are reported as measured; re-run triage once it is fixed."),
        evidence=[failure.node])
