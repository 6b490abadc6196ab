"""The flight recorder in a plain loop: triggers, bounds, the capture folder, and triage on a capture."""

import json
import math
import random

import torch
from torch import nn

import triage
from tests.tiny import cross_entropy
from triage.flight.memory import BatchRing, cpu_copy
from triage.flight.triggers import TriggerSettings, TriggerWatch
from triage.load.checkpoint import read_checkpoint


def watch_losses(losses, grad_norms=None, **settings):
    watch = TriggerWatch(TriggerSettings(**settings))
    for step, loss in enumerate(losses, 1):
        fired = watch.observe(step, loss, grad_norms[step - 1] if grad_norms else 1.0)
        if fired:
            return fired
    return None


def noisy_descent(n, seed=0):
    rng = random.Random(seed)
    return [2.3 * math.exp(-i / 150) + 0.3 + rng.gauss(0, 0.08) for i in range(n)]


def test_a_healthy_noisy_run_fires_nothing():
    for seed in range(5):
        assert watch_losses(noisy_descent(800, seed)) is None


def test_nonfinite_loss_and_gradient_fire_at_their_step():
    assert watch_losses([2.0, 1.9, float("nan")]).model_dump(include={"kind", "step"}) == {
        "kind": "nonfinite_loss", "step": 3}
    fired = watch_losses([2.0, 1.9, 1.8], grad_norms=[1.0, float("inf"), 1.0])
    assert (fired.kind, fired.step) == ("nonfinite_grad", 2)


def test_a_spike_fires_even_while_the_loss_is_still_falling_fast():
    losses = [2.3 - i * 0.03 for i in range(59)] + [8.0]  # falling fast: the level spread is wide
    fired = watch_losses(losses)
    assert (fired.kind, fired.step) == ("spike", 60)


def test_plateau_is_off_by_default_and_fires_on_a_flat_window_when_set():
    flat = noisy_descent(200)[:40] + [1.5 + 0.01 * (i % 3) for i in range(400)]
    assert watch_losses(flat) is None
    fired = watch_losses(flat, plateau_window=200)
    assert fired.kind == "plateau" and fired.step > 200
    assert watch_losses(noisy_descent(400), plateau_window=200) is None


def test_the_batch_ring_keeps_the_latest_within_its_count_and_bytes():
    ring = BatchRing(keep=4, max_bytes=10 * 400)
    for step in range(1, 11):
        ring.add(step, (torch.zeros(100), torch.zeros(0)))  # 400 bytes each
    assert [s for s, _ in ring.items()] == [7, 8, 9, 10]
    small = BatchRing(keep=10, max_bytes=1000)
    for step in range(1, 11):
        small.add(step, torch.zeros(100))
    assert [s for s, _ in small.items()] == [9, 10] and small.bytes <= 1000


def test_a_cpu_copy_keeps_tied_tensors_tied():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight
    copy = cpu_copy(model.state_dict())
    assert copy["0.weight"] is copy["1.weight"]
    assert copy["0.weight"].data_ptr() != model[0].weight.data_ptr()


# --- the plain loop -----------------------------------------------------------------------------------

def digits(n_batches=16, batch_size=64):
    """scikit-learn's bundled 8x8 digits (no download), standardised, as (x, y) batches."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32)
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    y = torch.tensor(y)
    return [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, n_batches * batch_size, batch_size)]


def build(jump_at=40):
    """An MLP on the digits with SGD at lr 0.05; the schedule jumps x20 at `jump_at` (a schedule bug)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 if s < jump_at else 20.0)
    return model, opt, sched


def train(tmp_path, steps=200, settings=None, batches=None):
    model, opt, sched = build()
    batches = batches or digits()
    settings = settings or triage.RecorderSettings(snapshot_every=25, keep_batches=32)
    rec = triage.Recorder(model, opt, sched, dir=tmp_path / "captures", entry="mymod:setup", settings=settings)
    weights = {}
    for step in range(1, steps + 1):
        batch = batches[(step - 1) % len(batches)]
        opt.zero_grad()
        loss = cross_entropy(model, batch)
        loss.backward()
        opt.step()
        sched.step()
        weights[step] = model[0].weight.detach().clone()
        if rec.step(loss, batch):
            break
    return rec, weights, batches, step


def test_a_diverging_loop_writes_a_capture_that_triage_reads(tmp_path, caplog):
    rec, weights, batches, last = train(tmp_path)
    assert len(rec.captures) == 1 and last < 200, "the divergence after the LR jump should have fired"
    folder = rec.captures[0]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["trigger"]["kind"] in ("spike", "nonfinite_loss") and manifest["step"] == last
    assert manifest["checkpoint_step"] == 25 and manifest["framework"] == "torch"
    assert f"triage run --checkpoint {folder} --entry mymod:setup" in caplog.text
    ckpt = read_checkpoint(folder)  # the capture folder itself is a checkpoint triage understands
    assert ckpt.step == 25 and ckpt.capture_dir == folder
    assert torch.equal(ckpt.model_state["0.weight"], weights[25]), "the checkpoint is the state after step 25"
    assert ckpt.scheduler_state["last_epoch"] == 25
    assert len(ckpt.history) == last and math.isfinite(ckpt.history[0].loss)
    saved = triage.load_batches(folder)
    steps = manifest["batch_steps"]
    assert steps[: last - 25] == list(range(26, last + 1)), "the batches after the checkpoint come first"
    for step, batch in zip(steps, saved):
        assert torch.equal(batch[0], batches[(step - 1) % len(batches)][0])


def test_a_capture_is_recognised_once_with_its_manifest(tmp_path):
    """Loading reads the capture's manifest once, into the Checkpoint: the derived setups and the report
    read it there, not from the folder again. A checkpoint that is no capture carries none."""
    rec, _, _, last = train(tmp_path)
    folder = rec.captures[0]
    written = json.loads((folder / "manifest.json").read_text())
    ckpt = read_checkpoint(folder)
    assert ckpt.manifest is not None
    assert (ckpt.manifest.checkpoint_step, ckpt.manifest.step) == (written["checkpoint_step"], written["step"])
    assert ckpt.manifest.batch_steps == written["batch_steps"]
    inner = read_checkpoint(folder / written["checkpoint"])
    assert inner.manifest is None and inner.capture_dir is None


def test_a_failure_before_the_first_snapshot_captures_the_initial_state(tmp_path):
    model, opt, sched = build()
    initial = model[0].weight.detach().clone()
    rec = triage.Recorder(model, opt, dir=tmp_path)
    x, y = digits(1)[0]
    loss = cross_entropy(model, (x, y))
    loss.backward()
    folder = rec.step(loss * float("nan"), (x, y))
    assert torch.equal(read_checkpoint(folder).model_state["0.weight"], initial)


def test_manual_capture_and_the_capture_limit(tmp_path):
    settings = triage.RecorderSettings(max_captures=1)
    rec, _, _, _ = train(tmp_path, steps=10, settings=settings)
    folder = rec.capture("checking")
    assert json.loads((folder / "manifest.json").read_text())["trigger"]["kind"] == "manual"
    assert rec.capture() is None and len(rec.captures) == 1


def test_triage_diagnoses_the_capture(tmp_path):
    rec, _, _, _ = train(tmp_path)
    folder = rec.captures[0]

    def setup():
        model, opt, sched = build()
        return triage.Setup(model=model, optimizer=opt, scheduler=sched, loss_fn=cross_entropy,
                            batches=triage.load_batches(folder))

    report, _ = triage.run(setup, folder, out=tmp_path / "report")
    assert report.root_cause == "lr_too_high"


def test_noise_on_a_flat_loss_spends_no_capture_and_the_later_real_spike_gets_it():
    """A loss flat at 2.0 with tiny step-to-step noise: a blip of 0.05 is many robust deviations of that noise,
    yet 2.5 % of the loss's level; the later real spike (to 6.0) is the failure the one capture is for."""
    rng = random.Random(0)
    flat = [2.0 + rng.gauss(0, 0.001) for _ in range(300)]
    flat[150] += 0.05  # a harmless blip: z ~ 35, a 2.5 % rise
    assert watch_losses(flat) is None
    fired = watch_losses(flat + [6.0])
    assert (fired.kind, fired.step) == ("spike", 301)
    assert "a rise of 200% of that level" in fired.detail


def test_with_one_capture_the_recorder_keeps_it_for_the_real_spike_not_the_noise(tmp_path):
    model = nn.Linear(2, 1)
    recorder = triage.Recorder(model, torch.optim.SGD(model.parameters(), lr=0.1), dir=tmp_path,
                               settings=triage.RecorderSettings(max_captures=1))
    rng = random.Random(1)
    losses = [2.0 + rng.gauss(0, 0.001) for _ in range(300)]
    losses[150] += 0.05  # noise on a flat loss
    for loss in losses + [6.0]:  # then the failure
        recorder.step(torch.tensor(loss), grad_norm=1.0)
    assert len(recorder.captures) == 1
    manifest = json.loads((recorder.captures[0] / "manifest.json").read_text())
    assert manifest["trigger"]["kind"] == "spike" and manifest["step"] == 301
