"""The reference replayed alongside, in a whole walk (experiments/alongside.py): the zoo's dead_relu_cnn is
rescued by re-initialising its dead units, a fix that goes on to 120 steps; the walk with the speed machinery
on replays the run over those 120 steps in a forked copy while the fix trains, and measures and decides
exactly what the walk with none does."""

import pytest
import torch

import triage
from tests.walk.test_speedups import measured
from triage import forks
from triage.cli.zoo import example_path, load_example
from triage.experiments import alongside


@pytest.mark.skipif(not forks.can_fork(torch.device("cpu"), 1), reason="the forked copy needs Linux and two cores")
def test_a_walk_with_the_reference_alongside_measures_what_one_without_does(tmp_path, monkeypatch):
    checkpoint = load_example("dead_relu_cnn").write_checkpoint(tmp_path / "c.pt")
    entry = f"{example_path('dead_relu_cnn')}:setup"
    log = tmp_path / "started.txt"  # written by whichever process starts one (the walk's forked copy, say)
    start = alongside.Alongside.start

    def logged(self):
        with open(log, "a") as f:
            f.write(self.key + "\n")
        start(self)
    monkeypatch.setattr(alongside.Alongside, "start", logged)

    plain, _ = triage.run(entry, checkpoint, out=tmp_path / "off", speedups=triage.Speedups.none())
    assert not log.exists()
    fast, _ = triage.run(entry, checkpoint, out=tmp_path / "on", speedups=triage.Speedups(draw_ahead=False))
    assert "replay baseline over 120 steps" in log.read_text().splitlines()
    assert fast.root_cause == plain.root_cause == "dead_relu"
    assert measured(fast) == measured(plain)
