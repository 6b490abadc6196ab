"""MAML on sinusoid regression, second order, with a meta-Adam over batches of tasks.

What it does: the sinusoid benchmark of Finn et al. (2017). A task is y = A sin(x - phase) with A in
[0.1, 5.0] and phase in [0, pi], x in [-5, 5]; each task gives K=10 support points and K=10 query points.
A 1-40-40-1 ReLU MLP is meta-learned: for every task of a meta-batch of 25, a few SGD steps (inner lr 0.01)
on the task's support MSE give fast weights (`torch.autograd.grad(..., create_graph=True)`, so the meta
gradient is second order), the query MSE under the fast weights is the task's meta-loss, and Adam (lr 1e-3)
steps the initial weights on the mean query loss of the meta-batch.

Public originals read (with the `search` tool, code corpus): tristandeleu/pytorch-maml (`train.py`,
`maml/metalearners/maml.py`: `adapt()` builds fast weights with `gradient_update_parameters`, the outer loop
`outer_loss.div_(num_tasks); outer_loss.backward(); meta_optimizer.step()`, the batch as a dict of
`train`/`test` inputs and targets with a leading task dimension, the model saved as a bare `state_dict()` in
`model.th`) and dragen1860/MAML-Pytorch (`meta.py`: `fast_weights = list(map(lambda p: p[1] - update_lr *
p[0], zip(grad, net.parameters())))`, several inner steps, `meta_optim = Adam(lr=1e-3)`). Here the fast
weights carry a leading task dimension so the 25 tasks adapt in one batched forward (the per-task gradients
come from one `autograd.grad` of the summed per-task support losses): the same maths as looping over tasks.

The step is not a plain forward/backward: the loss is the query loss after an inner loop that differentiates
inside itself, so `setup_*()` passes the run's own `train_step`.

Runs
- healthy: the run as published (inner loop from the live parameters). The post-adaptation query MSE falls
  from ~4 (predicting the mean of a task with E[A^2]/2 ~ 4.2) and is still falling at the checkpoint
  (iteration 1,200 of a planned 20,000); its floor is well above 0 early in meta-training.
- fast_weights_detached (cause `no_gradient_flow`): the owner rewrote the inner loop with "leaf" fast
  weights, `{n: p.detach().clone().requires_grad_(True)}`, because `torch.autograd.grad` on a fresh copy
  felt safer than differentiating through `model.parameters()` (and some recipes warn that in-place updates
  of the live parameters break the graph). The copy is cut from the model's parameters: the query loss has
  no path back to them, their `.grad` stays None, Adam skips them, and the meta-loss stays flat at the level
  of the random initialisation adapted for three steps. Real users hit exactly this: "MAML inner-loop
  `param.data -=` detaches the graph -- the meta-model never trains" (KanishJebaMathewM/Truxify issue
  #13118), dragen1860/MAML-Pytorch issue #47 ("any load operation or attempt to backprop in an alternative
  network would remove the computational graph"), katerakelly/pytorch-maml issue #21 ("the grad can not
  backward and parameters cannot update"). The decisive experiment is that the parameters that should train
  get no gradient from the objective (a detached graph): `no_gradient_flow`. Fix (`no_detach`): build the
  fast weights from the parameters themselves. Competing: the meta-LR ×10 (`meta_lr_x10`, what an owner
  who sees a flat curve tries first) and a larger inner step (`inner_lr_x5`): both leave the loss flat.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

try:
    from _program import Program, Run, Trained
except ImportError:  # imported by path from elsewhere
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _program import Program, Run, Trained

PROGRAM = Program(
    name="maml_sinusoid",
    kind="meta-learning",
    original="tristandeleu/pytorch-maml train.py + maml/metalearners/maml.py; dragen1860/MAML-Pytorch meta.py",
    runs={
        "healthy": Run(cause="healthy", story=(
            "Second-order MAML on sinusoids, 3 inner SGD steps, meta-Adam 1e-3 over 25 tasks; the "
            "post-adaptation query MSE falls from ~4 and is still falling at the checkpoint.")),
        "fast_weights_detached": Run(
            cause="no_gradient_flow",
            story=("I built the fast weights as detached leaf copies of the parameters so that autograd.grad "
                   "would work on them; the meta-loss never moved from ~4 over 1,200 meta-iterations, and "
                   "raising the meta learning rate changed nothing."),
            fix="no_detach", competing=("meta_lr_x10", "inner_lr_x5")),
    },
)

META_BATCH = 25          # tasks per meta-batch (Finn et al.: 25 for sinusoid)
K_SHOT = 10              # support points per task
K_QUERY = 10             # query points per task
INNER_STEPS = 3          # inner SGD steps while meta-training
INNER_LR = 0.01          # inner step size
META_LR = 1e-3           # meta-Adam
ITERS = 1200             # meta-iterations to the checkpoint
PLANNED_ITERS = 20000    # the run's planned length
LOG_EVERY = 10           # one logged loss per 10 meta-iterations
SNAPSHOT = 48            # meta-batches handed to triage


# ----------------------------------------------------------------------------------------------- the data
def sample_tasks(gen: torch.Generator, n_tasks: int = META_BATCH) -> dict[str, torch.Tensor]:
    """One meta-batch: a dict of support (`train_*`) and query (`test_*`) sets with a leading task dim."""
    amp = torch.empty(n_tasks, 1, 1).uniform_(0.1, 5.0, generator=gen)
    phase = torch.empty(n_tasks, 1, 1).uniform_(0.0, math.pi, generator=gen)
    xs = torch.empty(n_tasks, K_SHOT, 1).uniform_(-5.0, 5.0, generator=gen)
    xq = torch.empty(n_tasks, K_QUERY, 1).uniform_(-5.0, 5.0, generator=gen)
    return {"train_inputs": xs, "train_targets": amp * torch.sin(xs - phase),
            "test_inputs": xq, "test_targets": amp * torch.sin(xq - phase)}


def snapshot(seed: int = 0, n: int = SNAPSHOT) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(10_000 + seed)
    return [sample_tasks(gen) for _ in range(n)]


# ---------------------------------------------------------------------------------------------- the model
class SineMLP(nn.Module):
    """The 1-40-40-1 ReLU regressor of the MAML paper, with a functional forward over (batched) weights."""

    def __init__(self, hidden: int = 40):
        super().__init__()
        self.features = nn.Sequential(OrderedDict([
            ("layer1", nn.Linear(1, hidden)), ("relu1", nn.ReLU()),
            ("layer2", nn.Linear(hidden, hidden)), ("relu2", nn.ReLU()),
        ]))
        self.regressor = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor, params: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        if params is None:
            params = OrderedDict(self.named_parameters())
        h = x
        for name in ("features.layer1", "features.layer2", "regressor"):
            w, b = params[f"{name}.weight"], params[f"{name}.bias"]
            if w.dim() == 3:    # per-task fast weights: [tasks, out, in]
                h = torch.baddbmm(b.unsqueeze(1), h, w.transpose(1, 2))
            else:
                h = F.linear(h, w, b)
            if name != "regressor":
                h = F.relu(h)
        return h


def build(seed: int = 0):
    torch.manual_seed(seed)
    model = SineMLP()
    meta_optimizer = torch.optim.Adam(model.parameters(), lr=META_LR)
    return model, meta_optimizer


# ------------------------------------------------------------------------------------------- the meta step
def adapt(model: SineMLP, inputs, targets, *, steps: int, step_size: float, detach: bool):
    """The inner loop: `steps` SGD steps on each task's support MSE, one fast-weight copy per task."""
    n_tasks = inputs.shape[0]
    if detach:   # the fault: "leaf" copies, cut from the model's parameters
        params = OrderedDict((n, p.detach().clone().requires_grad_(True).unsqueeze(0).expand(n_tasks, *p.shape))
                             for n, p in model.named_parameters())
    else:
        params = OrderedDict((n, p.unsqueeze(0).expand(n_tasks, *p.shape)) for n, p in model.named_parameters())
    for _ in range(steps):
        per_task = F.mse_loss(model(inputs, params), targets, reduction="none").mean(dim=(1, 2))
        grads = torch.autograd.grad(per_task.sum(), list(params.values()), create_graph=True)
        params = OrderedDict((n, p - step_size * g) for (n, p), g in zip(params.items(), grads))
    return params


def make_meta_loss(*, inner_steps: int = INNER_STEPS, inner_lr: float = INNER_LR, detach: bool = False):
    def meta_loss(model: SineMLP, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        params = adapt(model, batch["train_inputs"], batch["train_targets"],
                       steps=inner_steps, step_size=inner_lr, detach=detach)
        query = F.mse_loss(model(batch["test_inputs"], params), batch["test_targets"], reduction="none")
        return query.mean(dim=(1, 2)).mean()      # outer_loss summed over tasks, divided by num_tasks
    return meta_loss


def make_train_step(meta_loss):
    def train_step(model: SineMLP, meta_optimizer: torch.optim.Optimizer, batch) -> torch.Tensor:
        model.train()
        meta_optimizer.zero_grad()
        outer_loss = meta_loss(model, batch)
        outer_loss.backward()
        meta_optimizer.step()
        return outer_loss.detach()
    return train_step


# ------------------------------------------------------------------------------------------- training
def _config(run: str, variant: str | None) -> dict:
    cfg = {"detach": run == "fast_weights_detached", "inner_lr": INNER_LR, "meta_lr": META_LR}
    if variant == "no_detach":
        cfg["detach"] = False
    elif variant == "meta_lr_x10":
        cfg["meta_lr"] = META_LR * 10
    elif variant == "inner_lr_x5":
        cfg["inner_lr"] = INNER_LR * 5
    elif variant is not None:
        raise ValueError(f"unknown variant {variant!r}")
    return cfg


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = _config(run, variant)
    model, meta_optimizer = build(seed)
    for group in meta_optimizer.param_groups:
        group["lr"] = cfg["meta_lr"]
    meta_loss = make_meta_loss(inner_lr=cfg["inner_lr"], detach=cfg["detach"])
    step = make_train_step(meta_loss)
    gen = torch.Generator().manual_seed(seed)
    val_batches = snapshot(seed=100 + seed, n=4)

    losses, val_losses, window = [], [], []
    for it in range(ITERS):
        batch = sample_tasks(gen)
        window.append(float(step(model, meta_optimizer, batch)))
        if (it + 1) % LOG_EVERY == 0:
            losses.append(sum(window) / len(window))
            window = []
        if (it + 1) % 100 == 0:        # meta-validation on held-out tasks (adaptation needs gradients)
            val = [float(meta_loss(model, b).detach()) for b in val_batches]
            val_losses.append(sum(val) / len(val))
    ckpt = out_dir / "model.th"        # pytorch-maml saves the bare state_dict
    torch.save(model.state_dict(), ckpt)
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_losses,
                   metrics={"first": sum(losses[:5]) / 5, "last": sum(losses[-5:]) / 5})


def symptom(run: str, trained: Trained) -> str | None:
    first, last = trained.metrics["first"], trained.metrics["last"]
    n = len(trained.train_losses) * LOG_EVERY
    if last > 0.8 * first:
        return (f"post-adaptation query MSE {first:.2f} -> {last:.2f} over {n} meta-iterations "
                f"(mean of the first and last 50); the meta-loss does not fall")
    return None


# ---------------------------------------------------------------------------------------------- setups
def _setup(detach: bool):
    import triage

    model, meta_optimizer = build(0)
    meta_loss = make_meta_loss(detach=detach)
    return triage.Setup(model=model, optimizer=meta_optimizer, loss_fn=meta_loss,
                        train_step=make_train_step(meta_loss),
                        batches=snapshot(seed=0), val_batches=snapshot(seed=100, n=4),
                        total_steps=PLANNED_ITERS)


def setup_healthy():
    return _setup(detach=False)


def setup_fast_weights_detached():
    return _setup(detach=True)


if __name__ == "__main__":
    import sys
    import time
    run = sys.argv[1] if len(sys.argv) > 1 else "healthy"
    t = time.perf_counter()
    tr = train(run, Path("/tmp/maml_out"), seed=int(sys.argv[2]) if len(sys.argv) > 2 else 0,
               variant=sys.argv[3] if len(sys.argv) > 3 else None)
    print(f"{time.perf_counter() - t:.1f} s", [round(x, 2) for x in tr.train_losses[::6]], tr.val_losses)
    print(symptom(run, tr))
