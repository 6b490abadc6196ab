"""Soft targets (issue 33, class 2): a healthy mixup run with label smoothing trains on a cross-entropy
against target distributions, whose floor is their entropy. The standard loss for such targets is that
cross-entropy, not MSE: set against MSE's values it "learned nothing" (wrong_loss, high, before). A
softmax before that same loss is still a wrong loss."""

import torch
from sklearn.datasets import load_digits
from torch import nn

import triage

X, Y = load_digits(return_X_y=True)
X, Y = torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(Y)


def mixed_batches(seed=0, n=16, size=64, alpha=0.4, smoothing=0.1):
    g = torch.Generator().manual_seed(seed)
    beta = torch.distributions.Beta(alpha, alpha)
    torch.manual_seed(seed)
    out = []
    for _ in range(n):
        idx = torch.randint(0, len(X), (size,), generator=g)
        perm = torch.randperm(size, generator=g)
        lam = float(beta.sample())
        target = nn.functional.one_hot(Y[idx], 10).float() * (1 - smoothing) + smoothing / 10
        out.append((lam * X[idx] + (1 - lam) * X[idx][perm], lam * target + (1 - lam) * target[perm]))
    return out


def mixup_setup(softmax_first=False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def loss_fn(m, batch):
        scores = m(batch[0])
        return nn.functional.cross_entropy(scores.softmax(-1) if softmax_first else scores, batch[1])
    val = [(X[i:i + 128], nn.functional.one_hot(Y[i:i + 128], 10).float()) for i in range(0, 512, 128)]
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                        loss_fn=loss_fn, batches=mixed_batches(), val_batches=val)


def checkpoint_after(setup_fn, path, steps=300):
    s = setup_fn()
    for step in range(steps):
        s.optimizer.zero_grad()
        loss = s.loss_fn(s.model, s.batches[step % len(s.batches)])
        loss.backward()
        s.optimizer.step()
    return triage.save_checkpoint(path, s.model, s.optimizer, step=steps), loss.item()


def test_a_healthy_mixup_run_is_held_to_the_cross_entropy_of_its_target_distributions(tmp_path):
    checkpoint, loss = checkpoint_after(mixup_setup, tmp_path / "ckpt.pt")
    assert loss > 0.5  # the targets' entropy floors it: nowhere near 0, and healthy
    report, _ = triage.run(mixup_setup, checkpoint, out=tmp_path / "report")
    outputs = report.experiment("outputs").outcome
    assert outputs["standard_rule"] == "soft_cross_entropy" and outputs["gradient_vs_standard"] < 1e-6
    assert report.root_cause == "healthy"


def test_a_softmax_before_the_soft_target_loss_is_still_a_wrong_loss(tmp_path):
    squashed = lambda: mixup_setup(softmax_first=True)  # noqa: E731
    checkpoint, _ = checkpoint_after(squashed, tmp_path / "ckpt.pt")
    report, _ = triage.run(squashed, checkpoint, out=tmp_path / "report")
    assert report.root_cause == "wrong_loss"
