"""Hinton knowledge distillation of a small MLP student from a larger MLP teacher on sklearn's digits.

What it does: trains a teacher (64-256-256-10 MLP) on load_digits first, then distils a student (64-32-10 MLP)
with the Hinton loss: KL(log_softmax(student/T) || softmax(teacher/T)) * alpha * T^2 + CE(student, y) * (1-alpha),
T=6, alpha=0.95 (haitongli/knowledge-distillation-pytorch's `loss_fn_kd` in model/net.py and its params.json for
distillation; the same loss as the PyTorch "Knowledge Distillation Tutorial"). Like haitongli's train.py
(`fetch_teacher_outputs` then `train_kd`), the teacher's logits are computed once before the student's
training to save a teacher forward per step; the student is trained with Adam, dict batches
`{"x", "y", "teacher_logits"}`, validation each epoch, and a checkpoint dict per epoch
(`model_state_dict`, `optimizer_state_dict`, `epoch`).

Runs
- healthy: teacher outputs cached per example (indexed by the dataset index), so each batch carries its own
  examples' soft targets. Its loss floor is not 0 (soft targets at T=6: the KL to a soft teacher plus CE).
- shuffled_teacher_cache: the owner cached the teacher outputs as a list, one entry per batch of a pass over
  the *shuffled* train DataLoader, then in every student epoch took `teacher_outputs[i]` for batch i of a new
  shuffle: the soft targets belong to other examples. This is exactly haitongli/knowledge-distillation-pytorch
  issue #4 ("The train dataloader will be shuffled every epoch, does it really work?"), issue #9 and the fix in
  PR #17 ("The teacher's output disagree with batch's labels"). With alpha=0.95 and T^2=36 the student is
  trained mostly towards random examples' targets: it barely beats chance. Cause `label_bug`: the targets the
  loss reads are not the batch's own; the deciding fix is aligning them (cache by dataset index), which
  removes the symptom; lowering the LR (what the owner tries first) does not.

setup(): the student, its Adam, the KD loss and a snapshot of the run's batches. The teacher is retrained
deterministically (seed 0, ~0.5 s, cached) to rebuild the cached soft targets exactly as the run made them;
in the original it would be loaded from the teacher's own checkpoint.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

try:
    from _program import Program, Run, Trained
except ImportError:
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _program import Program, Run, Trained

T, ALPHA, BS, TEACHER_EPOCHS, STUDENT_EPOCHS, LR = 6.0, 0.95, 32, 6, 10, 5e-3

PROGRAM = Program(
    name="distillation_kd",
    kind="distillation",
    original="haitongli/knowledge-distillation-pytorch train.py (fetch_teacher_outputs, train_kd) + model/net.py "
             "loss_fn_kd; PyTorch tutorials beginner_source/knowledge_distillation_tutorial.py",
    runs={
        "healthy": Run(cause="healthy", story="Teacher then student distillation with T=6, alpha=0.95; the KD loss "
                       "falls towards a non-zero floor and student accuracy climbs."),
        "shuffled_teacher_cache": Run(
            cause="label_bug",
            story="I precomputed the teacher's logits once over the shuffled train loader and used "
                  "teacher_outputs[i] for batch i in each student epoch. The student stays near chance on val; "
                  "a smaller LR changed nothing.",
            fix="align_teacher_cache", competing=("lr_x0.1",)),
    },
)


def data(seed):
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm], y[perm]
    return (x[:1408], y[:1408]), (x[1408:], y[1408:])


def teacher_net():
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Dropout(0.2), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def student_net():
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def loader_order(n, seed):
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


@functools.lru_cache(maxsize=4)
def trained_teacher(seed):
    (x, y), _ = data(seed)
    torch.manual_seed(10_000 + seed)
    t = teacher_net()
    opt = torch.optim.Adam(t.parameters(), lr=1e-3)
    for epoch in range(TEACHER_EPOCHS):
        order = loader_order(len(x), 50_000 + seed * 100 + epoch)
        for i in range(0, len(x), BS):
            idx = order[i:i + BS]
            loss = F.cross_entropy(t(x[idx]), y[idx])
            opt.zero_grad(); loss.backward(); opt.step()
    t.eval()
    return t


def loss_fn_kd(model, batch):
    """haitongli's loss_fn_kd: soft KL * alpha * T^2 + hard CE * (1 - alpha)."""
    out = model(batch["x"])
    kd = F.kl_div(F.log_softmax(out / T, dim=1), F.softmax(batch["teacher_logits"] / T, dim=1),
                  reduction="batchmean") * (ALPHA * T * T)
    return kd + F.cross_entropy(out, batch["y"]) * (1.0 - ALPHA)


def epoch_batches(run, seed, variant, x, y, cache, epoch):
    """The student's batches of one epoch: a fresh shuffle of the train loader, plus the cached soft targets."""
    order = loader_order(len(x), seed * 1000 + epoch + 1)
    out = []
    for i, s in enumerate(range(0, len(x), BS)):
        idx = order[s:s + BS]
        if run == "shuffled_teacher_cache" and variant != "align_teacher_cache":
            tl = cache["per_batch"][i]           # teacher_outputs[i]: batch i of ANOTHER shuffle
        else:
            tl = cache["per_example"][idx]       # the batch's own examples
        out.append({"x": x[idx], "y": y[idx], "teacher_logits": tl, "idx": idx})
    return out


def teacher_cache(seed):
    (x, y), (xv, yv) = data(seed)
    t = trained_teacher(seed)
    with torch.no_grad():
        order = loader_order(len(x), seed * 1000)  # fetch_teacher_outputs: one pass over the shuffled loader
        per_batch = [t(x[order[s:s + BS]]) for s in range(0, len(x), BS)]
        per_example = t(x)
        val_logits = t(xv)
    return {"per_batch": per_batch, "per_example": per_example, "val": val_logits}


def val_batches(xv, yv, val_logits):
    return [{"x": xv[s:s + BS], "y": yv[s:s + BS], "teacher_logits": val_logits[s:s + BS]}
            for s in range(0, len(xv), BS)]


def build(seed, variant=None):
    torch.manual_seed(seed)
    student = student_net()
    opt = torch.optim.Adam(student.parameters(), lr=LR * (0.1 if variant == "lr_x0.1" else 1.0))
    return student, opt


def train(run, out_dir, seed=0, variant=None):
    out_dir = Path(out_dir)
    (x, y), (xv, yv) = data(seed)
    cache = teacher_cache(seed)
    vb = val_batches(xv, yv, cache["val"])
    teacher_acc = float((cache["val"].argmax(1) == yv).float().mean())
    student, opt = build(seed, variant)
    ckpt_epoch = 4 if run == "healthy" else 6
    ckpt = out_dir / "student_checkpoint.pt"
    losses, vlosses, metrics = [], [], {}
    for epoch in range(STUDENT_EPOCHS):
        student.train()
        for b in epoch_batches(run, seed, variant, x, y, cache, epoch):
            loss = loss_fn_kd(student, b)
            opt.zero_grad(); loss.backward(); opt.step()
            losses.append(loss.item())
        student.eval()
        with torch.no_grad():
            vlosses.append(float(np.mean([loss_fn_kd(student, b).item() for b in vb])))
            acc = float((student(xv).argmax(1) == yv).float().mean())
        if epoch + 1 == ckpt_epoch:
            torch.save({"epoch": epoch + 1, "model_state_dict": student.state_dict(),
                        "optimizer_state_dict": opt.state_dict()}, ckpt)
            metrics = {"val_acc_at_ckpt": acc, "teacher_val_acc": teacher_acc, "ckpt_epoch": epoch + 1,
                       "train_loss_at_ckpt": float(np.mean(losses[-44:])), "first_loss": float(np.mean(losses[:5]))}
    metrics["final_val_acc"] = acc
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=vlosses, metrics=metrics)


def symptom(run, trained):
    m = trained.metrics
    if m["val_acc_at_ckpt"] < 0.6:
        return (f"student val accuracy {m['val_acc_at_ckpt']:.3f} after {m['ckpt_epoch']} epochs (teacher "
                f"{m['teacher_val_acc']:.3f}); KD loss {m['first_loss']:.2f} -> {m['train_loss_at_ckpt']:.2f}")
    return None


def _setup(run):
    import triage
    seed = 0
    (x, y), (xv, yv) = data(seed)
    cache = teacher_cache(seed)
    student, opt = build(seed)
    snap = epoch_batches(run, seed, None, x, y, cache, 6 if run != "healthy" else 4)
    return triage.Setup(model=student, optimizer=opt, loss_fn=loss_fn_kd, batches=snap,
                        val_batches=val_batches(xv, yv, cache["val"]), steps_per_epoch=len(snap),
                        total_steps=len(snap) * STUDENT_EPOCHS)


def setup_healthy():
    return _setup("healthy")


def setup_shuffled_teacher_cache():
    return _setup("shuffled_teacher_cache")
