"""Scores squashed after the model's forward (issue 33: what the loss is handed, not what the model outputs).
A link predictor whose decode() ends in .sigmoid(), scored by BCEWithLogitsLoss: the loss applies its own
sigmoid, so a positive pair can score no better than log(1 + e^-1) = 0.31 and a negative no better than
ln 2; the model's forward (node embeddings) shows nothing squashed."""

import torch
from torch import nn

import triage
from tests._instrument_runs import run as run_experiment, session_of
from triage.experiments.outputs import OUTPUT_CHECK

NODES, FEATURES = 64, 16


def graph(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(NODES, FEATURES, generator=g)
    community = torch.arange(NODES) % 4
    batches = []
    for _ in range(8):
        i, j = torch.randint(0, NODES, (2, 128), generator=g)
        batches.append((x, torch.stack([i, j]), (community[i] == community[j]).float()))
    return batches, community


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 16))

    def forward(self, x):
        return self.net(x)


def link_loss(squash):
    def loss(model, batch):
        x, pairs, label = batch
        z = model(x)
        scores = (z[pairs[0]] * z[pairs[1]]).sum(-1)
        return nn.functional.binary_cross_entropy_with_logits(scores.sigmoid() if squash else scores, label)
    return loss


def link_setup(squash=True):
    torch.manual_seed(0)
    model = Encoder()
    batches, community = graph()
    # the communities are what the features must reveal: one-hot them into the first four features
    for x, _, _ in batches:
        x[:, :4] = nn.functional.one_hot(community, 4).float() * 3
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2), loss_fn=link_loss(squash),
                        batches=batches)


def trained(squash, steps=150):
    s = link_setup(squash)
    for step in range(steps):
        s.optimizer.zero_grad()
        loss = s.loss_fn(s.model, s.batches[step % 8])
        loss.backward()
        s.optimizer.step()
    return s, loss.item()


def test_the_double_sigmoid_floors_the_loss_and_raw_scores_train_below_it():
    assert trained(squash=True)[1] > 0.5
    assert trained(squash=False)[1] < 0.3


def test_scores_squashed_in_the_loss_function_are_found_and_undone(tmp_path):
    run, _ = trained(squash=True)  # the run has stalled on its floor
    checkpoint = triage.save_checkpoint(tmp_path / "ckpt.pt", run.model, run.optimizer, step=150)
    report, _ = triage.run(lambda: link_setup(squash=True), checkpoint, out=tmp_path / "double")
    outputs = report.experiment("outputs").outcome
    assert not outputs["squashed"] and outputs["scores_squashed"]  # the model's output is embeddings
    assert (report.root_cause, report.path[-1]) == ("wrong_loss", "wrong_loss_scores")
    assert report.experiment("unsquash_scores").outcome["fix_works"]
    raw = run_experiment(OUTPUT_CHECK, session_of(lambda: link_setup(squash=False)))
    assert not raw.scores_squashed and raw.scores_unsquashed_loss is None


def test_node_pair_indices_are_not_labels_of_the_node_embeddings():
    # (2, E) indices into (N, D) embeddings index the output, they do not label it: no label check applies
    # (read as labels they were "out of range" 1533 times in 2048, a label_bug at high confidence)
    from triage.experiments.labels import LABEL_CHECK

    out = run_experiment(LABEL_CHECK, session_of(link_setup))
    assert not out.is_classification and out.out_of_range_count == 0


# --- A run that still falls on a doubly squashed loss (Deep Knowledge Tracing's sigmoid in forward() with
# binary_cross_entropy_with_logits): its replay shows no symptom, the loss call does ----------------------

def answers(seed, n):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(12, generator=g)
    out = []
    for _ in range(n):
        x = torch.randn(64, 12, generator=g)
        out.append((x, (torch.rand(64, generator=g) < torch.sigmoid(x @ w * 0.7)).float()))  # Bernoulli: floor > 0
    return out


def answers_setup(squash_twice):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1), nn.Sigmoid(), nn.Flatten(0))
    loss = nn.BCEWithLogitsLoss() if squash_twice else nn.BCELoss()
    loss_fn = lambda m, b: loss(m(b[0]), b[1])  # noqa: E731
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = answers(0, 40)
    for step in range(300):  # the checkpoint: mid-run, still falling slowly
        optimizer.zero_grad()
        loss_fn(model, batches[step % 40]).backward()
        optimizer.step()
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=loss_fn, batches=batches,
                        val_batches=answers(1, 8))


def test_a_slowly_falling_run_whose_loss_squashes_probabilities_again_is_not_healthy(tmp_path):
    report, _ = triage.run(lambda: answers_setup(squash_twice=True), None, out=tmp_path / "twice")
    assert report.root_cause == "wrong_loss" and report.confidence == "medium"  # a fact of the call, no replay
    seen = report.experiment("scores_before_healthy").outcome
    assert seen["scores_squashed"] and seen["scores_max"] - seen["scores_min"] > 0.5
    assert "binary_cross_entropy_with_logits" in report.fix
    healthy, _ = triage.run(lambda: answers_setup(squash_twice=False), None, out=tmp_path / "once")
    assert healthy.root_cause == "healthy"
