"""The report names what it found in the run's own coordinates: a bad batch by the training step at which it
was used (a capture's record, else the checkpoint's step + its place in the replay), the tensor of the batch
and the value in it that is wrong; replay plots count the run's steps. Where no step is known it says
"snapshot batch"."""

from __future__ import annotations

import math

import torch
from torch import nn

import triage
from tests.zoo.test_e2e_zoo import triage_example
from tests.flight.test_recorder import digits
from tests.tiny import cross_entropy
from triage.cli.zoo import load_example
from triage.report.coordinates import batch_place
from triage.report.model import CheckpointInfo


def test_a_bad_batch_is_named_by_the_run_s_step_and_the_tensor_and_value_that_stand_out(tmp_path):
    example = load_example("bad_batch")
    _, report, files = triage_example("bad_batch", tmp_path)
    assert report.root_cause == "bad_batch" and report.location.batch == example.BAD_BATCH
    place = report.location.batch_place
    step = report.checkpoint.step + 1 + example.BAD_BATCH  # the replay continues the run's count
    assert (place.step, place.step_source) == (step, "replay")
    x = example.setup().batches[example.BAD_BATCH][0]  # the inputs, x1000
    assert place.tensor == "[0]" and place.value == x[tuple(place.value_index)].item()
    assert abs(place.value) == x.abs().max().item() and place.typical_value < abs(place.value) / 100
    summary = files["md"].read_text()
    assert f"step `{step}`" in summary and f"snapshot batch {example.BAD_BATCH}" in summary
    assert "tensor `[0]`" in summary
    (skip,) = report.fix_trial.changes
    assert skip.run_steps == [step] and f"(step {step} of the run)" in report.fix_trial.sentence()
    html = files["html"].read_text()
    assert f"step of the run (the checkpoint's is {report.checkpoint.step})" in html  # the replay plots' x axis


def test_a_non_finite_value_is_named_by_tensor_place_and_count(tmp_path):
    example = load_example("nonfinite_data")
    _, report, files = triage_example("nonfinite_data", tmp_path)
    place = report.location.batch_place
    assert place.batch == example.BAD_BATCH and place.step == report.checkpoint.step + 1 + example.BAD_BATCH
    batch = example.setup().batches[example.BAD_BATCH]
    tensor = dict(triage.batches.named_tensors(batch))[place.tensor]
    assert math.isnan(place.value) and math.isnan(tensor[tuple(place.value_index)].item())
    assert place.nonfinite == int((~torch.isfinite(tensor)).sum()) and place.numel == tensor.numel()
    assert f"holds NaN at {place.value_index}".replace("[", "\\[").replace("]", "\\]") in files["md"].read_text()


def test_without_a_checkpoint_step_the_batch_keeps_its_snapshot_index():
    report = _report_with(CheckpointInfo(path=None, layout=None, step=None))
    place = batch_place(report, 2)
    assert place.step is None and place.step_words() == "snapshot batch 2"


def test_a_capture_s_record_of_steps_wins_over_the_replay_s_count():
    # The capture saved the batches after its checkpoint first, then older ones: the third was used at step 1.
    report = _report_with(CheckpointInfo(path=None, layout="dict", step=25, batch_steps=[26, 27, 1, 2]))
    assert (batch_place(report, 2).step, batch_place(report, 2).step_source) == (1, "capture")
    assert batch_place(report, 2).step_words().startswith("step 1 of the run")


def test_a_captured_bad_batch_is_named_by_the_step_the_run_used_it_at(tmp_path):
    batches = digits()
    bad_step = 8  # after the snapshot at step 5: the snapshot holds steps 6-8 first, then 1-5
    bad = (bad_step - 1) % len(batches)
    batches[bad] = (batches[bad][0] * 1000, batches[bad][1])

    def build():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
        return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    model, opt = build()
    rec = triage.Recorder(model, opt, dir=tmp_path / "captures", entry="mymod:setup",
                          settings=triage.RecorderSettings(snapshot_every=5, keep_batches=16))
    for step in range(1, bad_step + 1):
        batch = batches[(step - 1) % len(batches)]
        opt.zero_grad()
        loss = cross_entropy(model, batch)
        loss.backward()
        opt.step()
        rec.step(loss, batch)
    folder = rec.capture("the loss jumped")  # the spike trigger waits for more history than 8 steps

    def setup():
        model, opt = build()
        return triage.Setup(model=model, optimizer=opt, loss_fn=cross_entropy, batches=triage.load_batches(folder))

    report, _ = triage.run(setup, folder, out=tmp_path / "report")
    assert report.root_cause == "bad_batch", report.path
    place = report.location.batch_place
    assert report.checkpoint.batch_steps[report.location.batch] == bad_step
    assert (place.step, place.step_source, place.tensor) == (bad_step, "capture", "[0]")


def _report_with(checkpoint: CheckpointInfo):
    from tests.report.test_report_render import crafted_report

    return crafted_report().model_copy(update={"checkpoint": checkpoint})


def test_a_replay_that_went_non_finite_is_placed_at_the_run_s_step(tmp_path):
    from triage.cli.verdict import verdict_lines

    _, report, files = triage_example("fp16_overflow", tmp_path)
    baseline = report.experiment("baseline")
    step = report.checkpoint.step + 1 + baseline.outcome["first_nonfinite_step"]
    said = dict(verdict_lines(report))
    assert f"non-finite at step {step} of the run" in said["Proof"]
    assert f"non-finite at step {step} of the run" in files["md"].read_text()


def test_the_terminal_names_the_bad_batch_by_step_and_tensor(tmp_path):
    from triage.cli.verdict import verdict_lines

    _, report, _ = triage_example("bad_batch", tmp_path)
    place = report.location.batch_place
    assert dict(verdict_lines(report))["Where"].startswith(
        f"step {place.step} of the run (snapshot batch {place.batch}: checkpoint step {report.checkpoint.step} + "
        f"{place.batch + 1}): tensor [0] holds ")
