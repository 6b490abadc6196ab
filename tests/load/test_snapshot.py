"""Every experiment starts from the same state: the restore must be exact."""

import copy
import random

import numpy as np
import torch

from tests.tiny import mlp_setup
from triage.experiments.base import Context
from triage.experiments.replay import REPLAY, ReplayParams
from triage.load.session import session_from_factory
from triage.load.snapshot import Snapshot


def with_scheduler():
    s = mlp_setup(optimizer="adam", lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(s.optimizer, step_size=3, gamma=0.5)
    return s.model_copy(update={"scheduler": sched})


def state_of(session):
    s = session.setup
    return {
        "model": {k: v.clone() for k, v in s.model.state_dict().items()},
        "modes": {n: m.training for n, m in s.model.named_modules()},
        "opt": copy.deepcopy(s.optimizer.state_dict()),  # state_dict() shares the live tensors
        "sched": s.scheduler.state_dict(),
        "rng": (torch.get_rng_state().clone(), np.random.get_state()[1].copy(), random.getstate()),
    }


def test_restore_is_exact_after_a_replay_changed_everything():
    session = session_from_factory(with_scheduler)
    # The run's state at the checkpoint: some Adam moments, a scheduler mid-way, one module in eval mode.
    REPLAY.measure(Context(session, 60), ReplayParams(steps=5))
    session.setup.model[3].eval()
    session.snapshot = type(session.snapshot).take(session.setup.model, session.setup.optimizer,
                                                   session.setup.scheduler)
    before = state_of(session)

    REPLAY.measure(Context(session, 60), ReplayParams(steps=7, lr_scale=3.0, wd_scale=0.0))
    torch.rand(5), np.random.rand(3), random.random()
    assert not torch.equal(session.setup.model[0].weight, before["model"]["0.weight"])
    session.restore()
    after = state_of(session)

    for key, value in before["model"].items():
        assert torch.equal(after["model"][key], value), key
    assert after["modes"] == before["modes"] and after["modes"]["3"] is False
    for pid, moments in before["opt"]["state"].items():
        for name, tensor in moments.items():
            assert torch.equal(after["opt"]["state"][pid][name], tensor), (pid, name)
    assert after["opt"]["param_groups"] == before["opt"]["param_groups"]
    assert after["sched"] == before["sched"]
    assert torch.equal(after["rng"][0], before["rng"][0])
    assert np.array_equal(after["rng"][1], before["rng"][1])
    assert after["rng"][2] == before["rng"][2]


def test_two_replays_from_the_snapshot_measure_the_same_losses():
    session = session_from_factory(with_scheduler)
    runs = []
    for _ in range(2):
        session.restore()
        runs.append(REPLAY.measure(Context(session, 60), ReplayParams(steps=10, lr_scale=2.0)).losses)
    assert runs[0] == runs[1]


def test_non_persistent_buffers_are_restored_too():
    def with_running_buffer():
        s = mlp_setup()
        s.model.register_buffer("seen", torch.zeros(1), persistent=False)  # not in state_dict()
        return s

    session = session_from_factory(with_running_buffer)
    session.setup.model.seen += 5
    session.restore()
    assert session.setup.model.seen.item() == 0


def test_a_grad_scaler_stopped_between_unscale_and_update_is_fresh_after_a_restore():
    """An experiment that stops on a non-finite loss after unscale_() (and before update()) must not make the
    next experiment's unscale_() raise (seen on a GPU under fp16: 'unscale_() has already been called')."""
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    scaler.step(optimizer)
    scaler.update()
    snapshot = Snapshot.take(model, optimizer, scaler=scaler)
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    scaler.unscale_(optimizer)  # the step under way stops here
    snapshot.restore(model, optimizer, scaler=scaler)
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    scaler.unscale_(optimizer)  # raised RuntimeError before the restore cleared it
    scaler.step(optimizer)
    scaler.update()
