"""A self-supervised objective minimised by a collapsed representation (issue 33, "floors nobody measured"):
SimSiam's negative cosine between the two views' branches has no level and no floor triage can measure, and
without its stop-gradient it falls by giving every input the same output. The outputs say so."""

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

import triage
from triage.experiments.outputs import least_spread


def test_outputs_spread_over_every_direction_score_one_and_one_vector_for_every_input_zero():
    g = torch.Generator().manual_seed(0)
    spread = torch.randn(256, 32, generator=g)
    one_vector = torch.randn(1, 32, generator=g) + 1e-3 * torch.randn(256, 32, generator=g)
    assert 0.95 < least_spread([[spread]]) < 1.05
    assert least_spread([[one_vector]]) < 0.01
    assert least_spread([[spread, one_vector]]) == least_spread([[one_vector]])  # the least spread output
    assert least_spread([[spread[:4]]]) is None  # too few rows to tell
    assert least_spread([]) is None  # a loss_fn that never calls the model


def views(n_batches=40):
    g = torch.Generator().manual_seed(0)
    x = torch.tensor(load_digits().data, dtype=torch.float32) / 16
    batches = []
    for _ in range(n_batches):
        base = x[torch.randint(0, len(x), (128,), generator=g)]
        batches.append(tuple(base + 0.3 * torch.randn(base.shape, generator=g) for _ in range(2)))
    return batches


class SimSiam(nn.Module):
    def __init__(self, stop_gradient: bool):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(64, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Linear(128, 32))
        self.predictor = nn.Sequential(nn.Linear(32, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 32))
        self.stop_gradient = stop_gradient

    def forward(self, x1, x2):
        z1, z2 = self.encoder(x1), self.encoder(x2)
        p1, p2 = self.predictor(z1), self.predictor(z2)
        if self.stop_gradient:
            z1, z2 = z1.detach(), z2.detach()
        return p1, p2, z1, z2


def negative_cosine(model, batch):
    p1, p2, z1, z2 = model(*batch)
    return -0.5 * (F.cosine_similarity(p1, z2).mean() + F.cosine_similarity(p2, z1).mean())


def simsiam_setup(stop_gradient: bool) -> triage.Setup:
    torch.manual_seed(0)
    model = SimSiam(stop_gradient)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    batches = views()
    for step in range(150):  # the checkpoint: 150 steps in
        optimizer.zero_grad()
        negative_cosine(model, batches[step % 40]).backward()
        optimizer.step()
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=negative_cosine, batches=batches)


def test_a_simsiam_without_its_stop_gradient_collapses_and_the_verdict_says_so(tmp_path):
    """Was: healthy (low), "a loss with no level": the flat stretch of a loss with no level is no symptom."""
    report, _ = triage.run(lambda: simsiam_setup(stop_gradient=False), None, out=tmp_path / "collapsed")
    assert (report.root_cause, report.confidence) == ("wrong_loss", "medium"), report.path
    assert report.path[-1] == "wrong_loss_collapsed" and "stop-gradient" in report.fix
    assert report.experiment("outputs").outcome["least_spread"] < 0.25

    healthy, _ = triage.run(lambda: simsiam_setup(stop_gradient=True), None, out=tmp_path / "healthy")
    assert healthy.root_cause == "healthy"
