"""The forked copy measuring a differential's candidates two at a time: a copy that dies, or that is stuck,
costs only time (that it measures what one at a time does is the speed machinery's contract,
tests/walk/test_speedups.py)."""

import time

import pytest
import torch

import triage
from tests.walk.test_speedups import measured
from triage.cli.zoo import example_path, load_example
from triage import forks

pytestmark = pytest.mark.skipif(not forks.can_fork(torch.device("cpu"), 1),
                                reason="forking a copy needs Linux and two cores")


@pytest.fixture(scope="module")
def dead_relu(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dead_relu")
    checkpoint = load_example("dead_relu").write_checkpoint(folder / "c.pt")
    serial, _ = triage.run(f"{example_path('dead_relu')}:setup", checkpoint, out=folder / "serial")
    return checkpoint, serial


def test_a_copy_that_dies_leaves_its_candidate_to_the_walk(dead_relu, tmp_path, monkeypatch):
    checkpoint, serial = dead_relu

    def dies(run_one, inbox, outbox):
        raise RuntimeError("the copy dies before it answers")

    monkeypatch.setattr(forks, "_serve", dies)
    parallel, _ = triage.run(f"{example_path('dead_relu')}:setup", checkpoint, out=tmp_path, speedups=triage.Speedups(draw_ahead=False))
    assert measured(parallel) == measured(serial)


def test_a_copy_that_dies_mid_candidate_is_noticed():
    """Its answer never comes: receive() says so instead of waiting for ever."""
    copy = forks.Forked(lambda run_id, new: forks.os._exit(3))
    copy.send("c", {})
    assert copy.ready(timeout=60)
    with pytest.raises(EOFError, match="'c'"):
        copy.receive()
    copy.close()


def test_a_copy_that_waits_using_no_cpu_is_stuck_and_one_that_computes_is_not(monkeypatch):
    """Stuck is a copy that owes an answer and uses no CPU (a lock held across the fork), never a slow one:
    however long a candidate takes, the copy measuring it is left to finish."""
    monkeypatch.setattr(forks, "STUCK_S", 2.0)
    idle = forks.Forked(lambda run_id, new: time.sleep(120))
    idle.send("c", {})
    waited = time.monotonic()
    while not idle.stuck():
        assert time.monotonic() - waited < 30, "a copy asleep on its candidate was never taken for stuck"
        time.sleep(0.2)
    idle.close()

    def spins(run_id, new):
        while True:
            sum(range(10_000))

    busy = forks.Forked(spins)
    busy.send("c", {})
    started = time.monotonic()
    while time.monotonic() - started < 6:
        assert not busy.stuck(), "a copy computing its candidate was taken for stuck"
        time.sleep(0.2)
    busy.close()


def test_no_fork_leaves_every_candidate_to_the_walk(dead_relu, tmp_path, monkeypatch):
    """A process limit (fork raises): the walk measures them one by one, its threads as they were."""
    checkpoint, serial = dead_relu

    def refused():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(forks.os, "fork", refused)
    threads = torch.get_num_threads()
    parallel, _ = triage.run(f"{example_path('dead_relu')}:setup", checkpoint, out=tmp_path, speedups=triage.Speedups(draw_ahead=False))
    assert measured(parallel) == measured(serial) and torch.get_num_threads() == threads


def test_a_large_training_state_is_measured_one_candidate_at_a_time():
    """Issue 26, memory at scale: the forked copy trains its own copy of the state, so past 256 MiB of it the
    candidates run one by one (a 40M-parameter AdamW run: ~640 MB of weights, gradients and moments)."""
    from triage.forks import (
        MAX_FORKED_STATE_BYTES,
        can_fork,
        training_state_bytes,
    )

    model = torch.nn.Linear(100, 10)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 100)).sum().backward()
    optimizer.step()
    weights = 1010 * 4
    assert training_state_bytes(model, optimizer) == 2 * weights + 2 * weights + 2 * 4  # + exp_avg(_sq), steps
    assert not can_fork(torch.device("cpu"), 1, MAX_FORKED_STATE_BYTES + 1)
