"""Neural ODE on the cubic spiral, integrated with a fixed-step RK4 solver (torchdiffeq `examples/ode_demo.py`).

Written after rtqichen/torchdiffeq `examples/ode_demo.py` (read through the `search` tool, code corpus: the demo and
several forks of it): the true system dy/dt = (y**3) @ A with A = [[-0.1, 2], [-2, -0.1]] and y0 = [2, 0] is solved
on t in [0, 25] at 1000 points; the model is `ODEFunc`, `Linear(2, 50) -> Tanh -> Linear(50, 2)` applied to
`y**3`, its weights initialised N(0, 0.1) and biases 0; each iteration draws `batch_size=20` random start indices,
integrates `batch_time=10` grid points from each, and minimises the mean absolute error against the true
trajectory with RMSprop lr 1e-3 (the demo calls `odeint(func, batch_y0, batch_t)`). torchdiffeq is not installed,
so the solver here is the fixed-step RK4 (`method='rk4'` with the grid as its steps; the demo's `--method`
also offers fixed-grid solvers), written in a few lines. The batch is a dict `{"y0": (20, 1, 2), "t": (10,),
"y": (10, 20, 1, 2)}`. Validation: the same loss over 40 fixed windows, like the demo's periodic whole-trajectory
test. Checkpoints every 100 iterations, `{"itr", "func_state_dict", "optimizer_state_dict", "loss"}`.

Runs
- healthy (a slow but steady one): the training L1 falls from ~0.09 to below 0.01 within the first hundred
  iterations, then the validation L1 creeps from 0.011 to 0.006 over 1200 iterations; checkpoint at iteration
  500, still improving.
- rmsprop_lr_too_high: the owner raised RMSprop's lr from the demo's 1e-3 to 0.1 "because 2000 iterations is
  too slow". RMSprop normalises every coordinate's step, so each update moves every weight by about lr: the
  cubic vector field is thrown around, and the validation L1 jumps between 0.5 and 2+ (healthy: 0.006). Root
  cause `lr_too_high`: lr x0.1 (`lr_1e-2`) trains to ~0.014. Competing fix a user tries first: clipping the
  gradient norm at 1.0 (`clip_grad_1`), which leaves the loss 5-10x above the healthy run's (RMSprop's step does
  not depend on the gradient's scale). Checkpoint: the last periodic one. I searched the torchdiffeq issues
  for a thread on this; forks of the demo (e.g. a Hessian study of it) raise RMSprop's lr to 1e-2, not further.
- rmsprop_weight_decay: the owner passed `weight_decay=0.1` to RMSprop to "regularise" the ODE function. In
  RMSprop the decay is added to the gradient before normalisation, so on this small-gradient regression it
  dominates: the weights of the vector field collapse toward 0, the model predicts (almost) no motion, and the
  loss sits at 0.09 -- the L1 of predicting y(t) = y0 over a window -- from the first check to the last. Root
  cause `weight_decay_too_high`: wd x0.1 (`wd_x0.1`) trains to ~0.01. Competing fix a user tries: a 10x larger
  lr (`lr_1e-2`), which leaves it at 0.09. Checkpoint: the last periodic one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

try:
    from _program import Program, Run, Trained
except ImportError:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _program import Program, Run, Trained

PROGRAM = Program(
    name="neural_ode_spiral",
    kind="neural ODE",
    original="rtqichen/torchdiffeq: examples/ode_demo.py (ODEFunc on y**3, get_batch windows, RMSprop, L1 loss)",
    runs={
        "healthy": Run(cause="healthy", story="Neural ODE fitting the cubic spiral with fixed-step RK4; the L1 loss "
                       "falls from ~0.09 to ~0.006 (validation ~0.011 -> 0.006, slowly); checkpoint at iteration 500 of 1200."),
        "rmsprop_lr_too_high": Run(
            cause="lr_too_high",
            story="I raised RMSprop's lr from 1e-3 to 0.1 to speed the demo up; the validation L1 jumps between 0.5 "
                  "and 2 and never comes down. Clipping gradients at 1.0 did not fix it.",
            fix="lr_1e-2", competing=("clip_grad_1",)),
        "rmsprop_weight_decay": Run(
            cause="weight_decay_too_high",
            story="I added weight_decay=0.1 to RMSprop to regularise the ODE function; the loss sits at 0.09 from "
                  "the first check on, as if the model predicted no motion. A larger lr did not help.",
            fix="wd_x0.1", competing=("lr_1e-2",)),
    },
)

DATA_SIZE, BATCH_TIME, BATCH_SIZE, NITERS, CKPT_EVERY = 1000, 10, 20, 1200, 100
TRUE_A = torch.tensor([[-0.1, 2.0], [-2.0, -0.1]])


def rk4(func, y0, t):
    ys = [y0]
    y = y0
    for i in range(len(t) - 1):
        h = t[i + 1] - t[i]
        k1 = func(t[i], y)
        k2 = func(t[i] + h / 2, y + h / 2 * k1)
        k3 = func(t[i] + h / 2, y + h / 2 * k2)
        k4 = func(t[i] + h, y + h * k3)
        y = y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        ys.append(y)
    return torch.stack(ys)


class Lambda(nn.Module):
    def forward(self, t, y):
        return torch.mm(y.reshape(-1, 2) ** 3, TRUE_A).reshape(y.shape)


class ODEFunc(nn.Module):
    def __init__(self, init_std=0.1):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 50), nn.Tanh(), nn.Linear(50, 2))
        if init_std is not None:
            for m in self.net.modules():
                if isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, mean=0, std=init_std)
                    nn.init.constant_(m.bias, val=0)

    def forward(self, t, y):
        return self.net(y ** 3)


def true_trajectory():
    t = torch.linspace(0.0, 25.0, DATA_SIZE)
    with torch.no_grad():
        fine = torch.linspace(0.0, 25.0, 4 * (DATA_SIZE - 1) + 1)
        y = rk4(Lambda(), torch.tensor([[2.0, 0.0]]), fine)[::4]
    return t, y  # (1000,), (1000, 1, 2)


def get_batch(t, y, g):
    s = torch.from_numpy(np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=g))).choice(
        np.arange(DATA_SIZE - BATCH_TIME, dtype=np.int64), BATCH_SIZE, replace=False))
    return {"y0": y[s], "t": t[:BATCH_TIME], "y": torch.stack([y[s + i] for i in range(BATCH_TIME)], dim=0)}


def loss_fn(model, batch):
    pred = rk4(model, batch["y0"], batch["t"])
    return torch.mean(torch.abs(pred - batch["y"]))


def config(run, variant):
    lr = 0.1 if run == "rmsprop_lr_too_high" else 1e-3
    init_std = 0.1
    wd = 0.1 if run == "rmsprop_weight_decay" else 0.0
    if variant == "wd_x0.1":
        wd *= 0.1
    if variant == "lr_1e-2":
        lr = 1e-2
    clip = 1.0 if variant == "clip_grad_1" else None
    return lr, init_std, clip, wd


def build(run, variant, seed=0):
    lr, init_std, clip, wd = config(run, variant)
    torch.manual_seed(seed)
    func = ODEFunc(init_std)
    return func, torch.optim.RMSprop(func.parameters(), lr=lr, weight_decay=wd), clip


def val_windows(t, y):
    return [get_batch(t, y, torch.Generator().manual_seed(10_000 + i)) for i in range(40)]


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    t, y = true_trajectory()
    func, opt, clip = build(run, variant, seed)
    val = val_windows(t, y)
    g = torch.Generator().manual_seed(seed)
    ckpt = Path(out_dir) / "ode_demo_ckpt.pt"
    ckpt_itr = 500 if run == "healthy" else NITERS
    losses, vals = [], []
    for itr in range(1, NITERS + 1):
        opt.zero_grad()
        loss = loss_fn(func, get_batch(t, y, g))
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(func.parameters(), clip)
        opt.step()
        losses.append(loss.item())
        if itr % CKPT_EVERY == 0:
            with torch.no_grad():
                vals.append(float(np.mean([loss_fn(func, b).item() for b in val])))
            if itr <= ckpt_itr and np.isfinite(losses[-1]) and all(
                    torch.isfinite(p).all() for p in func.parameters()):
                torch.save({"itr": itr, "func_state_dict": func.state_dict(),
                            "optimizer_state_dict": opt.state_dict(), "loss": losses[-1]}, ckpt)
    finite = [v if np.isfinite(v) else 1e9 for v in vals]
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=vals,
                   metrics={"first": float(np.mean(losses[:5])), "last": float(np.mean(finite[-3:])),
                            "best": float(min(finite))})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if m["last"] > 0.04 or not np.isfinite(m["last"]):
        return (f"validation L1 {m['last']:.3f} over the last 3 checks of {NITERS} iterations (best {m['best']:.3f}; "
                f"a healthy run reaches ~0.01), first train losses {m['first']:.3f}")
    return None


def _setup(run):
    import triage

    t, y = true_trajectory()
    func, opt, clip = build(run, None, 0)
    g = torch.Generator().manual_seed(0)
    return triage.Setup(model=func, optimizer=opt, loss_fn=loss_fn, batches=[get_batch(t, y, g) for _ in range(60)],
                        val_batches=val_windows(t, y), grad_clip=clip)


def setup_healthy():
    return _setup("healthy")


def setup_rmsprop_lr_too_high():
    return _setup("rmsprop_lr_too_high")


def setup_rmsprop_weight_decay():
    return _setup("rmsprop_weight_decay")
