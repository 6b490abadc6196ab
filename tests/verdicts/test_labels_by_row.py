"""Labels that follow the row, not the example (the third round's NCF miss): a recommender's sampling code
put the negatives first in the features and left the labels in the old order, so the first rows are labelled
1 whoever they are. Its inputs are user and item ids, with no space that nearest neighbours can read, and its
own log shows training falling while validation rises: it was called overfitting. But validation never went
under the loss of learning nothing (predicting the positive rate): what the labels taught holds on no
validation pair. Its levels are measured too now: a batch of integer ids and a last floating target is a
regression or binary target beside its inputs."""

import csv

import torch
import torch.nn.functional as F
from torch import nn

import triage
from tests._instrument_runs import session_of
from triage.experiments.levels import loss_levels

USERS, ITEMS, POSITIVES, NEGATIVES, BATCH = 200, 2000, 20, 4, 250


class NCF(nn.Module):
    """Generalised matrix factorisation: a user and an item embedding, their product, a logit."""

    def __init__(self):
        super().__init__()
        self.users, self.items = nn.Embedding(USERS, 16), nn.Embedding(ITEMS, 16)
        self.predict = nn.Linear(16, 1)

    def forward(self, user, item):
        return self.predict(self.users(user) * self.items(item)).squeeze(-1)


def loss_fn(model, batch):
    return F.binary_cross_entropy_with_logits(model(batch["user"], batch["item"]), batch["label"])


def interactions(seed: int, labels_by_row: bool):
    """Each user's positives come from a hidden taste model; 4 sampled negatives per positive. The owner's
    edit puts the negatives first in the features and leaves the labels positives-first."""
    g = torch.Generator().manual_seed(seed)
    taste = torch.randn(USERS, 4, generator=torch.Generator().manual_seed(7)) @ \
        torch.randn(4, ITEMS, generator=torch.Generator().manual_seed(8))
    positives = taste.topk(POSITIVES, dim=1).indices  # (USERS, POSITIVES)
    users = torch.arange(USERS).repeat_interleave(POSITIVES)
    pos_items = positives.reshape(-1)
    neg_users = users.repeat_interleave(NEGATIVES)
    neg_items = torch.randint(0, ITEMS, (len(neg_users),), generator=g)
    labels = torch.cat([torch.ones(len(users)), torch.zeros(len(neg_users))])
    if labels_by_row:
        user, item = torch.cat([neg_users, users]), torch.cat([neg_items, pos_items])
    else:
        user, item = torch.cat([users, neg_users]), torch.cat([pos_items, neg_items])
    order = torch.randperm(len(labels), generator=g)
    return {"user": user[order], "item": item[order], "label": labels[order]}


def held_out(negatives: int = NEGATIVES):
    """Correctly labelled pairs: each user's positives from the taste model ranked 21-25, and fresh negatives
    (4 per positive by default, as in training: the same positive rate)."""
    taste = torch.randn(USERS, 4, generator=torch.Generator().manual_seed(7)) @ \
        torch.randn(4, ITEMS, generator=torch.Generator().manual_seed(8))
    pos = taste.topk(POSITIVES + 5, dim=1).indices[:, POSITIVES:].reshape(-1)
    users = torch.arange(USERS).repeat_interleave(5)
    neg_users = users.repeat_interleave(negatives)
    neg = torch.randint(0, ITEMS, (len(neg_users),), generator=torch.Generator().manual_seed(99))
    return [{"user": torch.cat([users, neg_users]), "item": torch.cat([pos, neg]),
             "label": torch.cat([torch.ones(len(users)), torch.zeros(len(neg_users))])}]


def batches_of(data):
    n = len(data["label"])
    return [{k: v[i:i + BATCH] for k, v in data.items()} for i in range(0, n, BATCH)]


def factory(labels_by_row: bool, val_negatives: int = NEGATIVES):
    def setup():
        torch.manual_seed(0)
        model = NCF()
        return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-2), loss_fn=loss_fn,
                            batches=batches_of(interactions(0, labels_by_row))[:48],
                            val_batches=held_out(val_negatives))
    return setup


def trained_with_log(setup, labels_by_row: bool, epochs: int, tmp_path, every: int = 1):
    """The run's own loop, a fresh draw of negatives each epoch, its log (every `every` epochs: the last
    epoch's training loss, the validation loss) written as history.csv."""
    run, rows = setup(), []
    for epoch in range(1, epochs + 1):
        losses = []
        for batch in batches_of(interactions(epoch, labels_by_row)):
            run.optimizer.zero_grad()
            loss = run.loss_fn(run.model, batch)
            loss.backward()
            run.optimizer.step()
            losses.append(float(loss.detach()))
        if epoch % every:
            continue
        with torch.no_grad():
            val = float(run.loss_fn(run.model, run.val_batches[0]))
        rows.append({"step": epoch * len(losses), "loss": sum(losses) / len(losses), "val_loss": val})
    with open(tmp_path / "history.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    checkpoint = triage.save_checkpoint(tmp_path / "ckpt.pt", run.model, run.optimizer, step=rows[-1]["step"])
    return checkpoint, rows


def test_a_recommenders_levels_are_measured_from_its_last_float_beside_its_ids():
    levels = loss_levels(session_of(factory(False)))
    assert levels.kind == "binary" and abs(levels.constant - 0.5004) < 0.01  # the binary entropy of 20% positives


def test_labels_that_follow_the_row_are_a_label_bug_not_overfitting(tmp_path):
    setup = factory(labels_by_row=True)
    checkpoint, rows = trained_with_log(setup, True, 9, tmp_path, every=3)
    assert rows[-1]["loss"] < 0.1 and min(r["val_loss"] for r in rows) > 1.0  # the owner's symptom
    report, _ = triage.run(setup, checkpoint, out=tmp_path / "report", history=tmp_path / "history.csv")
    assert report.root_cause == "label_bug" and report.confidence == "medium"
    history = report.experiment("history").outcome
    assert history["val_nothing_level"] < min(r["val_loss"] for r in rows)


def test_a_correctly_labelled_run_overfitting_on_a_balanced_validation_set_is_not_a_label_bug(tmp_path):
    """Training at 20% positives, validation 50/50: predicting the training rate scores 0.92 there, not
    the 0.50 it scores on training; a validation loss of 0.75 has learned something (review, helper-27)."""
    setup = factory(labels_by_row=False, val_negatives=1)
    checkpoint, rows = trained_with_log(setup, False, 12, tmp_path)
    report, _ = triage.run(setup, checkpoint, out=tmp_path / "report", history=tmp_path / "history.csv")
    history = report.experiment("history").outcome
    assert history["val_nothing_level"] > 0.9 > history["nothing_level"]
    assert report.root_cause != "label_bug"
