"""A differential's candidate measured while the copy measures a lower tier that may outrank it (walk/differential.py,
TwoAtOnce.ahead), and a search's trials two at a time (experiments/lanes.py): a walk with the speed machinery on
reaches the verdict, the path and the figures of one with none of it, but for the trials a search raced."""

import json
import logging

import pytest
import torch

import triage
from triage import forks
from triage.cli.zoo import example_path, load_example
from triage.walk import forked

pytestmark = pytest.mark.skipif(not forks.can_fork(torch.device("cpu"), 1), reason="the forked copy needs Linux and two cores")


def both_ways(tmp_path, name: str):
    """The zoo example `name` triaged with no speed machinery, then with it on one torch thread (as `triage run`
    on one thread: the searches' trials two at a time too): (plain, fast)."""
    checkpoint = load_example(name).write_checkpoint(tmp_path / "c.pt")
    entry = f"{example_path(name)}:setup"
    plain, _ = triage.run(entry, checkpoint, out=tmp_path / "off", speedups=triage.Speedups.none())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fast, _ = triage.run(entry, checkpoint, out=tmp_path / "on", speedups=triage.Speedups(draw_ahead=False))
    finally:
        torch.set_num_threads(threads)
    return plain, fast


@pytest.mark.parametrize("name", ["frozen_parameters", "numerical_instability", "lr_too_low"])
def test_measured_ahead_the_walk_decides_what_it_decides_one_at_a_time(tmp_path, monkeypatch, caplog, name):
    aheads = []
    ahead = forked.TwoAtOnce.ahead
    monkeypatch.setattr(forked.TwoAtOnce, "ahead", lambda self, cid, outranked: (
        aheads.append(cid), ahead(self, cid, outranked))[1])
    with caplog.at_level(logging.WARNING):
        plain, fast = both_ways(tmp_path, name)
    assert aheads, "no candidate was measured ahead"
    assert not [r for r in caplog.records if "instead" in r.getMessage()], "a forked copy was lost"
    assert (fast.root_cause, fast.confidence, fast.path) == (plain.root_cause, plain.confidence, plain.path)
    assert [d.model_dump() for d in fast.decisions] == [d.model_dump() for d in plain.decisions]

    def figures(report):
        return {e.node: json.dumps(e.outcome, sort_keys=True) for e in report.experiments
                if e.experiment not in ("lr_search", "init_search")}  # raced two at a time (test_lanes.py)
    assert figures(fast) == figures(plain)


@pytest.mark.parametrize("name", ["frozen_parameters"])  # its higher_lr is measured ahead of unfreeze
def test_a_copy_that_dies_while_a_candidate_is_measured_ahead_costs_only_time(tmp_path, monkeypatch, name):
    """The candidate the dead copy owed is measured here once the one measured ahead has ended, never from
    inside its steps (where the copy is looked at): the walk measures and decides what it does without it."""
    from triage.walk import engine

    def dies(run_one, inbox, outbox):
        forks._read(inbox)  # takes its first candidate, then dies without an answer
        raise RuntimeError("the copy dies before it answers")
    monkeypatch.setattr(forks, "_serve", dies)
    inside, nested = [], []
    measure, measure_ahead = engine.Walker.measure, engine.Walker.measure_ahead

    def measured_ahead(self, run_id, abandon):
        inside.append(run_id)
        try:
            return measure_ahead(self, run_id, abandon)
        finally:
            inside.pop()
    monkeypatch.setattr(engine.Walker, "measure_ahead", measured_ahead)
    monkeypatch.setattr(engine.Walker, "measure", lambda self, run_id, title: (
        nested.extend(inside), measure(self, run_id, title))[1])
    plain, fast = both_ways(tmp_path, name)
    assert nested == [], f"a candidate was measured inside {nested}"
    assert (fast.root_cause, fast.confidence, fast.path) == (plain.root_cause, plain.confidence, plain.path)
