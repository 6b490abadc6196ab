"""PPO (clipped surrogate, GAE, value loss, entropy bonus) on a CartPole written in numpy, after CleanRL's ppo.py.

Follows vwxyzjn/cleanrl cleanrl/ppo.py (its layout as read through the code search and known from the file): an
`Agent` with separate critic and actor MLPs (64-64 tanh, orthogonal init with std sqrt(2), 1.0 for the value head
and 0.01 for the policy head), `num_envs` vectorised envs x `num_steps` rollout steps into a buffer, GAE(gamma=0.99,
lambda=0.95), `update_epochs`=4 epochs over `num_minibatches`=4 shuffled minibatches, advantages normalised per
minibatch, the clipped surrogate (clip_coef 0.2), the clipped value loss (`clip_vloss`), `ent_coef`=0.01,
`vf_coef`=0.5, `clip_grad_norm_(agent.parameters(), max_grad_norm=0.5)`, Adam(eps=1e-5) and linear LR annealing
over `num_iterations`. CleanRL writes the anneal as `lrnow = (1 - (iteration-1)/num_iterations) * lr` set in the
param group; here it is the same schedule as a `LambdaLR` stepped once per iteration. gymnasium is not available:
CartPole-v0 (200-step limit, auto-reset) is written in numpy. The learning rate is 2.5e-3 (CleanRL's 2.5e-4 is tuned
for 500k steps; this run has 20k).

Data handed to triage: minibatch dicts of the rollout buffer (obs, actions, logprobs, advantages, returns, values),
48 of them, collected by a fixed behaviour policy (a pole-balancing rule with 65% random actions, whose log-probs
are stored as the buffer's `logprobs`) and the freshly built critic's values, since the real buffer is regenerated
each iteration.

Runs
- healthy: CleanRL's loop; the checkpoint is taken at iteration 10 of 40 while the return is still rising.
- anneal_per_minibatch: the user moved the LR anneal into the minibatch loop, next to `optimizer.step()`
  (`scheduler.step()` there, as per-step schedules are usually stepped), while `num_iterations` still counts
  rollout iterations. With 4 epochs x 4 minibatches the LR reaches 0 after 1/16 of the run (iteration 3 of 40)
  and the agent barely gets past random play. Stepping a schedule written in one unit (here rollout iterations)
  at a finer loop level (per minibatch) is the classic scheduler-placement pitfall, the same as stepping an
  epoch-based StepLR once per batch; I found no public thread about this exact PPO variant, so the story is that
  generic pitfall applied to CleanRL's anneal. Root cause: lr_schedule_decayed (the fix is the schedule:
  step it once per iteration). Competing fixes a user tries first: a 3x larger LR (the schedule still kills it)
  and dropping the max_grad_norm=0.5 clip (suspected of holding the updates back; the LR is still 0).
  The checkpoint is the iteration-15 one, once the return is flat.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from torch.distributions.categorical import Categorical

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="ppo_cartpole",
    kind="rl",
    original="vwxyzjn/cleanrl: cleanrl/ppo.py",
    runs={
        "healthy": Run(cause="healthy", story="CleanRL-style PPO on CartPole; checkpoint at iteration 10 of 40 "
                                              "while the return is still rising. The PPO loss (surrogate + value "
                                              "- entropy) is not a quantity that goes to 0."),
        "anneal_per_minibatch": Run(
            cause="lr_schedule_decayed",
            story="I put the linear LR anneal (scheduler.step()) inside the minibatch loop; the agent stays at "
                  "random-play returns (~20) the whole run.",
            fix="anneal_per_iteration",
            competing=("lr_x3", "no_grad_clip"),
        ),
    },
)

NUM_ENVS = 8
NUM_STEPS = 64
TOTAL_TIMESTEPS = 20_480            # 40 iterations
LR = 2.5e-3
GAMMA, GAE_LAMBDA = 0.99, 0.95
NUM_MINIBATCHES, UPDATE_EPOCHS = 4, 4
CLIP_COEF, ENT_COEF, VF_COEF, MAX_GRAD_NORM = 0.2, 0.01, 0.5, 0.5
BATCH_SIZE = NUM_ENVS * NUM_STEPS
MINIBATCH_SIZE = BATCH_SIZE // NUM_MINIBATCHES

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


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self):
        super().__init__()
        self.critic = nn.Sequential(layer_init(nn.Linear(4, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(),
                                    layer_init(nn.Linear(64, 1), std=1.0))
        self.actor = nn.Sequential(layer_init(nn.Linear(4, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(),
                                   layer_init(nn.Linear(64, 2), std=0.01))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        logits = self.actor(x)
        probs = Categorical(logits=logits, validate_args=False)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def ppo_loss(agent, mb):
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(mb["obs"], mb["actions"])
    logratio = newlogprob - mb["logprobs"]
    ratio = logratio.exp()
    adv = mb["advantages"]
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg_loss = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - CLIP_COEF, 1 + CLIP_COEF)).mean()
    newvalue = newvalue.view(-1)
    v_unclipped = (newvalue - mb["returns"]) ** 2
    v_clipped = mb["values"] + torch.clamp(newvalue - mb["values"], -CLIP_COEF, CLIP_COEF)
    v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - mb["returns"]) ** 2).mean()
    return pg_loss - ENT_COEF * entropy.mean() + v_loss * VF_COEF


def _num_iterations(variant):
    return (TOTAL_TIMESTEPS * (2 if variant == "timesteps_x2" else 1)) // BATCH_SIZE


def _build(seed, variant):
    torch.manual_seed(seed)
    agent = Agent()
    lr = LR * (3 if variant == "lr_x3" else 1)
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5)
    n = _num_iterations(variant)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: max(0.0, 1.0 - k / n))
    return agent, optimizer, scheduler


def _per_minibatch(run, variant):
    return run == "anneal_per_minibatch" and variant != "anneal_per_iteration"


def _rollout(agent_or_policy, env, obs, g, gae_agent):
    """NUM_STEPS steps of NUM_ENVS envs; returns the flattened buffer, the next obs and finished episode lengths."""
    obs_b = torch.zeros(NUM_STEPS, NUM_ENVS, 4)
    act_b = torch.zeros(NUM_STEPS, NUM_ENVS, dtype=torch.long)
    logp_b = torch.zeros(NUM_STEPS, NUM_ENVS)
    rew_b = torch.zeros(NUM_STEPS, NUM_ENVS)
    done_b = torch.zeros(NUM_STEPS, NUM_ENVS)
    val_b = torch.zeros(NUM_STEPS, NUM_ENVS)
    next_done = torch.zeros(NUM_ENVS)
    lengths = []
    for t in range(NUM_STEPS):
        o = torch.from_numpy(obs)
        obs_b[t], done_b[t] = o, next_done
        with torch.no_grad():
            action, logp, value = agent_or_policy(o, g)
            val_b[t] = value.flatten()
        act_b[t], logp_b[t] = action, logp
        obs, rew, term, trunc = env.step(action.numpy())
        rew_b[t] = torch.from_numpy(rew)
        done = term | trunc
        if done.any():
            lengths += [float(x) for x in env.t[done]]
            obs = env.reset(np.flatnonzero(done))
        next_done = torch.from_numpy(done.astype(np.float32))
    with torch.no_grad():
        next_value = gae_agent.get_value(torch.from_numpy(obs)).reshape(1, -1)
        adv = torch.zeros_like(rew_b)
        lastgaelam = 0
        for t in reversed(range(NUM_STEPS)):
            if t == NUM_STEPS - 1:
                nextnonterminal, nextvalues = 1.0 - next_done, next_value
            else:
                nextnonterminal, nextvalues = 1.0 - done_b[t + 1], val_b[t + 1]
            delta = rew_b[t] + GAMMA * nextvalues * nextnonterminal - val_b[t]
            adv[t] = lastgaelam = delta + GAMMA * GAE_LAMBDA * nextnonterminal * lastgaelam
        returns = adv + val_b
    buf = {"obs": obs_b.reshape(-1, 4), "actions": act_b.reshape(-1), "logprobs": logp_b.reshape(-1),
           "advantages": adv.reshape(-1), "returns": returns.reshape(-1), "values": val_b.reshape(-1)}
    return buf, obs, lengths


def _minibatches(buf, g):
    idx = torch.randperm(BATCH_SIZE, generator=g)
    return [{k: v[idx[s:s + MINIBATCH_SIZE]] for k, v in buf.items()} for s in range(0, BATCH_SIZE, MINIBATCH_SIZE)]


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    agent, optimizer, scheduler = _build(seed, variant)
    per_mb = _per_minibatch(run, variant)
    num_iterations = _num_iterations(variant)
    env = VecCartPole(NUM_ENVS, seed=seed)
    obs = env.reset()
    g = torch.Generator().manual_seed(seed)

    def policy(o, g):
        a, logp, _, value = agent.get_action_and_value(o)
        return a, logp, value

    losses, returns_log, lrs = [], [], []
    ckpt_it = 10 if run == "healthy" else 15
    ckpt = out_dir / "ppo_cartpole.pt"
    step = 0
    for iteration in range(1, num_iterations + 1):
        buf, obs, lengths = _rollout(policy, env, obs, g, agent)
        returns_log.append(float(np.mean(lengths)) if lengths else float("nan"))
        for epoch in range(UPDATE_EPOCHS):
            for mb in _minibatches(buf, g):
                loss = ppo_loss(agent, mb)
                optimizer.zero_grad()
                loss.backward()
                if variant != "no_grad_clip":
                    nn.utils.clip_grad_norm_(agent.parameters(), MAX_GRAD_NORM)
                optimizer.step()
                step += 1
                losses.append(loss.item())
                lrs.append(optimizer.param_groups[0]["lr"])
                if per_mb:
                    scheduler.step()
        if not per_mb:
            scheduler.step()
        if iteration == ckpt_it:
            torch.save({"model": agent.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "step": step, "iteration": iteration}, ckpt)
    r = [x for x in returns_log if x == x]
    return Trained(checkpoint=ckpt, train_losses=losses,
                   metrics={"return_first5": float(np.mean(r[:5])), "return_last5": float(np.mean(r[-5:])),
                            "final_lr": lrs[-1], "iterations": num_iterations})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if run == "healthy":
        if m["return_last5"] < 120:
            return f"healthy run failed to learn: mean return {m['return_first5']:.0f} -> {m['return_last5']:.0f}"
        return None
    if m["return_last5"] < 100:
        return (f"mean episode return {m['return_first5']:.0f} -> {m['return_last5']:.0f} over "
                f"{m['iterations']} iterations (random play ~22); LR now {m['final_lr']:.1e}")
    return None


P_RANDOM = 0.65


def _behaviour(o, g):
    rule = (o[:, 2] + 0.5 * o[:, 3] > 0).long()
    rnd = torch.randint(0, 2, (len(o),), generator=g)
    use_rnd = torch.rand(len(o), generator=g) < P_RANDOM
    a = torch.where(use_rnd, rnd, rule)
    p = torch.where(a == rule, 1 - P_RANDOM / 2, P_RANDOM / 2)
    return a, p.log(), _BEHAVIOUR_CRITIC[0].get_value(o)


_BEHAVIOUR_CRITIC = [None]


def _setup(run: str):
    import triage

    torch.set_num_threads(1)
    agent, optimizer, scheduler = _build(0, None)
    per_mb = _per_minibatch(run, None)
    env = VecCartPole(NUM_ENVS, seed=10_000)
    obs = env.reset()
    g = torch.Generator().manual_seed(10_000)
    _BEHAVIOUR_CRITIC[0] = agent
    batches = []
    for _ in range(3):                      # three rollout buffers, each seen for UPDATE_EPOCHS shuffled epochs
        buf, obs, _ = _rollout(_behaviour, env, obs, g, agent)
        for _epoch in range(UPDATE_EPOCHS):
            batches += _minibatches(buf, g)
    spi = UPDATE_EPOCHS * NUM_MINIBATCHES
    return triage.Setup(
        model=agent, optimizer=optimizer, loss_fn=ppo_loss, batches=batches, scheduler=scheduler,
        grad_clip=MAX_GRAD_NORM,
        scheduler_interval="step" if per_mb else "epoch", steps_per_epoch=None if per_mb else spi,
        total_steps=_num_iterations(None) * spi,
    )


def setup_healthy():
    return _setup("healthy")


def setup_anneal_per_minibatch():
    return _setup("anneal_per_minibatch")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    for r in PROGRAM.runs:
        for v in (None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing):
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                tr = train(r, Path(d), int(sys.argv[1]) if len(sys.argv) > 1 else 0, v)
                print(r, v, f"{time.perf_counter() - t0:.1f}s", {k: round(x, 4) for k, x in tr.metrics.items()},
                      symptom(r, tr))
