"""Advantage actor-critic (shared body, actor and critic heads) on a CartPole written in numpy.

Follows pytorch/examples reinforcement_learning/actor_critic.py (read through the code search): a `Policy` with a
shared `affine1` = Linear(4, 128) + ReLU, an `action_head` (softmax over 2 actions) and a `value_head`; episodes
are rolled out with the sampled action's log_prob and the state value kept, the discounted returns-to-go
(gamma=0.99) are computed at the episode's end, the advantage is `R - value.item()` (no gradient into the critic
through the policy term), and the loss is the sum of the policy losses `-log_prob * advantage` and the value
losses, minimised with Adam in one step. As in CleanRL's a2c/ppo value loss, the critic regresses the RAW returns
with a squared error (the example's returns standardisation and smooth-L1 are not used). Episodes are batched
(8 vectorised CartPoles per update, the sums divided by 8). gymnasium is not available, so CartPole-v0 (200-step
limit) is written here in numpy.

Data handed to triage: rollouts gathered into batches `(obs, actions, returns)` (one batch = one update's 8
episodes, flattened), 48 of them, recollected cheaply in setup() with a fixed behaviour policy (a pole-balancing
rule with 65% random actions, episodes of ~60 steps).

Runs
- healthy: Adam(lr=5e-3); the checkpoint is taken at update 25 of 90 while the return is still rising (~90 then,
  ~150-190 at the end). The combined loss is dominated by the critic's squared error on returns of up to ~90 and
  is not a quantity that goes to 0.
- lr_too_high: the user ran it at lr=5e-2 (the example's 3e-2 felt slow; they went higher). With the critic's
  squared error on raw returns flowing through the shared layer, the large Adam steps wreck the shared features
  whenever the returns jump: the policy swings to near-deterministic and the return collapses to ~10-30 and does
  not recover. Actor-critic collapse on CartPole is a standard complaint (rlcode/reinforcement-learning issue #58
  "Catastrophic collapse in episode score on cartpole_a3c", where the answer names the learning rate first;
  PacktPublishing TF2 RL Cookbook issue #12: raising the actor-critic LR to 1e-1 breaks it). Root cause: lr_too_high (the
  fix: lr 5e-3). Competing fix a user tries first: clipping the global grad norm at 1.0 (Adam's normalised steps
  stay as large; the collapse stays). Note: the example's smooth-L1 value loss on standardised returns also
  tames it, by shrinking the critic's gradient; the LR is what the run's own loss needs changed.
  The checkpoint is the update-30 one, once the return has fallen back.
"""

from __future__ import annotations

import math
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
    name="a2c_actor_critic",
    kind="rl",
    original="pytorch/examples: reinforcement_learning/actor_critic.py (batched episodes, MSE critic on raw returns)",
    runs={
        "healthy": Run(cause="healthy", story="Actor-critic with a shared body on CartPole at lr 5e-3; checkpoint at "
                                              "update 25 of 90 while the return is still rising."),
        "lr_too_high": Run(
            cause="lr_too_high",
            story="At lr=5e-2 the return rises, then collapses to ~10-30 and never comes back.",
            fix="lr_x0.1",
            competing=("grad_clip_1",),
        ),
    },
)

GAMMA = 0.99
N_ENVS = 8
ITERS = 90
EPS = np.finfo(np.float32).eps.item()


class VecCartPole:
    """CartPole-v0 dynamics (Barto, Sutton & Anderson), n copies stepped together in numpy."""

    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    theta_limit, x_limit = 12 * 2 * math.pi / 360, 2.4

    def __init__(self, n: int, seed: int, max_steps: int = 200):
        self.n, self.max_steps = n, max_steps
        self.rng = np.random.default_rng(seed)
        self.state = np.zeros((n, 4))
        self.t = np.zeros(n, dtype=np.int64)

    def reset(self, idx=None):
        idx = np.arange(self.n) if idx is None else idx
        self.state[idx] = self.rng.uniform(-0.05, 0.05, size=(len(idx), 4))
        self.t[idx] = 0
        return self.state.astype(np.float32)

    def step(self, action):
        x, x_dot, th, th_dot = self.state.T
        force = np.where(action == 1, self.force_mag, -self.force_mag)
        total_mass = self.masspole + self.masscart
        pml = self.masspole * self.length
        cos, sin = np.cos(th), np.sin(th)
        temp = (force + pml * th_dot ** 2 * sin) / total_mass
        th_acc = (self.gravity * sin - cos * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * cos ** 2 / total_mass))
        x_acc = temp - pml * th_acc * cos / total_mass
        x = x + self.tau * x_dot
        x_dot = x_dot + self.tau * x_acc
        th = th + self.tau * th_dot
        th_dot = th_dot + self.tau * th_acc
        self.state = np.stack([x, x_dot, th, th_dot], 1)
        self.t += 1
        terminated = (np.abs(x) > self.x_limit) | (np.abs(th) > self.theta_limit)
        truncated = self.t >= self.max_steps
        return self.state.astype(np.float32), np.ones(self.n, dtype=np.float32), terminated, truncated




class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.affine1 = nn.Linear(4, 128)
        self.action_head = nn.Linear(128, 2)
        self.value_head = nn.Linear(128, 1)

    def forward(self, x):
        x = F.relu(self.affine1(x))
        return F.softmax(self.action_head(x), dim=-1), self.value_head(x)


def a2c_loss(model, batch):
    probs, values = model(batch["obs"])
    values = values.squeeze(1)
    log_prob = torch.log(probs.gather(1, batch["actions"][:, None]).squeeze(1))
    R = batch["returns"]
    advantage = R - values.detach()
    policy_loss = (-log_prob * advantage).sum()
    value_loss = F.mse_loss(values, R, reduction="sum")
    return (policy_loss + value_loss) / N_ENVS


def _lr(run, variant):
    lr = 5e-2 if run == "lr_too_high" else 5e-3
    return lr * (0.1 if variant == "lr_x0.1" else 1.0)


def _build(run, seed, variant):
    torch.manual_seed(seed)
    model = Policy()
    optimizer = torch.optim.Adam(model.parameters(), lr=_lr(run, variant))
    return model, optimizer


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    model, optimizer = _build(run, seed, variant)
    env = VecCartPole(N_ENVS, seed=seed)
    g = torch.Generator().manual_seed(seed)

    def act(obs):
        with torch.no_grad():
            probs, _ = model(torch.from_numpy(obs))
        return torch.multinomial(probs, 1, generator=g).squeeze(1).numpy()

    losses, ep_returns = [], []
    ckpt_it = 25 if run == "healthy" else 30
    ckpt = out_dir / "actor_critic.pt"
    for it in range(1, ITERS + 1):
        batch, rets = collect(env, act)
        loss = a2c_loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        if variant == "grad_clip_1":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        ep_returns.append(float(np.mean(rets)))
        if it == ckpt_it:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iteration": it,
                        "running_reward": float(np.mean(ep_returns[-10:]))}, ckpt)
    return Trained(checkpoint=ckpt, train_losses=losses,
                   metrics={"return_best10": float(max(np.mean(ep_returns[i:i + 10]) for i in range(ITERS - 9))),
                            "return_last10": float(np.mean(ep_returns[-10:]))})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if run == "healthy":
        if m["return_last10"] < 120:
            return f"healthy run failed to learn: mean return over the last 10 updates {m['return_last10']:.0f}"
        return None
    if m["return_last10"] < 100:
        return (f"mean episode return over the last 10 updates {m['return_last10']:.0f} (best 10-update stretch "
                f"{m['return_best10']:.0f}; the healthy run ends at 150-190)")
    return None


def collect(env: VecCartPole, act) -> tuple[dict, list[float]]:
    """Run N_ENVS episodes to their end; return the flattened rollouts and the episode returns."""
    obs = env.reset()
    alive = np.ones(env.n, dtype=bool)
    traj = [[] for _ in range(env.n)]
    while alive.any():
        a = act(obs)
        nxt, rew, term, trunc = env.step(a)
        for i in np.flatnonzero(alive):
            traj[i].append((obs[i], a[i], rew[i], term[i]))
        alive &= ~(term | trunc)
        obs = nxt
    obs_l, act_l, ret_l, ep_l = [], [], [], []
    for i, tr in enumerate(traj):
        R, rets = 0.0, []
        for (_, _, r, _) in reversed(tr):
            R = r + GAMMA * R
            rets.insert(0, R)
        obs_l += [t[0] for t in tr]
        act_l += [t[1] for t in tr]
        ret_l += rets
        ep_l += [i] * len(tr)
    batch = {"obs": torch.tensor(np.array(obs_l)), "actions": torch.tensor(np.array(act_l), dtype=torch.long),
             "returns": torch.tensor(ret_l, dtype=torch.float32), "episode": torch.tensor(ep_l)}
    return batch, [float(len(t)) for t in traj]


def _behaviour(g):
    """A pole-balancing rule with 65% random actions: the data the user saved near the checkpoint."""
    def act(obs):
        rule = (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)
        rnd = torch.randint(0, 2, (len(obs),), generator=g).numpy()
        use_rnd = torch.rand(len(obs), generator=g).numpy() < 0.65
        return np.where(use_rnd, rnd, rule)
    return act


def _setup(run: str):
    import triage

    torch.set_num_threads(1)
    model, optimizer = _build(run, 0, None)
    env = VecCartPole(N_ENVS, seed=10_000)
    act = _behaviour(torch.Generator().manual_seed(10_000))
    batches = [collect(env, act)[0] for _ in range(48)]
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=a2c_loss, batches=batches, total_steps=ITERS)


def setup_healthy():
    return _setup("healthy")


def setup_lr_too_high():
    return _setup("lr_too_high")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    for r in PROGRAM.runs:
        for v in (None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing):
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                tr = train(r, Path(d), int(sys.argv[1]) if len(sys.argv) > 1 else 0, v)
                print(r, v, f"{time.perf_counter() - t0:.1f}s", {k: round(x, 1) for k, x in tr.metrics.items()},
                      symptom(r, tr))
