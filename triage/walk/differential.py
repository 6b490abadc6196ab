"""A differential node: its candidate fixes tried from the same snapshot, each paired with the run as it was,
and the winner as the judge picks it (triage/judge/differential.py). Controls are measured only when a
candidate reads them; candidates run two at a time where a fork is safe (walk/forked.py)."""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Iterable, Optional

from triage.judge.differential import far_fetched, judge_candidates, outranked, tier_of
from triage.records import CandidateResult, Decision, ExperimentRun
from triage.walk.figures import is_number, shown
from triage.walk.forked import Candidates
from triage.walk.listener import Listener
from triage.walk.playbook import Playbook
from triage.walk.playbook.schema import DifferentialNode, LeafNode
from triage.walk.reads import names_read


class Controls:
    """A differential's controls (a candidate with no `then`, such as the run restarted as it was) are
    measured only once a node or candidate that reads them is about to run: a control that nothing is
    compared with decides nothing, and costs a replay (40 of the suite's 90 plateaus never used theirs)."""

    def __init__(self, measure: Callable[[str, Optional[str]], ExperimentRun]) -> None:
        self.measure = measure
        self.waiting: dict[str, Optional[str]] = {}  # control id -> its title

    def defer(self, cid: str, title: Optional[str]) -> None:
        self.waiting[cid] = title

    def waiting_among(self, names: Iterable[str]) -> bool:
        """Whether a control among `names` is still to be measured."""
        return any(n in self.waiting for n in names)

    def ensure(self, names: Iterable[str]) -> None:
        """Measure, here and now, each waiting control among `names` (in the order written)."""
        for name in [n for n in self.waiting if n in set(names)]:
            self.measure(name, self.waiting.pop(name))


def decide(playbook: Playbook, node: str, spec: DifferentialNode, read, new_pool: Callable[[], Candidates],
           listener: Listener, controls: Controls) -> Decision:
    """Try each candidate whose `if` holds, then go where the winner leads, as the judge picks it
    (judge/differential.py: the lowest tier whose fix works, tier 1 where the abnormality a candidate
    repairs was `measured`, the best score within it). A candidate of a higher tier than a fix that
    already works is not run (`outranked`): it could neither win nor come close, both of which need the
    winner's tier (one a later candidate reads, `against:` say, still runs).

    Candidates are taken in the order written; one that reads an earlier one (its `if`, `measured` or a
    parameter such as `against:`) waits for what it needs, and one that a lower tier's result could outrank
    is measured while the copy measures that tier (kept only where it is not outranked), so two at a time
    decide exactly what one at a time would. A control (no `then`) waits in `controls`
    until a candidate that reads it is about to run; one that none reads is not run (`unneeded`)."""
    errors: list[str] = []
    measured = playbook.measured(node)
    decided: list[CandidateResult] = []  # works and score filled in once every candidate is measured
    reads = {cid: _sibling_reads(playbook, node, cid, condition, measured.get(cid))
             for cid, _, condition in playbook.candidates(node)}
    read_later = {ref for refs in reads.values() for ref in refs}
    pool = new_pool()
    settle_later: list[tuple[int, int, Callable[[], bool], Any]] = []  # see below
    try:
        for cid, candidate, condition in playbook.candidates(node):
            controls.ensure(names_read(playbook, None, condition, measured.get(cid)))  # the `if` may read one
            pool.wait(reads[cid])
            abnormal = measured[cid].evaluate(read, errors) if cid in measured else None
            tier = tier_of(candidate.tier, abnormal)
            lower = [c.id for c in decided if c.tried and c.then and c.tier < tier]
            beaten_by = partial(_beaten_by, read, spec.works, candidate.then is not None, cid in read_later)
            entry = CandidateResult(id=cid, experiment=candidate.run, then=candidate.then, tier=tier,
                                    measured=abnormal, tried=False, outranked=False,
                                    cap=None if abnormal else candidate.confidence)
            ahead = None
            if candidate.then is not None and cid not in read_later and pool.measuring(lower):
                # The copy measures a lower tier that may outrank this one. Where its `if` fails, it is not
                # tried either way: whether it was outranked (and the `if`'s errors, read only where it was
                # not) is settled once the lower tiers are in. Else it is measured meanwhile, kept if none works.
                if condition is not None and not condition.evaluate(read, []):
                    settle_later.append((len(decided), len(errors), partial(beaten_by, lower), condition))
                    decided.append(entry)
                    continue
                if not controls.waiting_among(names_read(playbook, cid, condition, measured.get(cid))):
                    ahead = pool.ahead(cid, lambda lower=lower: beaten_by(
                        [c for c in lower if not pool.measuring([c])]))
            if candidate.then is not None and cid not in read_later:
                pool.wait(lower)
            beaten = beaten_by(lower)
            tried = not beaten and (condition is None or condition.evaluate(read, errors))
            if tried and candidate.then is None:
                controls.defer(cid, candidate.title)
            elif tried:
                controls.ensure(names_read(playbook, cid, condition, measured.get(cid)))
                pool.wait(reads[cid])
                finished = (lambda run, cid=cid: listener.finished(
                    run, Decision(node=cid, goto=node, when=f"candidate of {node}", figures={
                        f"{cid}.{spec.works}": shown(read(cid, spec.works)),
                        f"{cid}.{spec.score}": shown(read(cid, spec.score))})))
                if ahead is not None:
                    pool.adopt(cid, candidate.title, ahead, finished)
                else:
                    pool.submit(cid, candidate.title, finished)
            decided.append(entry.model_copy(update={"tried": tried, "outranked": beaten}))
        pool.wait([c.id for c in decided if c.tried])
    finally:
        pool.close()
    for index, position, beaten, condition in reversed(settle_later):  # (positions grow in the order written)
        if beaten():
            decided[index] = decided[index].model_copy(update={"outranked": True})
        else:
            found: list[str] = []
            condition.evaluate(read, found)
            errors[position:position] = found
    decided = [c.model_copy(update={"tried": False, "unneeded": True}) if c.id in controls.waiting else c
               for c in decided]
    results = [_ended(c, read, spec) if c.tried else c for c in decided]
    figures = {f"{r.id}.{spec.works}": r.works for r in results if r.tried and r.then}
    judged = judge_candidates(results, lambda then: _cause_of(playbook, then), spec.close)
    if judged.winner is None:
        return Decision(node=node, goto=spec.otherwise, when=None, figures=figures, candidates=results,
                        confidence=judged.confidence, errors=errors)
    winner = judged.winner
    results = [r.model_copy(update={"winner": r is winner, "also_works": r.id in judged.also}) for r in results]
    return Decision(node=node, goto=winner.then, when=f"{winner.id} works best", figures=figures,
                    candidates=results, confidence=judged.confidence, errors=errors)


def _beaten_by(read, works: str, leads_to_a_cause: bool, read_later: bool, lower: list[str]) -> bool:
    """Outranked by a lower tier among `lower` that works (judge/differential.outranked)."""
    return outranked(leads_to_a_cause=leads_to_a_cause, read_later=read_later,
                     lower_tier_works=[read(c, works) for c in lower])


def _ended(candidate: CandidateResult, read, spec: DifferentialNode) -> CandidateResult:
    """A run candidate with how its experiment ended: its verdict where it ran to its end, none where it
    failed, and not tried at all where it could not run in this setup."""
    status = read(candidate.id, "status")
    if status != "ok":
        return candidate.model_copy(update={"status": status, "tried": status != "not_applicable"})
    update = {"status": status, **_verdict(read(candidate.id, spec.works), read(candidate.id, spec.score)),
              "raced_out": read(candidate.id, "raced_out")}
    # How far the LR had to move, and to what: the nearest working trial of a search, else the factor replayed.
    reason = far_fetched(read(candidate.id, "least_working_factor") or read(candidate.id, "lr_factor"),
                         read(candidate.id, "least_working_lr"), read(candidate.id, "optimizer_kind"))
    if reason is not None:
        update |= {"cap": "low" if candidate.cap == "low" else "medium", "cap_reason": reason}
    return candidate.model_copy(update=update)


def _verdict(works: Any, score: Any) -> dict[str, Any]:
    return {"works": works if isinstance(works, bool) else None, "score": score if is_number(score) else None}


def _sibling_reads(playbook: Playbook, node: str, cid: str, *conditions) -> list[str]:
    """The earlier candidates of `node` that candidate `cid` reads: in its conditions, or named by a
    parameter (`against: restart`)."""
    siblings = {c for c, *_ in playbook.candidates(node)} - {cid}
    return sorted(names_read(playbook, cid, *conditions) & siblings)


def _cause_of(playbook: Playbook, node: Optional[str]) -> Optional[str]:
    """The diagnosis a candidate's `then` stands for (two leaves may carry one root cause)."""
    spec = playbook.spec(node) if node else None
    return spec.diagnosis if isinstance(spec, LeafNode) else node
