"""REINFORCE (Monte-Carlo policy gradient) on a CartPole written in numpy.

Follows pytorch/examples reinforcement_learning/reinforce.py (read through the code search: `Policy` is
Linear(4,128)-Dropout-ReLU-Linear(128,2)-softmax, `select_action` samples a `Categorical` and keeps its log_prob,
`finish_episode` walks the rewards backwards into discounted returns-to-go with gamma=0.99, standardises them with
`(R - mean) / (std + eps)`, and minimises `sum(-log_prob * R)` with Adam(lr=1e-2)) and CleanRL-style batching:
several episodes are rolled out together (8 vectorised CartPoles) and one Adam step is taken per batch of episodes.
gymnasium is not available, so CartPole-v0 (200-step limit) is written here in numpy with the classic dynamics.
The surrogate loss `-(log_prob * normalised return).mean()` is negative or positive by nature and has no floor of 0:
the healthy run is judged by the episode return, not by the loss going to zero.

Data handed to triage: rollouts gathered into batches `(obs, actions, returns)` (one batch = one iteration's 8
episodes, flattened), as a user would save them from the collection loop. setup() recollects 48 such batches
cheaply with a fixed behaviour policy (a pole-balancing rule with 65% random actions, episodes of ~60 steps, about the
checkpoint's skill).

Runs
- healthy: the example's loss; the checkpoint is taken at iteration 12 of 90 while the return is still rising
  (~50 then, ~190 by the end).
- loss_sign_flipped: the user wrote the objective as the thing to maximise, `loss = (log_prob * R).mean()`, and
  handed it to `loss.backward(); optimizer.step()`, which minimises it. The policy is pushed towards the actions
  with below-average return, so episodes get SHORTER: the mean return falls from ~22 (random) to ~10. This is the
  classic REINFORCE sign error: the minus sign that turns the maximised objective into a loss is what users
  ask about (openai/spinningup issue #436 "Why is there a minus sign in the loss function of simplest policy
  gradient", kengz/SLM-Lab issue #437 on the REINFORCE loss's sign against the reward). Root cause: wrong_loss (the fix is the loss: negate it). Competing fixes a user tries first: a
  3x lower LR (it still learns the wrong thing, more slowly) and normalising the returns over the whole batch
  instead (the sign is still wrong). The checkpoint is the one at iteration 40, once the return has collapsed.
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
    name="reinforce_cartpole",
    kind="rl",
    original="pytorch/examples: reinforcement_learning/reinforce.py (+ CleanRL-style batched episodes)",
    runs={
        "healthy": Run(cause="healthy", story="REINFORCE on CartPole with normalised returns-to-go; checkpoint at "
                                              "iteration 12 of 90 while the return is still rising. The loss "
                                              "is a surrogate that hovers around 0, sometimes negative."),
        "loss_sign_flipped": Run(
            cause="wrong_loss",
            story="I wrote loss = (log_prob * returns).mean() as the objective and called backward on it; the "
                  "episodes got shorter and shorter (return 22 -> 10).",
            fix="negate_loss",
            competing=("lr_x0.3", "batch_norm_returns"),
        ),
    },
)

GAMMA = 0.99
N_ENVS = 8
ITERS = 90
LR = 1e-2
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
        self.affine2 = nn.Linear(128, 2)

    def forward(self, x):
        return F.softmax(self.affine2(F.relu(self.affine1(x))), dim=-1)


def _flipped(run, variant):
    return run == "loss_sign_flipped" and variant != "negate_loss"


def _normalise(returns, episode_ids, per_batch):
    """The example standardises the returns of each episode; `per_batch` standardises over the whole batch."""
    if per_batch:
        return (returns - returns.mean()) / (returns.std() + EPS)
    out = torch.empty_like(returns)
    for e in episode_ids.unique():
        m = episode_ids == e
        r = returns[m]
        out[m] = (r - r.mean()) / (r.std(unbiased=False) + EPS) if m.sum() > 1 else r - r.mean()
    return out


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


def _policy_act(policy, g):
    def act(obs):
        with torch.no_grad():
            probs = policy(torch.from_numpy(obs))
        return torch.multinomial(probs, 1, generator=g).squeeze(1).numpy()
    return act


def _make_loss(flipped: bool, per_batch: bool):
    def loss_fn(model, batch):
        probs = model(batch["obs"])
        log_prob = torch.log(probs.gather(1, batch["actions"][:, None]).squeeze(1))
        R = _normalise(batch["returns"], batch["episode"], per_batch)
        if flipped:
            return (log_prob * R).mean()          # "maximise log_prob * R" ... handed to a minimiser
        return (-log_prob * R).mean()
    return loss_fn


def _build(seed, variant):
    torch.manual_seed(seed)
    policy = Policy()
    lr = LR * (0.3 if variant == "lr_x0.3" else 1.0)
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    return policy, optimizer


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    policy, optimizer = _build(seed, variant)
    loss_fn = _make_loss(_flipped(run, variant), variant == "batch_norm_returns")
    env = VecCartPole(N_ENVS, seed=seed)
    g = torch.Generator().manual_seed(seed)
    act = _policy_act(policy, g)
    losses, ep_returns = [], []
    ckpt = out_dir / "reinforce_cartpole.pt"
    for it in range(1, ITERS + 1):
        batch, rets = collect(env, act)
        loss = loss_fn(policy, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        ep_returns.append(float(np.mean(rets)))
        if it == (12 if run == "healthy" else 40):
            torch.save({"model": policy.state_dict(), "optimizer": optimizer.state_dict(), "iteration": it,
                        "running_reward": float(np.mean(ep_returns[-10:]))}, ckpt)
    return Trained(checkpoint=ckpt, train_losses=losses,
                   metrics={"return_first10": float(np.mean(ep_returns[:10])),
                            "return_at_ckpt": float(np.mean(ep_returns[(2 if run == "healthy" else 30):(12 if run == "healthy" else 40)])),
                            "return_last10": float(np.mean(ep_returns[-10:]))})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if run == "healthy":
        if m["return_last10"] < 100:
            return f"healthy run failed to learn: mean return {m['return_first10']:.0f} -> {m['return_last10']:.0f}"
        return None
    if m["return_last10"] < 15:
        return (f"mean episode return fell from {m['return_first10']:.1f} to {m['return_last10']:.1f} "
                f"over {ITERS} iterations (random play scores ~22)")
    return None


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
    policy, optimizer = _build(0, None)
    env = VecCartPole(N_ENVS, seed=10_000)
    act = _behaviour(torch.Generator().manual_seed(10_000))
    batches = [collect(env, act)[0] for _ in range(48)]
    return triage.Setup(model=policy, optimizer=optimizer, loss_fn=_make_loss(_flipped(run, None), False),
                        batches=batches, total_steps=ITERS)


def setup_healthy():
    return _setup("healthy")


def setup_loss_sign_flipped():
    return _setup("loss_sign_flipped")


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
