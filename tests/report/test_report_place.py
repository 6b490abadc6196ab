"""Where the watcher's reports go: never where a setup()'s capture glob finds them, and a report folder
handed to load_batches() names the capture it belongs to."""

from __future__ import annotations

import json
from pathlib import Path
import subprocess

import pytest
import torch

import triage
from triage.cli.watch.sidecar import WatchOptions
from triage.flight.autotriage import AutoTriage, launch
from triage.flight.places import LAUNCH_LOG, report_dir


def a_capture(captures: Path) -> Path:
    """A real capture of a tiny run (an explicit capture() after a few healthy steps)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = triage.Recorder(model, opt, dir=captures, entry="mymod:setup",
                          settings=triage.RecorderSettings(snapshot_every=1))
    for _ in range(5):
        x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        rec.step(loss, (x, y))
    return rec.capture("test")


def test_the_watchers_report_folder_is_not_found_by_a_capture_glob(tmp_path):
    captures = tmp_path / "captures"
    capture = a_capture(captures)
    report = WatchOptions(root=captures).report_dir(capture)
    report.mkdir(parents=True)
    (report / "triage.log").write_text("")
    assert report == tmp_path / "captures-reports" / capture.name
    assert list(captures.glob("capture-*")) == [capture]
    assert [p for p in captures.glob("*")] == [capture]
    assert WatchOptions(root=captures, out=tmp_path / "elsewhere").report_dir(capture) == tmp_path / "elsewhere" / capture.name


def test_the_launch_log_of_triage_on_capture_is_beside_the_report_not_the_capture(tmp_path, monkeypatch):
    captures = tmp_path / "captures"
    capture = a_capture(captures)
    monkeypatch.setattr(subprocess, "Popen", lambda argv, **kwargs: type("P", (), {"pid": 1})())
    launch(capture, "mymod:setup", AutoTriage(when="now"), rank=0)
    assert list(captures.glob("capture-*")) == [capture]
    assert (report_dir(capture) / LAUNCH_LOG).is_file()


@pytest.mark.parametrize("layout", ["sibling", "old_beside", "report_json_only"])
def test_load_batches_given_a_report_folder_names_the_capture_it_belongs_to(tmp_path, layout):
    captures = tmp_path / "captures"
    capture = a_capture(captures)
    if layout == "sibling":           # what triage watch writes now, while setup() runs: only triage.log yet
        report = report_dir(capture)
    elif layout == "old_beside":      # what triage watch wrote before 0.2.0
        report = captures / f"{capture.name}.report"
    else:                             # a report copied elsewhere: report.json says where its capture was
        report = tmp_path / "INC-1234"
    report.mkdir(parents=True)
    (report / "triage.log").write_text("")
    if layout == "report_json_only":
        (report / "report.json").write_text(json.dumps({"checkpoint": {"path": str(capture)}}))
    with pytest.raises(triage.TriageError) as caught:
        triage.load_batches(report)
    said = str(caught.value)
    assert f"'{report}' is the report triage watch wrote for the capture '{capture}'" in said
    assert f"triage.load_batches('{capture}')" in said
    assert len(triage.load_batches(capture)) == 5, "the capture itself still loads"


def test_a_report_folder_whose_capture_is_gone_says_so(tmp_path):
    report = tmp_path / "captures-reports" / "capture-0000007-spike"
    report.mkdir(parents=True)
    (report / "report.html").write_text("<html></html>")
    with pytest.raises(triage.TriageError, match="is a triage report folder, and its capture is no longer beside it"):
        triage.load_batches(report)


def test_triage_run_given_a_report_folder_names_its_capture(tmp_path):
    from triage.load.checkpoint import read_checkpoint

    capture = a_capture(tmp_path / "captures")
    report = report_dir(capture)
    report.mkdir(parents=True)
    (report / "summary.md").write_text("")
    with pytest.raises(triage.TriageError, match=f"is the report triage watch wrote for the capture '{capture}'"):
        read_checkpoint(report)
