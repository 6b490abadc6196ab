"""A batch a GradScaler skips on every pass: the replay stays finite and the run may come out healthy, but
the report says which batch is never learned from (measured first on an H200: the bad_batch example under
fp16 skipped its x1000 batch on each of its 3 passes). Here on CPU, the run's own AMP-style step with a
GradScaler("cpu"), and a batch in raw units whose scaled loss overflows fp32 at every scale it reaches."""

import pytest
import torch

import triage

BAD = 3  # the snapshot batch exported in the wrong units


def batches(bad: bool):
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(8):
        x = torch.randn(32, 16, generator=g)
        y = (x[:, 0] > 0).long()
        out.append((x * 1e37 if bad and i == BAD else x, y))
    return out


def loss_fn(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


def make_setup(bad: bool, zero_grad_last: bool = False, accumulate: int = 1):
    """The run's AMP-style step: zero_grad first (or last, after the update), one micro-batch a step (or
    `accumulate`: the scaler steps every `accumulate` calls)."""
    def setup():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        scaler = torch.amp.GradScaler("cpu")
        calls = [0]

        def train_step(model, optimizer, batch):
            if not zero_grad_last and calls[0] % accumulate == 0:
                optimizer.zero_grad(set_to_none=True)
            calls[0] += 1
            loss = loss_fn(model, batch)
            scaler.scale(loss / accumulate).backward()
            if calls[0] % accumulate == 0:
                scaler.step(optimizer)  # skipped where a gradient overflowed
                scaler.update()
                if zero_grad_last:
                    optimizer.zero_grad(set_to_none=True)
            return loss.detach()

        return triage.Setup(model=model, optimizer=optimizer, loss_fn=loss_fn, batches=batches(bad),
                            train_step=train_step, scaler=scaler)
    return setup


def walk(bad: bool, tmp_path, **loop):
    s = make_setup(bad)()
    checkpoint = triage.save_checkpoint(tmp_path / "c.pt", s.model, s.optimizer, step=0)
    report, _ = triage.run(make_setup(bad, **loop), checkpoint, out=tmp_path / "out")
    baseline = next(e.outcome for e in report.experiments if e.node == "baseline")
    return report, baseline


@pytest.mark.parametrize("zero_grad_last", [False, True], ids=["zero_grad first", "zero_grad after the update"])
def test_a_batch_the_scaler_skips_on_every_pass_is_named(tmp_path, zero_grad_last):
    report, baseline = walk(True, tmp_path, zero_grad_last=zero_grad_last)
    assert baseline["finite"]  # the scaler kept the replay finite: nothing diverged
    assert baseline["overflowing_batches"] == [BAD]
    assert baseline["overflow_steps"] and all(step % 8 == BAD for step in baseline["overflow_steps"])
    (finding,) = [f for f in report.findings if f.id == "scaler_skips_a_batch"]
    assert f"batch(es) [{BAD}]" in finding.text
    assert f"{baseline['overflow_count']} of {baseline['steps_run']} steps skipped" in finding.text


def test_a_run_whose_scaler_skips_nothing_has_no_such_finding(tmp_path):
    report, baseline = walk(False, tmp_path)
    assert baseline["overflow_steps"] == [] and baseline["overflowing_batches"] == []
    assert "scaler_skips_a_batch" not in [f.id for f in report.findings]


def test_under_gradient_accumulation_the_skips_are_counted_but_no_batch_is_blamed(tmp_path):
    """The scaler steps once per two micro-batches: its skip shows at the one that stepped, which may not
    be the one that overflowed, so no batch is named."""
    report, baseline = walk(True, tmp_path, accumulate=2)
    assert baseline["overflow_count"] > 0 and baseline["overflowing_batches"] == []
    assert "scaler_skips_a_batch" not in [f.id for f in report.findings]
