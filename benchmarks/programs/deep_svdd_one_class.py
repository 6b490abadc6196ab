"""Deep SVDD one-class anomaly detection on 8x8 digits: map normal images close to a fixed centre c.

Written after lukasruff/Deep-SVDD-PyTorch (`src/optim/deepSVDD_trainer.py`, `src/deepSVDD.py`) and the minimal
re-implementation mperezcarrasco/PyTorch-Deep-SVDD. I read the trainer: the network has no bias terms (a bias
would let it map everything to c, the paper's trivial solution); `init_center_c` sets c to the mean of the
network's outputs on the training data after one forward pass, pushing coordinates closer than eps=0.1 to 0
out to +-eps; the one-class objective is `torch.mean(torch.sum((outputs - c) ** 2, dim=1))`; Adam (lr 1e-3
default, weight_decay 1e-6, amsgrad option) with a MultiStepLR over `lr_milestones`, stepped once per epoch;
the anomaly score of a test image is its squared distance to c and the test AUC is the ROC AUC of that score.
Here: scikit-learn's digits, digits 0-4 as the normal class and 5-9 as anomalies, a bias-free MLP
64-128-64-32 with LeakyReLU (in place of the original's LeNet-type CNN, without BatchNorm), batches of 128, 150
epochs with the lr milestone at 100 (the original's defaults are 150 epochs and a milestone you pass), and a
checkpoint `{"epoch", "net_dict", "c", "optimizer", "scheduler"}` (the original saves `{'R', 'c', 'net_dict',
'ae_net_dict'}`; the optimizer is added so the run can be resumed). A fifth of the normal images is put aside
first as a final test set that neither run touches; the rest is what the owner splits.

The loss is a mean squared distance to a centre that training cannot move: it starts small (c is the mean of
the initial outputs), falls, and has no target value; validation loss is the same distance on held-out normal
images.

Runs
- healthy: the owner's rest of the normal images is split 70/30 into train and validation first; the
  validation distance follows the training distance and the held-out AUC (normal vs 5-9) is about 0.9.
  Checkpoint at epoch 20 of 150, both distances still falling.
- val_drawn_from_train: the owner filtered the dataset to the normal class, trained on ALL of it, and drew the
  validation set from the same normal images (`X_val = X_normal[rng.choice(...)]`) -- in one-class training
  every training image is "normal", so it is easy to forget that the validation normals must be held out (the
  original's protocol, restated by its author in lukasruff/Deep-SVDD#14, is to "use the original training and
  test splits" and "only train with training set examples from the respective normal class"; pyod PR #380
  adds user-supplied `validation_data` to its DeepSVDD; I found no thread on this exact leak).
  The network has seen every validation image: the validation distance is 3-6x smaller than on fresh normal
  images (about 0.0002 against 0.001) and the validation AUC (about 0.97) is inflated above the honest test AUC
  (about 0.8). The checkpoint is the last epoch's, when the owner compared the two. Root cause `train_val_overlap`
  (every validation example duplicates a training one); fix `split_first` (split before training). Competing
  fix a user tries first, reading it as overfitting: 100x the weight decay (`weight_decay_1e-4`), which leaves
  the gap.
"""

from __future__ import annotations

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
    name="deep_svdd_one_class",
    kind="one-class anomaly detection",
    original="lukasruff/Deep-SVDD-PyTorch: src/optim/deepSVDD_trainer.py (+ mperezcarrasco/PyTorch-Deep-SVDD)",
    runs={
        "healthy": Run(cause="healthy", story="Deep SVDD on digits 0-4 as normal, bias-free MLP, Adam 1e-3; the "
                       "distance to c falls on train and validation alike; checkpoint at epoch 20 of 150."),
        "val_drawn_from_train": Run(
            cause="train_val_overlap",
            story="My validation distance is tiny and the validation AUC looks great, but on new normal images "
                  "the scores are several times larger. More weight decay did not close the gap.",
            fix="split_first", competing=("weight_decay_1e-4",)),
    },
)

BS, EPOCHS, CKPT_EPOCH_HEALTHY, MILESTONES = 128, 150, 20, (100,)
NORMAL = (0, 1, 2, 3, 4)


def make_data(seed, split_first=True):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target)
    normal = torch.tensor([int(t) in NORMAL for t in y])
    g = torch.Generator().manual_seed(500 + seed)
    xn = x[normal][torch.randperm(int(normal.sum()), generator=g)]
    xa = x[~normal][torch.randperm(int((~normal).sum()), generator=g)]
    n_test = len(xn) // 5
    test_n, rest = xn[:n_test], xn[n_test:]
    n_val = int(0.3 * len(rest))
    if split_first:
        train, val_n = rest[n_val:], rest[:n_val]
    else:   # the fault: train on every normal image, validate on a sample of the same images
        train = rest
        val_n = rest[torch.randperm(len(rest), generator=g)[:n_val]]
    half = len(xa) // 2
    return {"train": train, "val_n": val_n, "val_a": xa[:half], "test_n": test_n, "test_a": xa[half:]}


class MLPNet(nn.Module):
    def __init__(self, rep_dim=32):
        super().__init__()
        self.rep_dim = rep_dim
        self.fc1 = nn.Linear(64, 128, bias=False)
        self.fc2 = nn.Linear(128, 64, bias=False)
        self.fc3 = nn.Linear(64, rep_dim, bias=False)

    def forward(self, x):
        x = F.leaky_relu(self.fc1(x))
        x = F.leaky_relu(self.fc2(x))
        return self.fc3(x)


class DeepSVDD(nn.Module):
    """The network plus its centre c, kept as a buffer so that it travels with the state dict."""

    def __init__(self):
        super().__init__()
        self.net = MLPNet()
        self.register_buffer("c", torch.zeros(self.net.rep_dim))

    def forward(self, x):
        return torch.sum((self.net(x) - self.c) ** 2, dim=1)   # the anomaly score


@torch.no_grad()
def init_center_c(model, train, eps=0.1):
    c = model.net(train).mean(0)
    c[(abs(c) < eps) & (c < 0)] = -eps
    c[(abs(c) < eps) & (c > 0)] = eps
    model.c.copy_(c)


def loss_fn(model, batch):
    (x,) = batch
    return torch.mean(model(x))


def config(run, variant):
    wd = 1e-4 if variant == "weight_decay_1e-4" else 1e-6
    split_first = run != "val_drawn_from_train" or variant == "split_first"
    return wd, split_first


def build(run, variant, seed, train):
    torch.manual_seed(seed)
    model = DeepSVDD()
    init_center_c(model, train)
    wd, _ = config(run, variant)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=wd)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=list(MILESTONES), gamma=0.1)
    return model, opt, sched


def epoch_batches(train, epoch, seed):
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed * 1000 + epoch))
    return [(train[order[i:i + BS]],) for i in range(0, len(train), BS)]


def auc(scores_normal, scores_anomal):
    from sklearn.metrics import roc_auc_score

    s = torch.cat([scores_normal, scores_anomal]).numpy()
    lab = np.r_[np.zeros(len(scores_normal)), np.ones(len(scores_anomal))]
    return float(roc_auc_score(lab, s))


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    _, split_first = config(run, variant)
    data = make_data(seed, split_first)
    model, opt, sched = build(run, variant, seed, data["train"])
    ckpt = Path(out_dir) / "deep_svdd.pt"
    ckpt_epoch = CKPT_EPOCH_HEALTHY if run == "healthy" else EPOCHS
    losses, vals = [], []
    for epoch in range(1, EPOCHS + 1):
        model.train()
        for batch in epoch_batches(data["train"], epoch, seed):
            loss = loss_fn(model, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        sched.step()
        model.eval()
        with torch.no_grad():
            vals.append(float(model(data["val_n"]).mean()))
        if epoch <= ckpt_epoch:
            torch.save({"epoch": epoch, "net_dict": model.state_dict(), "c": model.c.clone(),
                        "optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, ckpt)
    with torch.no_grad():
        s = {k: model(v) for k, v in data.items()}
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=vals,
                   metrics={"train_dist": float(s["train"].mean()), "val_dist": float(s["val_n"].mean()),
                            "test_dist": float(s["test_n"].mean()),
                            "val_auc": auc(s["val_n"], s["val_a"]), "test_auc": auc(s["test_n"], s["test_a"]),
                            "first": losses[0]})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    ratio = m["test_dist"] / m["val_dist"]
    if run == "healthy":
        if m["test_auc"] < 0.7 or not m["train_dist"] < 0.5 * m["first"]:
            return (f"test AUC {m['test_auc']:.3f}, train distance {m['first']:.4f} -> {m['train_dist']:.4f}")
        return None
    if ratio > 1.5:
        return (f"validation distance {m['val_dist']:.4f} (val AUC {m['val_auc']:.3f}) while fresh normal images "
                f"score {m['test_dist']:.4f} ({ratio:.1f}x; test AUC {m['test_auc']:.3f})")
    return None


def _setup(run):
    import triage

    _, split_first = config(run, None)
    data = make_data(0, split_first)
    model, opt, sched = build(run, None, 0, data["train"])
    batches = [b for e in range(1, 9) for b in epoch_batches(data["train"], e, 0)]
    vn = data["val_n"]
    # The MultiStepLR is stepped once per epoch with its one milestone at epoch 100: over a replay of some dozens
    # of steps the lr is constant (the checkpoint's optimizer state holds it), so it is not passed here.
    return triage.Setup(model=model, optimizer=opt, loss_fn=loss_fn, batches=batches,
                        val_batches=[(vn[i:i + BS],) for i in range(0, len(vn), BS)],
                        total_steps=EPOCHS * len(epoch_batches(data["train"], 1, 0)))


def setup_healthy():
    return _setup("healthy")


def setup_val_drawn_from_train():
    return _setup("val_drawn_from_train")
