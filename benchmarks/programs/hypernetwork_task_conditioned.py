"""A task-conditioned hypernetwork: an MLP hypernetwork maps a learned task embedding to ALL the weights of a small
target MLP, which is then run functionally on that task's inputs (multi-task sinusoid regression, one embedding per
task, the setting of hypnettorch's HMLP and of continual learning with hypernetworks).

Written after chrhenning/hypnettorch (read through the `search` tool, code corpus: its README usage
`mnet = MLP(n_in, no_weights=True); hnet = HMLP(mnet.param_shapes); weights = hnet.forward(cond_id=0);
mnet.forward(inputs, weights=weights)`, `hnets/mlp_hnet.py`'s HMLP with internal conditional embeddings
(`num_cond_embs`, `cond_in_size`) and hidden `layers` whose last layer outputs every target tensor, and
`apply_hyperfan_init`; a test script building `optimizer = torch.optim.Adam(hnet.parameters(), lr=...)` and calling
`hnet.forward(cond_input=...)` then `mnet.forward(X, weights)`), and the training loops of the repositories that use
it for several tasks (a batch of tasks, each task's weights generated from its id, an MSE per task, one Adam over
the hypernetwork's parameters, the embeddings included).
Here: 32 sinusoid tasks y = A sin(x + phi) (A in [0.5, 2], phi in [0, pi]) with 40 training and 40 held-out x per
task in [-5, 5] and noise of std 0.05; task embeddings of size 8 inside the hypernetwork; hypernetwork 8 -> 64 ->
64 -> 1153 (ReLU); target MLP 1 -> 32 -> 32 -> 1 (ReLU) with no weights of its own; a batch is a dict
{"task_id": (4,), "x": (4, 40, 1), "y": (4, 40, 1)} of 4 tasks; Adam lr 1e-3; 1000 steps (125 epochs over the
tasks); the checkpoint `{"iteration", "hnet_state", "optimizer_state", "losses"}` every 100 iterations, as
hypnettorch-based scripts keep the hypernetwork state and the running loss list together.

Runs
- healthy: as above; training MSE falls from ~1.0 to ~0.07 by iteration 300 and keeps falling (~0.01 by
  iteration 1000; the noise floor is 0.0025);
  checkpoint at iteration 300, still improving on held-out points.
- normal_init_hnet: the owner re-initialised every Linear of the hypernetwork with `nn.init.normal_(w, 0, 1)` and
  zero biases ("generated weights should have unit variance", the hypernetwork initialisation question of Chang et
  al., ICLR 2020, "Principled weight initialization for hypernetworks", which is why hypnettorch ships
  `apply_hyperfan_init`). With 64-wide hidden layers the generated target weights have std ~ 85 and the target
  MLP's outputs are ~1e7: the first losses are ~1e15 against the ~1.3 of a constant prediction, and Adam spends the
  whole run shrinking the scale (the training MSE is still ~1e11 after 1000 iterations). Root cause
  `bad_initialization`: the loss at the start is far from what it should be; PyTorch's default init of the
  hypernetwork (`default_init`) trains. Competing fixes a user tries first on a loss that huge: a 10x lower LR
  (`lr_1e-4`) and gradient clipping at 1.0 (`clip_grad_1`), neither of which touches the scale of the weights
  Adam has to undo (Adam's step does not depend on the gradient's size).
- lr_from_target_net: the owner reused the LR of their single-task script, where the same 1-32-32-1 MLP is
  trained directly (Adam 5e-2), for the hypernetwork. Every step of the hypernetwork's output layer moves all 1153
  generated weights of every task at once: the first steps throw the loss to the hundreds, and the run never
  settles, jumping between tasks' fits; the held-out MSE after 1000 iterations is 0.5-0.75 (a constant prediction
  scores ~1.3; the healthy run ~0.02). The sensitivity comes from the program's nature: one output layer sets every
  target weight, so an Adam step there is a step on the whole target network (the reason Chang et al. 2020 study the
  scale of generated weights); I found no public thread on this exact case. Root cause `lr_too_high`: the same run at lr x0.1
  (`lr_5e-3`) is stable and learns (held-out MSE 0.01-0.07). Competing fix: gradient clipping at 1.0
  (`clip_grad_1`), which leaves Adam's step size, and the thrashing, as they were.

Triage setup: the hypernetwork (the target MLP has no parameters; it runs on the generated weights inside the
wrapper module), Adam, `loss_fn` = the mean over the batch's tasks of each task's MSE, 48 batches of tasks in the
order the run draws them after the checkpoint, the held-out points of all tasks as `val_batches`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from _program import Program, Run, Trained
except ImportError:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _program import Program, Run, Trained

PROGRAM = Program(
    name="hypernetwork_task_conditioned",
    kind="hypernetwork (task-conditioned weight generation)",
    original="chrhenning/hypnettorch: README usage + hnets/mlp_hnet.py (HMLP with internal task embeddings, "
             "mnet.forward(x, weights=hnet.forward(cond_id=...)))",
    runs={
        "healthy": Run(cause="healthy", story="Hypernetwork generating a 1-32-32-1 MLP per sinusoid task from a "
                       "learned embedding; MSE 1.0 -> 0.07 and falling; checkpoint at iteration 300 of 1000."),
        "normal_init_hnet": Run(
            cause="bad_initialization",
            story="I initialised the hypernetwork with N(0, 1) weights; the first losses were ~1e15 and after 1000 "
                  "iterations it is still far worse than a plain MLP. Lower LR and clipping did not help.",
            fix="default_init", competing=("lr_1e-4", "clip_grad_1")),
        "lr_from_target_net": Run(
            cause="lr_too_high",
            story="I reused the LR of my single-task MLP script (Adam 5e-2); the loss jumps around and ends far "
                  "above what the example reaches. Gradient clipping did not help.",
            fix="lr_5e-3", competing=("clip_grad_1",)),
    },
)

N_TASKS, N_PTS, EMB, HID, TW = 32, 40, 8, 64, 32
TASKS_PER_BATCH, ITERS, SAVE_EVERY = 4, 1000, 100
CKPT_ITER = {"healthy": 300}
SHAPES = [(TW, 1), (TW,), (TW, TW), (TW,), (1, TW), (1,)]   # mnet.param_shapes of MLP(1, [32, 32], 1)
N_TARGET = sum(math.prod(s) for s in SHAPES)


def make_tasks(seed: int):
    g = np.random.default_rng(300 + seed)
    amp = g.uniform(0.5, 2.0, N_TASKS)
    phase = g.uniform(0.0, math.pi, N_TASKS)
    def draw():
        x = g.uniform(-5.0, 5.0, (N_TASKS, N_PTS, 1))
        y = amp[:, None, None] * np.sin(x + phase[:, None, None]) + 0.05 * g.standard_normal(x.shape)
        return torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)
    return draw(), draw()                                 # (train x, y), (held-out x, y)


def task_batches(train, seed: int, start: int, n: int):
    """Each epoch a fresh order of the 32 tasks, 4 tasks a batch."""
    x, y = train
    per_epoch = N_TASKS // TASKS_PER_BATCH
    out = []
    for it in range(start, start + n):
        epoch, i = divmod(it, per_epoch)
        perm = torch.randperm(N_TASKS, generator=torch.Generator().manual_seed(seed * 7919 + epoch))
        ids = perm[i * TASKS_PER_BATCH:(i + 1) * TASKS_PER_BATCH]
        out.append({"task_id": ids, "x": x[ids], "y": y[ids]})
    return out


def val_batches(val):
    x, y = val
    return [{"task_id": torch.arange(i, i + 8), "x": x[i:i + 8], "y": y[i:i + 8]} for i in range(0, N_TASKS, 8)]


class HMLP(nn.Module):
    """Task embedding -> hidden ReLU layers -> one output layer holding every target weight, split by shape."""

    def __init__(self):
        super().__init__()
        self.cond_embs = nn.Embedding(N_TASKS, EMB)
        nn.init.normal_(self.cond_embs.weight, 0.0, 1.0)
        self.layers = nn.Sequential(nn.Linear(EMB, HID), nn.ReLU(), nn.Linear(HID, HID), nn.ReLU(),
                                    nn.Linear(HID, N_TARGET))

    def forward(self, cond_id):
        flat = self.layers(self.cond_embs(cond_id))                  # (tasks, N_TARGET)
        weights, k = [], 0
        for s in SHAPES:
            n = math.prod(s)
            weights.append(flat[:, k:k + n].reshape(-1, *s))
            k += n
        return weights


def mnet_forward(x, weights):
    """The target MLP 1 -> 32 -> 32 -> 1, run per task on its generated weights (no parameters of its own)."""
    w1, b1, w2, b2, w3, b3 = weights
    h = F.relu(torch.einsum("tni,toi->tno", x, w1) + b1[:, None])
    h = F.relu(torch.einsum("tni,toi->tno", h, w2) + b2[:, None])
    return torch.einsum("tni,toi->tno", h, w3) + b3[:, None]


class HyperModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.hnet = HMLP()

    def forward(self, task_id, x):
        return mnet_forward(x, self.hnet(task_id))


def loss_fn(model, batch):
    pred = model(batch["task_id"], batch["x"])
    return ((pred - batch["y"]) ** 2).mean(dim=(1, 2)).mean()      # each task's MSE, averaged over tasks


def config(run: str, variant: str | None):
    normal_init = run == "normal_init_hnet" and variant != "default_init"
    lr = 1e-3
    if run == "lr_from_target_net":
        lr = 5e-3 if variant == "lr_5e-3" else 5e-2
    if variant == "lr_1e-4":
        lr = 1e-4
    return normal_init, lr, variant == "clip_grad_1"


def build(run: str, seed: int, variant: str | None):
    normal_init, lr, clip = config(run, variant)
    torch.manual_seed(seed)
    model = HyperModel()
    if normal_init:
        for m in model.hnet.layers:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 1.0)
                nn.init.zeros_(m.bias)
    return model, torch.optim.Adam(model.parameters(), lr=lr), clip


@torch.no_grad()
def evaluate(model, batches):
    return float(np.mean([loss_fn(model, b).item() for b in batches]))


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    train_set, val = make_tasks(seed)
    vb = val_batches(val)
    model, optimizer, clip = build(run, seed, variant)
    last = CKPT_ITER.get(run, ITERS)
    ckpt = Path(out_dir) / "hnet_checkpoint.pt"
    losses, vals = [], []
    for it, batch in enumerate(task_batches(train_set, seed, 0, last), start=1):
        optimizer.zero_grad()
        loss = loss_fn(model, batch)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if it % SAVE_EVERY == 0:
            vals.append(evaluate(model, vb))
            torch.save({"iteration": it, "hnet_state": model.state_dict(), "optimizer_state": optimizer.state_dict(),
                        "losses": list(losses)}, ckpt)
    tail = losses[-100:]
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=vals,
                   metrics={"iters": last, "first": float(np.mean(losses[:5])), "last": float(np.median(tail)),
                            "spikes": int(sum(1 for a, b in zip(losses[-300:-1], losses[-299:]) if b > 3 * a)),
                            "val_last": vals[-1], "val_best": min(vals)})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if run in ("healthy", "normal_init_hnet") and m["first"] > 100.0:
        return (f"training MSE {m['first']:.3g} over the first 5 iterations (a constant prediction scores ~1.3); "
                f"median {m['last']:.3g} over the last 100 of {m['iters']}; held-out MSE {m['val_last']:.3g}")
    if run in ("healthy", "lr_from_target_net") and m["val_last"] > 0.2:
        return (f"held-out MSE {m['val_last']:.3f} after {m['iters']} iterations (best {m['val_best']:.3f}; a constant "
                f"prediction scores ~1.3); training MSE median {m['last']:.3f} over the last 100 iterations, first 5 "
                f"{m['first']:.3g}; {m['spikes']} jumps of >3x in the last 300")
    return None


def _setup(run: str):
    import triage

    train_set, val = make_tasks(0)
    model, optimizer, clip = build(run, 0, None)
    at = CKPT_ITER.get(run, ITERS)
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=loss_fn,
                        batches=task_batches(train_set, 0, at, 48), val_batches=val_batches(val),
                        total_steps=ITERS)


def setup_healthy():
    return _setup("healthy")


def setup_normal_init_hnet():
    return _setup("normal_init_hnet")


def setup_lr_from_target_net():
    return _setup("lr_from_target_net")
