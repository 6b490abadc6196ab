"""Which labels name groups of examples (metric learning) rather than output columns, and the validation
figure such runs are judged by: the share of examples whose nearest neighbour, by the model's output,
shares their label."""

import torch
import torch.nn.functional as F
from torch import nn

import triage
from tests._instrument_runs import digits, session_of
from tests.verdicts.test_metric_learning import mined_triplet_loss
from triage.experiments.neighbours import labels_name_groups, neighbour_agreement


def session_with(loss_fn, classes: int = 10):
    def setup():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, classes))
        return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=loss_fn,
                            batches=digits(4))
    return session_of(setup)


def cross_entropy(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y, label_smoothing=0.1)


def balanced_cross_entropy(model, batch):
    """Class weights from the batch's own counts: the labels couple examples, yet each scores its column."""
    x, y = batch
    weights = 1.0 / torch.bincount(y, minlength=10).clamp_min(1).float()
    return F.cross_entropy(model(x), y, weight=weights)


def test_an_embedding_trained_by_a_mined_triplet_loss_has_labels_that_name_groups():
    assert labels_name_groups(session_with(mined_triplet_loss, classes=32))


def test_a_classifier_scores_its_label_column_even_with_weights_from_the_batch():
    assert not labels_name_groups(session_with(cross_entropy))
    assert not labels_name_groups(session_with(balanced_cross_entropy))


def mixup(model, batch):
    """Mixup as timm writes it: each row scored against its label and a shuffled partner's, by a weight drawn
    from Beta(0.4, 0.4) (under 0.5, the partner's label is the column pushed hardest)."""
    x, y = batch
    lam = float(torch.distributions.Beta(0.4, 0.4).sample())
    perm = torch.randperm(len(y))
    out = model(lam * x + (1 - lam) * x[perm])
    return lam * F.cross_entropy(out, y) + (1 - lam) * F.cross_entropy(out, y[perm])


def test_mixup_couples_examples_through_their_labels_yet_pushes_label_columns_whatever_its_draw():
    for seed in range(4):
        torch.manual_seed(seed)
        assert not labels_name_groups(session_with(mixup))


def test_more_classes_than_embedding_columns_still_name_groups():
    """Ten digit classes on an 8-dim embedding: no column is any label's, and the triplet loss couples them."""
    assert labels_name_groups(session_with(mined_triplet_loss, classes=8))


def test_episode_ids_grouping_a_policy_gradients_returns_are_no_groups():
    """REINFORCE with returns normalised per episode: the episode ids couple examples and index no column,
    but the loss reads a float per example beside them (the returns)."""
    def reinforce(model, batch):
        x, returns, episode = batch
        log_probs = model(x).log_softmax(-1)[:, 0]
        means = torch.zeros(int(episode.max()) + 1).index_add_(0, episode, returns) \
            / torch.bincount(episode).clamp_min(1)
        return -(log_probs * (returns - means[episode])).mean()

    def setup():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 2))
        batches = [(x, torch.randn(len(y), generator=torch.Generator().manual_seed(i)), 10 + torch.arange(len(y)) // 8)
                   for i, (x, y) in enumerate(digits(4))]
        return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=reinforce,
                            batches=batches)
    assert not labels_name_groups(session_of(setup))


class Fixed(nn.Module):
    """Outputs the batch's own rows: the neighbour agreement of the inputs themselves."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))

    def forward(self, x):
        return x * self.w


def test_neighbour_agreement_is_one_on_separated_groups_and_near_chance_on_noise():
    g = torch.Generator().manual_seed(0)
    y = torch.arange(4).repeat_interleave(50)
    separated = torch.eye(4)[y] * 10 + 0.1 * torch.randn(200, 4, generator=g)
    noise = torch.randn(200, 4, generator=g)
    model = Fixed()
    setup = triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                         loss_fn=lambda model, batch: model(batch[0]).sum(), batches=[(separated, y)])
    found = neighbour_agreement(setup, [(separated[:100], y[:100]), (separated[100:], y[100:])], torch.device("cpu"))
    assert found.agreement == 1.0 and found.examples == 200
    assert abs(neighbour_agreement(setup, [(noise, y)], torch.device("cpu")).agreement - 0.25) < 0.1
    assert neighbour_agreement(setup, [(noise, torch.zeros(200, dtype=torch.long))], torch.device("cpu")) is None
