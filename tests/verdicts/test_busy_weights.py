"""A neural ODE's vector field held near zero by RMSprop's weight decay (the tenth round's neural ODE on the
cubic spiral): its weights move over a tenth of their norm in 40 steps and it computes the same field. Its
snapshot's windows differ in difficulty, so its replay's loss "fell" 60% between its first batches and its last
while the batches it trained on last scored the same at its end as at its start: it went to healthy. The batches
scored at both ends tell a stall from a fall the batches make, whether the weights sat still or moved a lot."""

import torch
from torch import nn

import triage

A = torch.tensor([[-0.1, 2.0], [-2.0, -0.1]])
GRID = torch.linspace(0, 25, 1000)


def rk4(f, y0, t):
    ys = [y0]
    for i in range(len(t) - 1):
        h, y = t[i + 1] - t[i], ys[-1]
        k1 = f(y)
        k2 = f(y + h / 2 * k1)
        k3 = f(y + h / 2 * k2)
        ys.append(y + h / 6 * (k1 + 2 * k2 + 2 * k3 + f(y + h * k3)))
    return torch.stack(ys)


with torch.no_grad():
    SPIRAL = rk4(lambda y: (y ** 3) @ A, torch.tensor([[2.0, 0.0]]), GRID)  # (1000, 1, 2)


class ODEFunc(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 50), nn.Tanh(), nn.Linear(50, 2))
        for m in self.net:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.1)
                nn.init.zeros_(m.bias)

    def forward(self, y):
        return self.net(y ** 3)


def windows(seed: int, n: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        s = torch.randint(0, len(GRID) - 10, (20,), generator=g)
        out.append({"y0": SPIRAL[s], "t": GRID[:10], "y": torch.stack([SPIRAL[s + i] for i in range(10)])})
    return out


def l1(model, batch):
    return (rk4(model, batch["y0"], batch["t"]) - batch["y"]).abs().mean()


def triaged(weight_decay: float, tmp_path):
    def factory(batches):
        def setup():
            torch.manual_seed(0)
            f = ODEFunc()
            return triage.Setup(model=f, loss_fn=l1, batches=batches, val_batches=windows(1, 8),
                                optimizer=torch.optim.RMSprop(f.parameters(), lr=1e-3, weight_decay=weight_decay))
        return setup

    run = factory(windows(0, 40))()
    for batch in windows(2, 200):
        run.optimizer.zero_grad()
        l1(run.model, batch).backward()
        run.optimizer.step()
    with torch.no_grad():  # the snapshot's hardest windows first: its loss falls between its windows by itself
        snapshot = sorted(windows(0, 40), key=lambda b: -l1(run.model, b).item())
    checkpoint = triage.save_checkpoint(tmp_path / "ckpt.pt", run.model, run.optimizer, step=200)
    return triage.run(factory(snapshot), checkpoint, out=tmp_path / "report")[0]


def test_weights_that_move_without_changing_the_model_are_a_stall(tmp_path):
    report = triaged(0.1, tmp_path)
    baseline = report.experiment("baseline").outcome
    assert baseline["loss_ratio"] < 0.6 and baseline["update_ratio"] > 0.1
    assert abs(baseline["same_batches_ratio"] - 1) < 0.01
    assert report.root_cause == "weight_decay_too_high", report.path


def test_the_same_run_without_the_decay_is_healthy(tmp_path):
    report = triaged(0.0, tmp_path)
    assert report.root_cause == "healthy", report.path
