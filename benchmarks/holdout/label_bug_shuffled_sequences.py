"""label_bug (labels unrelated to inputs, sequences): an LSTM classifier on synthetic topic sequences whose loader
sorts the sequences by length for bucketing but leaves the label array in its original order, so every sequence
carries another sequence's label (the label set itself is fine: 4 classes, balanced). The loss stays at ln(4).
Fix: sort the labels with their sequences."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch

import triage
from _holdout import LSTMClassifier
from _zoo import cross_entropy, topic_sequence_batches, write_run_checkpoint


ROOT_CAUSE = "label_bug"


def _batches(labels_follow: bool):
    batches = topic_sequence_batches(batch_size=32, n_batches=16)
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    # "Bucketing": a stable order by a per-sequence key (here its token sum stands in for its length).
    order = torch.argsort(x.sum(1), stable=True)
    x_sorted = x[order]
    y_used = y[order] if labels_follow else y  # the bug: the labels keep the unsorted order
    return [(x_sorted[i:i + 32], y_used[i:i + 32]) for i in range(0, len(x), 32)]


def _setup(labels_follow: bool) -> triage.Setup:
    model = LSTMClassifier(vocab=32, classes=4)
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                        loss_fn=cross_entropy, batches=_batches(labels_follow))


def setup() -> triage.Setup:
    return _setup(labels_follow=False)


def fixed_setup() -> triage.Setup:
    return _setup(labels_follow=True)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=100)
