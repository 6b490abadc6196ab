"""exploding_gradients: a ReLU RNN with identity-initialised recurrence (IRNN, Le et al. 2015) on the adding
problem over 40 steps, plain SGD: backprop through time multiplies the gradient up to norms of 1e4 and more,
and the loss jumps to the thousands then NaN; lr x0.1 still blows up. Fix: clip the global grad norm at 1.0."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import adding_problem_batches, mse, write_run_checkpoint

ROOT_CAUSE = "exploding_gradients"
LR = 0.005
SEQ_LEN = 60


class IRNN(nn.Module):
    def __init__(self, hidden: int = 64):
        super().__init__()
        self.rnn = nn.RNN(2, hidden, nonlinearity="relu", batch_first=True)
        self.head = nn.Linear(hidden, 1)
        with torch.no_grad():
            self.rnn.weight_hh_l0.copy_(torch.eye(hidden))
            self.rnn.bias_hh_l0.zero_()
            self.rnn.bias_ih_l0.zero_()

    def forward(self, x):
        out, _ = self.rnn(x)  # (B, T, hidden)
        return self.head(out[:, -1])


def _setup(grad_clip: float | None) -> triage.Setup:
    model = IRNN()
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR),
                        loss_fn=mse, batches=adding_problem_batches(batch_size=128, seq_len=SEQ_LEN), grad_clip=grad_clip)


def setup() -> triage.Setup:
    return _setup(grad_clip=None)


def fixed_setup() -> triage.Setup:
    return _setup(grad_clip=1.0)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=0)
