"""A validation set drawn from the training images, under a loss with no level (the ninth round's Deep SVDD:
the mean squared distance of each embedding to a fixed centre). Its snapshot holds several epochs of the same
images, so every training example "repeats another": read as the data's own repetition, the copies were
excused, and the flat, levelless loss went to healthy (low). Passes over the data are not repetition, and a
validation set of copies is a fault whatever a loss with no level does."""

import torch
from torch import nn

import triage

IMAGES, BATCH = 256, 32


def normals(seed: int, n: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 16, generator=g) @ torch.randn(16, 16, generator=torch.Generator().manual_seed(5)) * 0.3


def factory(val_from_train: bool):
    def deep_svdd(model, batch):
        (x,) = batch
        return ((model(x) - model.center) ** 2).sum(1).mean()

    def setup():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32, bias=False), nn.LeakyReLU(), nn.Linear(32, 8, bias=False))
        model.register_buffer("center", torch.full((8,), 0.1))
        x = normals(0, IMAGES)
        epochs = [x[torch.randperm(IMAGES, generator=torch.Generator().manual_seed(e))] for e in range(5)]
        batches = [(epoch[i:i + BATCH],) for epoch in epochs for i in range(0, IMAGES, BATCH)]  # 5 passes
        val = x[:64] if val_from_train else normals(1, 64)
        return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-6),
                            loss_fn=deep_svdd, batches=batches, val_batches=[(val[:32],), (val[32:],)])
    return setup


def triaged(val_from_train: bool, tmp_path):
    setup = factory(val_from_train)
    run = setup()
    for step in range(1500):
        run.optimizer.zero_grad()
        run.loss_fn(run.model, run.batches[step % len(run.batches)]).backward()
        run.optimizer.step()
    checkpoint = triage.save_checkpoint(tmp_path / "ckpt.pt", run.model, run.optimizer, step=1500)
    return triage.run(setup, checkpoint, out=tmp_path / "report")[0]


def test_a_validation_set_of_training_copies_is_not_excused_by_the_snapshots_passes(tmp_path):
    """(This replica still learns, so it reaches the overlap through val_check; the ninth round's Deep SVDD,
    flat, reaches it through the levelless branch: benchmarks/programs.py --only deep_svdd_one_class.)"""
    report = triaged(val_from_train=True, tmp_path=tmp_path)
    assert report.root_cause == "train_val_overlap" and report.path[-1] != "train_val_overlap_repeats"
    overlap = report.experiment("overlap").outcome
    assert overlap["duplicate_fraction"] == 1.0 and overlap["train_repeat_fraction"] == 0.0  # 5 passes, no repeats


def test_the_same_run_with_fresh_validation_images_is_not(tmp_path):
    assert triaged(val_from_train=False, tmp_path=tmp_path).root_cause != "train_val_overlap"


def test_validation_rows_repeating_training_as_often_as_training_repeats_itself_is_a_finding(tmp_path):
    """Rows drawn from few distinct inputs (popular interactions, windows of one trajectory): validation
    repeats training about as often as training repeats itself, which is the data's own repetition as often
    as a leak (the repeats verdict was right once in four on the real programs). A finding; the walk goes on."""
    def setup():
        g = torch.Generator().manual_seed(0)
        points = torch.randn(40, 8, generator=g)
        labels = (points @ torch.randn(8, generator=g) > 0).long()
        draw = torch.randint(0, 40, (1280 + 256,), generator=g)  # each row one of 40 inputs
        x, y = points[draw], labels[draw]
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
        return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                            loss_fn=lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]),
                            batches=[(x[i:i + 32], y[i:i + 32]) for i in range(0, 1280, 32)],
                            val_batches=[(x[i:i + 64], y[i:i + 64]) for i in range(1280, 1536, 64)])

    run = setup()
    for step in range(20):
        run.optimizer.zero_grad()
        run.loss_fn(run.model, run.batches[step % len(run.batches)]).backward()
        run.optimizer.step()
    checkpoint = triage.save_checkpoint(tmp_path / "ckpt.pt", run.model, run.optimizer, step=20)
    report, _ = triage.run(setup, checkpoint, out=tmp_path / "report")
    assert report.experiment("overlap").outcome["train_repeat_fraction"] > 0.9
    assert report.root_cause != "train_val_overlap"
    assert "train_val_overlap_repeats" in [f.id for f in report.findings]
