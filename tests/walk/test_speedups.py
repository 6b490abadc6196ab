"""The speed machinery's contract (triage/speedups.py): with every part on (the forked copy, drawing ahead,
the figure cache) a walk measures, decides and draws exactly what it does with none of them."""

import json

import pytest
import torch

import triage
from tests.report.test_report_render import inline_svgs
from triage.cli.zoo import example_path, load_example
from triage.report.ahead import Ahead
from triage import forks


def measured(report):
    """Every experiment's figures and every decision, in the report's order (seconds apart)."""
    return ([(e.node, e.status, json.dumps(e.outcome, sort_keys=True)) for e in report.experiments],
            [d.model_dump() for d in report.decisions])


@pytest.mark.skipif(not forks.can_fork(torch.device("cpu"), 1), reason="the forked copy needs Linux and two cores")
def test_every_speedup_on_gives_the_report_of_none(tmp_path, monkeypatch):
    checkpoint = load_example("dead_relu").write_checkpoint(tmp_path / "c.pt")
    entry = f"{example_path('dead_relu')}:setup"
    sent = []
    send = forks.Forked.send
    monkeypatch.setattr(forks.Forked, "send", lambda self, run_id, new: (sent.append(run_id), send(self, run_id, new)))

    monkeypatch.setenv("TRIAGE_CACHE", str(tmp_path / "cache_off"))
    plain, plain_files = triage.run(entry, checkpoint, out=tmp_path / "off", speedups=triage.Speedups.none())
    assert not sent, "a candidate went to a forked copy with the speedups off"
    assert not (tmp_path / "cache_off" / "figures").exists(), "a figure was kept with the figure cache off"

    monkeypatch.setenv("TRIAGE_CACHE", str(tmp_path / "cache_on"))
    threads = torch.get_num_threads()
    fast, fast_files = triage.run(entry, checkpoint, out=tmp_path / "on", speedups=triage.Speedups(), ahead=Ahead())
    assert sent, "no candidate went to the forked copy"
    assert torch.get_num_threads() == threads  # the walk's threads are given back after the copy's one
    assert list((tmp_path / "cache_on" / "figures").glob("*.svg")), "no figure was kept in the cache"

    assert fast.root_cause == plain.root_cause == "dead_relu"
    assert measured(fast) == measured(plain)
    fast_svgs, plain_svgs = inline_svgs(fast_files["html"].read_text()), inline_svgs(plain_files["html"].read_text())
    assert len(plain_svgs) >= 3 and fast_svgs == plain_svgs
