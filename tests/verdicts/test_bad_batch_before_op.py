"""A batch the loss cannot score, before the op is blamed (issue 33, class 7): a CTC run whose one clip is
shorter than its transcript. ctc_loss is inf there (no alignment exists) from finite data; nothing grew,
so "values overflow" would be a false claim, and the run without that batch trains."""

import torch
from torch import nn

import triage

T, B, F, C = 20, 8, 12, 6  # frames, batch, features, classes (0: the blank)
IMPOSSIBLE = 3  # the batch whose first clip is 4 frames long, its transcript 7 labels


def clips(n=8):
    g = torch.Generator().manual_seed(0)
    batches = []
    for i in range(n):
        x = torch.randn(B, T, F, generator=g)
        lengths = torch.full((B,), T, dtype=torch.long)
        target_lengths = torch.randint(3, 7, (B,), generator=g)
        targets = torch.randint(1, C, (B, 8), generator=g)
        if i == IMPOSSIBLE:
            lengths[0], target_lengths[0] = 4, 7
        batches.append((x, lengths, targets, target_lengths))
    return batches


class Recogniser(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(F, 32, batch_first=True)
        self.out = nn.Linear(32, C)

    def forward(self, x):
        return self.out(self.rnn(x)[0]).log_softmax(-1)


def ctc(model, batch):
    x, lengths, targets, target_lengths = batch
    return nn.functional.ctc_loss(model(x).transpose(0, 1), targets, lengths, target_lengths)


def setup():
    torch.manual_seed(0)
    model = Recogniser()
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), loss_fn=ctc,
                        batches=clips())


def test_the_fault_is_stock_pytorch_and_leaving_the_batch_out_trains():
    s = setup()
    assert torch.isinf(ctc(s.model, s.batches[IMPOSSIBLE]))
    losses = []
    for step in range(40):
        batch = s.batches[[i for i in range(8) if i != IMPOSSIBLE][step % 7]]
        s.optimizer.zero_grad()
        loss = ctc(s.model, batch)
        loss.backward()
        s.optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < 0.6 * losses[0]


def test_a_batch_the_loss_cannot_score_is_the_cause_not_the_op(tmp_path):
    report, _ = triage.run(setup, None, out=tmp_path)
    assert report.root_cause == "bad_batch" and report.path[-2:] == ["skip_nonfinite", "bad_batch_nonfinite"]
    assert report.location.batch == IMPOSSIBLE and "nn.functional.ctc_loss" in report.fix
    assert report.experiment("batches").outcome["nonfinite_batches"] == [IMPOSSIBLE]
    skip = report.experiment("skip_nonfinite").outcome
    assert skip["fix_works"] and skip["skipped"] == [IMPOSSIBLE]
    # ctc_loss has no second derivative: the curvature probe says it does not apply, it does not raise
    assert report.experiment("sharpness").status == "not_applicable"
