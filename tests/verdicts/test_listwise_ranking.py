"""Listwise learning to rank (issue 33, classes 2 and 8; the seventh blind round): ListNet's loss is a
cross-entropy between the softmax of a query's relevance grades and the softmax of its documents' scores.
Adding one constant to every score leaves it unchanged, and its floor is the grades' own entropy, not 0.
Held to MSE on the grades as its "standard loss", a healthy run was called wrong_loss with "high": the level
of its scores drifts while their order holds, so their MSE rose as the run trained."""

import math

import torch
import torch.nn.functional as F
from torch import nn

import triage

SLATE, FEATURES, PADDING = 30, 20, -1.0


def slates(seed: int, queries: int, aligned: bool = True):
    """Queries of 8-30 documents, padded to SLATE (features 0, grade -1), grades 0-4 from a hidden utility."""
    shared, g = torch.Generator().manual_seed(91), torch.Generator().manual_seed(seed)
    w1, w2 = torch.randn(FEATURES, 16, generator=shared) / math.sqrt(FEATURES), torch.randn(16, generator=shared)
    x, y = torch.zeros(queries, SLATE, FEATURES), torch.full((queries, SLATE), PADDING)
    for q in range(queries):
        n = int(torch.randint(8, SLATE + 1, (1,), generator=g))
        docs = torch.randn(n, FEATURES, generator=g) + 0.5 * torch.randn(1, FEATURES, generator=g)  # the query's
        utility = torch.tanh(docs @ w1) @ w2 + 0.3 * torch.randn(n, generator=g)
        grades = torch.bucketize(utility - utility.mean(), torch.tensor([-0.6, 0.2, 0.9, 1.6])).float()
        x[q, :n] = docs
        y[q, :n] = grades if aligned else grades[torch.randperm(n, generator=g)]
    return x, y


def list_net(model, batch):
    """allRank's listNet: padded documents get -inf on both sides of the softmax."""
    x, y = batch
    scores, grades = model(x).clone(), y.clone()
    padded = y == PADDING
    scores[padded], grades[padded] = float("-inf"), float("-inf")
    return torch.mean(-torch.sum(F.softmax(grades, 1) * torch.log(F.softmax(scores, 1) + 1e-10), 1))


def setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.LayerNorm(FEATURES), nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1), nn.Flatten(-2))  # a score per document: (queries, SLATE)
    for weight in (p for p in model.parameters() if p.dim() > 1):
        nn.init.xavier_uniform_(weight)  # allRank's init
    (x, y), (vx, vy) = slates(0, 640), slates(1, 128)
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), loss_fn=list_net,
                        batches=[(x[i:i + 16], y[i:i + 16]) for i in range(0, 640, 16)],
                        val_batches=[(vx[i:i + 16], vy[i:i + 16]) for i in range(0, 128, 16)])


def test_a_healthy_listnet_run_is_not_held_to_mse_on_its_grades(tmp_path):
    run = setup()
    for step in range(400):
        run.optimizer.zero_grad()
        run.loss_fn(run.model, run.batches[step % len(run.batches)]).backward()
        run.optimizer.step()
    torch.save(run.model.state_dict(), tmp_path / "model.pkl")  # as allRank saves it: the weights alone
    report, _ = triage.run(setup, tmp_path / "model.pkl", out=tmp_path / "report")
    assert report.root_cause == "healthy"
    assert report.experiment("standard_loss") is None
    assert report.experiment("outputs").outcome["standard_rule"] is None


def test_the_grades_neighbours_predict_each_documents_own_unless_they_were_shuffled():
    """A list's documents are its examples: the kNN target correlation reads them, padding once."""
    from tests._instrument_runs import run as run_experiment, session_of
    from triage.experiments.labels import LABEL_CHECK

    def with_grades(aligned: bool):
        def factory():
            made = setup()
            x, y = slates(0, 640, aligned)
            return made.model_copy(update={"batches": [(x[i:i + 16], y[i:i + 16]) for i in range(0, 640, 16)]})
        return run_experiment(LABEL_CHECK, session_of(factory)).knn_target_correlation

    assert with_grades(True) > 0.4 and abs(with_grades(False)) < 0.1
