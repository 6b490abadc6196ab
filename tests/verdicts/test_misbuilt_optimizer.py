"""An optimizer built on the wrong network (a DQN's target network instead of its Q network): the graph is
not cut, the gradient reaches the Q network, and nothing steps it. Not `no_gradient_flow` (remove a
.detach()) but parameters left out of training: the run with them added to the optimizer trains."""

import torch
from torch import nn

import triage
from tests._instrument_runs import run as run_experiment, session_of
from triage.experiments.gradient_flow import GRADIENT_FLOW


def transitions(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        s, s2 = torch.randn(64, 6, generator=g), torch.randn(64, 6, generator=g)
        a = torch.randint(0, 3, (64,), generator=g)
        r = s[:, 0] - 0.5 * s[:, 1] + 0.1 * torch.randn(64, generator=g)
        out.append((s, a, r, s2))
    return out


def td_loss(model, batch, gamma=0.5):
    s, a, r, s2 = batch
    with torch.no_grad():
        target = r + gamma * model["target"](s2).max(-1).values
    q = model["q"](s).gather(1, a[:, None]).squeeze(1)
    return nn.functional.mse_loss(q, target)


def dqn_setup(optimizer_on="target"):
    torch.manual_seed(0)
    model = nn.ModuleDict({name: nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3))
                           for name in ("q", "target")})
    model["target"].load_state_dict(model["q"].state_dict())
    optimizer = torch.optim.Adam(model[optimizer_on].parameters(), lr=1e-3)
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=td_loss, batches=transitions())


def losses_of(setup, steps=100):
    out = []
    for step in range(steps):
        setup.optimizer.zero_grad()
        loss = setup.loss_fn(setup.model, setup.batches[step % 8])
        loss.backward()
        setup.optimizer.step()
        out.append(loss.item())
    return out


def test_the_fault_is_stock_pytorch_and_building_the_optimizer_on_q_fixes_it():
    faulty, fixed = losses_of(dqn_setup("target")), losses_of(dqn_setup("q"))
    assert abs(sum(faulty[-8:]) / sum(faulty[:8]) - 1) < 0.05  # Q never moves: the TD loss stays where it was
    assert sum(fixed[-8:]) < 0.6 * sum(fixed[:8])


def test_the_gradient_flow_sees_the_gradient_go_to_parameters_no_optimizer_holds():
    flow = run_experiment(GRADIENT_FLOW, session_of(dqn_setup))
    assert flow.no_grad_fraction == 1.0 and flow.outside_with_grad_fraction == 0.5


def test_an_optimizer_on_the_target_network_is_frozen_parameters_not_a_cut_graph(tmp_path):
    report, _ = triage.run(dqn_setup, None, out=tmp_path)
    assert (report.root_cause, report.path[-1]) == ("frozen_parameters", "frozen_parameters_optimizer")
    assert report.experiment("misbuilt_optimizer").outcome["fix_works"]
    assert "q.0.weight" in report.fix
