"""Physics-informed neural network for a damped harmonic oscillator: Adam, then L-BFGS with a closure.

Follows the maziarraissi/PINNs PyTorch ports (the "PhysicsInformedNN" pattern, e.g. the PINNs-in-PyTorch Burgers
notebooks, read through the code search): a tanh MLP with Xavier-normal init, the residual built with
`torch.autograd.grad(..., create_graph=True)` on collocation points, an initial-condition loss, a first Adam phase,
then `torch.optim.LBFGS(params, lr=1.0, max_iter=20, history_size=50, line_search_fn="strong_wolfe")` driven by
`optimizer.step(closure)`, where the closure zeroes the gradients, computes the loss, calls backward and returns
the loss (the pattern of the torch.optim docs: "Some optimization algorithms such as Conjugate Gradient and LBFGS
need to reevaluate the function multiple times, so you have to pass in a closure"). The problem: u'' + 2*zeta*w0*u'
+ w0^2 u = 0 on t in [0, 1], u(0)=1, u'(0)=0, w0=8, zeta=0.1 (exact solution known), 100 fixed collocation points,
the residual scaled by 1/w0^4. The data is full-batch (the collocation set), so triage gets that one batch.

Runs
- healthy: 500 Adam steps (lr 1e-3), then 15 L-BFGS outer steps; the checkpoint is taken after L-BFGS step 4,
  while the loss still falls fast (~3e-2 after Adam, ~4e-5 at the end; the solution's relative L2 error ~0.005).
- closure_without_zero_grad: the user moved `optimizer.zero_grad()` out of the closure, in front of
  `optimizer.step(closure)`, as in the Adam loop above it. L-BFGS calls the closure several times per step (the
  line search); each call now ADDS its gradient to the previous ones, so the line search compares losses with
  gradients of other points, the Wolfe conditions fail and L-BFGS stops where it starts: the loss stays at the
  Adam phase's level for every outer step. Zeroing the gradients inside the closure is the documented pattern,
  and zeroing outside it is a known L-BFGS trap: Lightning-AI/pytorch-lightning issue #4083 ("using LBFGS
  optimizer in pytorch lightning the model is not converging as compared to native pytorch + LBFGS") was caused by
  exactly this (the closure ran 20 times, zero_grad once) and fixed in PR #6147. Root cause: loop_bug (the fix is the step: zero_grad inside the
  closure). Competing fixes a user tries first: a smaller L-BFGS lr (0.1) and more inner iterations (max_iter=100);
  neither makes the accumulated gradient right. The checkpoint is taken after L-BFGS step 6, once the stall shows.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="pinn_lbfgs",
    kind="scientific",
    original="maziarraissi/PINNs PyTorch port pattern (PhysicsInformedNN: Adam then LBFGS with a closure)",
    runs={
        "healthy": Run(cause="healthy", story="PINN for a damped oscillator, Adam then L-BFGS; checkpoint after "
                                              "L-BFGS step 4 of 15 while the loss still falls."),
        "closure_without_zero_grad": Run(
            cause="loop_bug",
            story="After the Adam phase L-BFGS does nothing: the loss stays at 3e-2 step after step. I call "
                  "optimizer.zero_grad() before optimizer.step(closure), not inside the closure.",
            fix="zero_grad_in_closure",
            competing=("lbfgs_lr_0.1", "max_iter_100"),
        ),
    },
)

W0, ZETA = 8.0, 0.1
ADAM_STEPS = 500
LBFGS_STEPS = 15
N_COLLOCATION = 100


def exact(t):
    wd = W0 * math.sqrt(1 - ZETA ** 2)
    return torch.exp(-ZETA * W0 * t) * (torch.cos(wd * t) + ZETA * W0 / wd * torch.sin(wd * t))


class PINN(nn.Module):
    def __init__(self, layers=(1, 32, 32, 32, 1)):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(a, b) for a, b in zip(layers[:-1], layers[1:])])
        for layer in self.layers:
            nn.init.xavier_normal_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, t):
        x = t
        for layer in self.layers[:-1]:
            x = torch.tanh(layer(x))
        return self.layers[-1](x)


def net_f(model, t):
    t = t.clone().requires_grad_(True)
    u = model(t)
    u_t = torch.autograd.grad(u, t, torch.ones_like(u), create_graph=True)[0]
    u_tt = torch.autograd.grad(u_t, t, torch.ones_like(u_t), create_graph=True)[0]
    return u_tt + 2 * ZETA * W0 * u_t + W0 ** 2 * u


def pinn_loss(model, batch):
    t0 = batch["t_0"].clone().requires_grad_(True)
    u0 = model(t0)
    u0_t = torch.autograd.grad(u0, t0, torch.ones_like(u0), create_graph=True)[0]
    f = net_f(model, batch["t_f"])
    return ((u0 - batch["u_0"]) ** 2).mean() + (u0_t ** 2).mean() + (f ** 2).mean() / W0 ** 4


def make_batch():
    return {"t_f": torch.linspace(0, 1, N_COLLOCATION)[:, None], "t_0": torch.zeros(1, 1), "u_0": torch.ones(1, 1)}


def _lbfgs(model, variant):
    return torch.optim.LBFGS(model.parameters(), lr=0.1 if variant == "lbfgs_lr_0.1" else 1.0,
                             max_iter=100 if variant == "max_iter_100" else 20, history_size=50,
                             tolerance_grad=1e-9, tolerance_change=1e-12, line_search_fn="strong_wolfe")


def _make_step(zero_in_closure: bool):
    def train_step(model, optimizer, batch):
        def closure():
            if zero_in_closure:
                optimizer.zero_grad()
            loss = pinn_loss(model, batch)
            loss.backward()
            return loss
        if not zero_in_closure:
            optimizer.zero_grad()
        return optimizer.step(closure)
    return train_step


def _zero_in_closure(run, variant):
    return run != "closure_without_zero_grad" or variant == "zero_grad_in_closure"


def rel_error(model):
    t = torch.linspace(0, 1, 200)[:, None]
    with torch.no_grad():
        return float((model(t) - exact(t)).norm() / exact(t).norm())


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    model = PINN()
    batch = make_batch()
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for it in range(ADAM_STEPS):
        loss = pinn_loss(model, batch)
        adam.zero_grad()
        loss.backward()
        adam.step()
        losses.append(loss.item())
    adam_end = losses[-1]
    lbfgs = _lbfgs(model, variant)
    step_fn = _make_step(_zero_in_closure(run, variant))
    ckpt_at = 4 if run == "healthy" else 6
    ckpt = out_dir / "pinn.pt"
    for k in range(1, LBFGS_STEPS + 1):
        step_fn(model, lbfgs, batch)
        losses.append(pinn_loss(model, batch).item())
        if k == ckpt_at:
            torch.save({"model": model.state_dict(), "optimizer": lbfgs.state_dict(), "step": ADAM_STEPS + k,
                        "phase": "lbfgs"}, ckpt)
    return Trained(checkpoint=ckpt, train_losses=losses,
                   metrics={"adam_end": adam_end, "final": losses[-1], "rel_l2": rel_error(model)})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if run == "healthy":
        if m["rel_l2"] > 0.05:
            return f"healthy run failed: relative L2 error {m['rel_l2']:.3f}, loss {m['adam_end']:.1e} -> {m['final']:.1e}"
        return None
    if m["final"] > 0.5 * m["adam_end"]:
        return (f"L-BFGS made no progress: loss {m['adam_end']:.2e} after Adam, {m['final']:.2e} after "
                f"{LBFGS_STEPS} L-BFGS steps; relative L2 error of the solution {m['rel_l2']:.2f}")
    return None


def _setup(run: str):
    import triage

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = PINN()
    optimizer = _lbfgs(model, None)
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=pinn_loss, batches=[make_batch()],
                        train_step=_make_step(_zero_in_closure(run, None)),
                        total_steps=ADAM_STEPS + LBFGS_STEPS)


def setup_healthy():
    return _setup("healthy")


def setup_closure_without_zero_grad():
    return _setup("closure_without_zero_grad")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    for r in PROGRAM.runs:
        for v in (None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing):
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                tr = train(r, Path(d), int(sys.argv[1]) if len(sys.argv) > 1 else 0, v)
                print(r, v, f"{time.perf_counter() - t0:.1f}s", tr.metrics, symptom(r, tr))
