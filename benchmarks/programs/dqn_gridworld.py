"""DQN on a small grid world written in the file, after CleanRL's dqn.py.

Follows vwxyzjn/cleanrl cleanrl/dqn.py (its structure, known from the file and the code search): a `QNetwork` MLP
(120-84 ReLU), a `target_network` loaded from it, a replay buffer, a linear epsilon schedule
(`linear_schedule(start_e, end_e, exploration_fraction * total_timesteps, global_step)`), learning after
`learning_starts` every `train_frequency` env steps on a sampled batch with
`td_target = r + gamma * target_network(next_obs).max(1) * (1 - done)` under `torch.no_grad()`,
`loss = F.mse_loss(td_target, q_network(obs).gather(1, a))`, Adam, and a hard target update every
`target_network_frequency` steps (tau=1). gymnasium is not available: the environment is a 6x6 grid world with two
wall cells, a random start cell, +1 at the goal cell, -0.01 a step and a 40-step limit; the observation is the
agent's (row, col) and the goal's, scaled to [0, 1]. Everything is scaled down to run in seconds (5000 env steps,
learning_starts 500, train_frequency 2, batch 64, target update every 100 steps, lr 1e-3).

The checkpoint is a dict of both networks (an `nn.ModuleDict` "agent" holding `q_network` and `target_network`, as
the loss needs both), the optimizer and `global_step` in env steps, as CleanRL counts.

Data handed to triage: 48 replay-buffer samples of 64 transitions (dicts: observations, actions, rewards,
next_observations, dones), drawn from a buffer filled by a uniformly random policy, as the buffer is at
`learning_starts`.

Runs
- healthy: CleanRL's loop; the checkpoint is taken at env step 2000 of 5000 (TD learning under way, the greedy
  policy not yet solving every start).
- optimizer_on_target: the user built the optimizer over `target_network.parameters()` (the two networks are
  built side by side and the names are easy to swap; which network the optimizer updates confuses readers of the
  PyTorch DQN tutorial too: pytorch/tutorials issue #466 and PRs #865 / #1067 fix its comment "Perform one step of
  the optimization (on the target network)"). The target network gets no gradient (its values sit under
  no_grad), the Q-network gets gradients that no optimizer applies, and every hard update copies the untrained
  Q-network over the target: nothing ever trains. The greedy policy stays the random init's. Root cause:
  frozen_parameters (the Q-network's parameters receive gradients but are never updated; the fix puts them in the
  optimizer). Competing fixes a user tries first: a 10x larger LR and the Huber loss (CleanRL's Atari variant
  and the PyTorch tutorial use SmoothL1). The checkpoint is at env step 3000, once the flat run shows.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="dqn_gridworld",
    kind="rl",
    original="vwxyzjn/cleanrl: cleanrl/dqn.py",
    runs={
        "healthy": Run(cause="healthy", story="CleanRL-style DQN on a 6x6 grid world; checkpoint at env step 2000 "
                                              "of 5000 while the TD loss and the greedy policy still improve."),
        "optimizer_on_target": Run(
            cause="frozen_parameters",
            story="I built Adam over target_network.parameters() by mistake; the agent never learns a path to "
                  "the goal and the Q-values stay those of the initialisation.",
            fix="optimizer_on_q_network",
            competing=("lr_x10", "huber_loss"),
        ),
    },
)

SIZE = 6
WALLS = {(2, 2), (3, 2)}
GOAL = (5, 5)
MAX_STEPS = 40
N_ACTIONS = 4
MOVES = [(-1, 0), (1, 0), (0, -1), (0, 1)]

TOTAL_TIMESTEPS = 5000
LEARNING_STARTS = 500
TRAIN_FREQUENCY = 2
BATCH_SIZE = 64
TARGET_NETWORK_FREQUENCY = 100
BUFFER_SIZE = 5000
GAMMA = 0.99
LR = 1e-3
START_E, END_E, EXPLORATION_FRACTION = 1.0, 0.05, 0.5


class GridWorld:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.free = [(r, c) for r in range(SIZE) for c in range(SIZE) if (r, c) not in WALLS and (r, c) != GOAL]

    def _obs(self):
        return np.array([self.pos[0], self.pos[1], GOAL[0], GOAL[1]], dtype=np.float32) / (SIZE - 1)

    def reset(self, start=None):
        self.pos = start if start is not None else self.free[self.rng.integers(len(self.free))]
        self.t = 0
        return self._obs()

    def step(self, a):
        r, c = self.pos[0] + MOVES[a][0], self.pos[1] + MOVES[a][1]
        if 0 <= r < SIZE and 0 <= c < SIZE and (r, c) not in WALLS:
            self.pos = (r, c)
        self.t += 1
        terminated = self.pos == GOAL
        truncated = self.t >= MAX_STEPS
        return self._obs(), (1.0 if terminated else -0.01), terminated, truncated


class QNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.network = nn.Sequential(nn.Linear(4, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                                     nn.Linear(84, N_ACTIONS))

    def forward(self, x):
        return self.network(x)


def linear_schedule(start_e, end_e, duration, t):
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


def _build(run, seed, variant):
    torch.manual_seed(seed)
    q_network = QNetwork()
    target_network = QNetwork()
    target_network.load_state_dict(q_network.state_dict())
    agent = nn.ModuleDict({"q_network": q_network, "target_network": target_network})
    lr = LR * (10 if variant == "lr_x10" else 1)
    wrong = run == "optimizer_on_target" and variant != "optimizer_on_q_network"
    optimizer = torch.optim.Adam((target_network if wrong else q_network).parameters(), lr=lr)
    return agent, optimizer


def _make_loss(huber: bool):
    def td_loss(agent, data):
        with torch.no_grad():
            target_max, _ = agent["target_network"](data["next_observations"]).max(dim=1)
            td_target = data["rewards"].flatten() + GAMMA * target_max * (1 - data["dones"].flatten())
        old_val = agent["q_network"](data["observations"]).gather(1, data["actions"]).squeeze()
        return (F.smooth_l1_loss if huber else F.mse_loss)(td_target, old_val)
    return td_loss


class ReplayBuffer:
    def __init__(self, size, seed):
        self.obs = np.zeros((size, 4), np.float32)
        self.next_obs = np.zeros((size, 4), np.float32)
        self.actions = np.zeros((size, 1), np.int64)
        self.rewards = np.zeros((size, 1), np.float32)
        self.dones = np.zeros((size, 1), np.float32)
        self.size, self.n, self.i = size, 0, 0
        self.rng = np.random.default_rng(seed)

    def add(self, o, no, a, r, d):
        self.obs[self.i], self.next_obs[self.i], self.actions[self.i] = o, no, a
        self.rewards[self.i], self.dones[self.i] = r, d
        self.i = (self.i + 1) % self.size
        self.n = min(self.n + 1, self.size)

    def sample(self, batch_size):
        idx = self.rng.integers(0, self.n, batch_size)
        return {"observations": torch.from_numpy(self.obs[idx]), "actions": torch.from_numpy(self.actions[idx]),
                "rewards": torch.from_numpy(self.rewards[idx]),
                "next_observations": torch.from_numpy(self.next_obs[idx]), "dones": torch.from_numpy(self.dones[idx])}


def evaluate(q_network) -> tuple[float, float]:
    """Greedy policy from every free start cell: share that reaches the goal, mean steps taken."""
    env = GridWorld(0)
    solved, steps = 0, []
    for start in env.free:
        obs = env.reset(start)
        for t in range(MAX_STEPS):
            with torch.no_grad():
                a = int(q_network(torch.from_numpy(obs)[None]).argmax())
            obs, _, term, trunc = env.step(a)
            if term:
                solved += 1
                break
        steps.append(env.t)
    return solved / len(env.free), float(np.mean(steps))


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    agent, optimizer = _build(run, seed, variant)
    q_network, target_network = agent["q_network"], agent["target_network"]
    loss_fn = _make_loss(variant == "huber_loss")
    env = GridWorld(seed)
    rb = ReplayBuffer(BUFFER_SIZE, seed)
    rng = np.random.default_rng(seed + 7)
    obs = env.reset()
    losses, q_means = [], []
    ckpt_step = 2000 if run == "healthy" else 3000
    ckpt = out_dir / "dqn_gridworld.pt"
    for global_step in range(1, TOTAL_TIMESTEPS + 1):
        epsilon = linear_schedule(START_E, END_E, EXPLORATION_FRACTION * TOTAL_TIMESTEPS, global_step)
        if rng.random() < epsilon:
            action = int(rng.integers(N_ACTIONS))
        else:
            with torch.no_grad():
                action = int(q_network(torch.from_numpy(obs)[None]).argmax())
        next_obs, reward, term, trunc = env.step(action)
        rb.add(obs, next_obs, action, reward, float(term))
        obs = env.reset() if (term or trunc) else next_obs
        if global_step > LEARNING_STARTS:
            if global_step % TRAIN_FREQUENCY == 0:
                data = rb.sample(BATCH_SIZE)
                loss = loss_fn(agent, data)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
            if global_step % TARGET_NETWORK_FREQUENCY == 0:
                target_network.load_state_dict(q_network.state_dict())
        if global_step == ckpt_step:
            torch.save({"model": agent.state_dict(), "optimizer": optimizer.state_dict(),
                        "global_step": global_step}, ckpt)
    solved, steps = evaluate(q_network)
    return Trained(checkpoint=ckpt, train_losses=losses, metrics={"solved": solved, "greedy_steps": steps})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if run == "healthy":
        if m["solved"] < 0.9:
            return f"healthy run failed: greedy policy reaches the goal from {m['solved']:.0%} of start cells"
        return None
    if m["solved"] < 0.5:
        return (f"after {TOTAL_TIMESTEPS} env steps the greedy policy reaches the goal from {m['solved']:.0%} of "
                f"start cells (mean {m['greedy_steps']:.0f} steps)")
    return None


def _setup(run: str):
    import triage

    torch.set_num_threads(1)
    agent, optimizer = _build(run, 0, None)
    env = GridWorld(10_000)
    rb = ReplayBuffer(BUFFER_SIZE, 10_000)
    rng = np.random.default_rng(10_000)
    obs = env.reset()
    for _ in range(BUFFER_SIZE):
        a = int(rng.integers(N_ACTIONS))
        nxt, r, term, trunc = env.step(a)
        rb.add(obs, nxt, a, r, float(term))
        obs = env.reset() if (term or trunc) else nxt
    batches = [rb.sample(BATCH_SIZE) for _ in range(48)]
    return triage.Setup(model=agent, optimizer=optimizer, loss_fn=_make_loss(False), batches=batches,
                        total_steps=(TOTAL_TIMESTEPS - LEARNING_STARTS) // TRAIN_FREQUENCY)


def setup_healthy():
    return _setup("healthy")


def setup_optimizer_on_target():
    return _setup("optimizer_on_target")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    for r in PROGRAM.runs:
        for v in (None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing):
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                tr = train(r, Path(d), int(sys.argv[1]) if len(sys.argv) > 1 else 0, v)
                print(r, v, f"{time.perf_counter() - t0:.1f}s", tr.metrics, symptom(r, tr),
                      [round(x, 4) for x in tr.train_losses[::300]])
