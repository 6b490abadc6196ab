"""Metric learning (issue 33, classes 2 and 5): a triplet loss with a miner on an embedding, batches of four
examples for each of eight classes, labels that name groups of examples rather than columns of the output.

Its loss does not compare two models: the miner hands it only the triplets that still violate the margin,
and the mean over those that are not zero stays put, or rises, as the embedding gets better. Held to its own
loss, a run at lr 1e-5 (a fine-tuning LR copied onto a network trained from scratch) was called healthy; held
to cross-entropy on its 64 outputs as if they were classes, a converged run at lr 1e-3 was called wrong_loss.
The figure such runs are judged by is the validation examples' nearest-neighbour agreement (precision@1)."""

import torch
import torch.nn.functional as F
from torch import nn

import triage

MARGIN, CLASSES = 0.2, 16


def manifold_classes(seed: int, per_class: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sixteen classes on a 12-dim manifold mapped into 32 features, beside 48 louder noise features: raw
    neighbours are poor, so the embedding has to be learnt."""
    g, shared = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(40)
    centers, mix = torch.randn(CLASSES, 12, generator=shared), torch.randn(12, 32, generator=shared) / 12 ** 0.5
    z = centers[:, None] + 0.55 * torch.randn(CLASSES, per_class, 12, generator=g)
    x = torch.cat([torch.tanh(z @ mix) + 0.1 * torch.randn(CLASSES, per_class, 32, generator=g),
                   2.5 * torch.randn(CLASSES, per_class, 48, generator=g)], -1).reshape(-1, 80)
    return (x - x.mean(0)) / x.std(0), torch.arange(CLASSES).repeat_interleave(per_class)


def m_per_class(x: torch.Tensor, y: torch.Tensor, n_batches: int, seed: int) -> list:
    """An MPerClassSampler's batches: four examples of each of eight classes."""
    g, out = torch.Generator().manual_seed(seed), []
    for _ in range(n_batches):
        rows = [torch.nonzero(y == c)[:, 0] for c in torch.randperm(CLASSES, generator=g)[:8]]
        idx = torch.cat([r[torch.randperm(len(r), generator=g)[:4]] for r in rows])
        out.append((x[idx], y[idx]))
    return out


def mined_triplet_loss(model, batch):
    """pytorch-metric-learning's TripletMarginMiner('all') + TripletMarginLoss with AvgNonZeroReducer."""
    x, y = batch
    emb = F.normalize(model(x), dim=1)
    dist = (emb[:, None] - emb[None]).pow(2).sum(-1).clamp_min(1e-12).sqrt()
    with torch.no_grad():
        same = y[:, None] == y[None, :]
        a, p, n = torch.where((same & ~torch.eye(len(y), dtype=torch.bool))[:, :, None] & (~same)[:, None, :])
        keep = dist[a, n] - dist[a, p] <= MARGIN
    losses = F.relu(dist[a[keep], p[keep]] - dist[a[keep], n[keep]] + MARGIN)
    return losses[losses > 0].mean() if bool((losses > 0).any()) else emb.sum() * 0


def setup_at(lr: float):
    def setup():
        torch.manual_seed(0)
        (x, y), (vx, vy) = manifold_classes(0, 90), manifold_classes(1, 30)
        model = nn.Sequential(nn.Linear(80, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 64))
        return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=lr, weight_decay=1e-4),
                            loss_fn=mined_triplet_loss, batches=m_per_class(x, y, 48, 123),
                            val_batches=m_per_class(vx, vy, 10, 321))
    return setup


def trained(lr: float, tmp_path, steps: int = 400):
    setup = setup_at(lr)()
    x, y = manifold_classes(0, 90)
    for batch in m_per_class(x, y, steps, 7):
        setup.optimizer.zero_grad()
        setup.loss_fn(setup.model, batch).backward()
        setup.optimizer.step()
    return triage.save_checkpoint(tmp_path / "ckpt.pt", setup.model, setup.optimizer, step=steps)


def test_a_fine_tuning_lr_on_a_network_trained_from_scratch_is_lr_too_low(tmp_path):
    report, _ = triage.run(setup_at(1e-5), trained(1e-5, tmp_path), out=tmp_path / "report")
    assert report.root_cause == "lr_too_low"
    trial = report.fix_trial
    # the mined loss itself barely moves; the validation neighbours are what the fix changed
    assert abs(trial.loss_with_fix - trial.loss_without_fix) < 0.2 * trial.loss_without_fix
    assert trial.neighbours_with_fix > trial.neighbours_without_fix + 0.05
    assert "nearest neighbour shares their label" in trial.sentence()


def test_a_converged_run_is_not_held_to_cross_entropy_on_its_embedding(tmp_path):
    report, _ = triage.run(setup_at(1e-3), trained(1e-3, tmp_path), out=tmp_path / "report")
    assert report.root_cause == "healthy"
    assert report.experiment("standard_loss") is None  # no standard loss for labels that name groups
