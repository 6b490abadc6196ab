"""A run no tested fix repairs, for the `unexplained` screenshot: its forward shuffles the examples of each
batch before the network sees them, so the labels it is trained on are unrelated to its inputs (the data
itself is fine, so the label checks pass), and no learning rate, clip, init or precision makes it learn.

    python docs/_tools/unexplained_run.py CHECKPOINT     # writes the run's checkpoint at step 3
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

import triage


class ShufflingNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):  # (B, 20) -> (B, 4), each output for another example of the batch: the bug
        return self.net(x[torch.randperm(len(x))])


def data(n_batches: int = 40, batch_size: int = 64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n_batches * batch_size, 20, generator=g)
    y = (x[:, :5].sum(1) > 0).long() + 2 * (x[:, 5] > 0).long()
    return [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, len(x), batch_size)]


def loss_fn(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def setup() -> triage.Setup:
    model = ShufflingNet()
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), loss_fn=loss_fn,
                        batches=data())


if __name__ == "__main__":
    torch.manual_seed(0)
    run = setup()
    losses = []
    for step, batch in enumerate(run.batches[:4]):
        loss = loss_fn(run.model, batch)
        run.optimizer.zero_grad(); loss.backward(); run.optimizer.step()
        losses.append(loss.item())
    triage.save_checkpoint(sys.argv[1], run.model, run.optimizer, step=3, history=losses)
