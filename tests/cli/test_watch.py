"""`triage watch` beside a real training process: the report appears with the verdict, --then receives it,
and a watcher killed in the middle of a triage finishes that report exactly once when restarted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import watch_run
from triage.cli.watch.sidecar import WatchOptions, Watcher, finished_captures
from triage.flight.autotriage import AutoTriage, launch
from triage.flight.places import report_dir

REPO = Path(__file__).resolve().parents[2]
THEN = 'echo "$TRIAGE_REPORT|$TRIAGE_ROOT_CAUSE|$TRIAGE_CONFIDENCE|$TRIAGE_STEP" >> "$THEN_LOG"'


def env(**extra) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def watcher(caps: Path, then_log: Path, *more: str, **extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "triage", "watch", str(caps), "--entry", watch_run.ENTRY,
                             "--interval", "0.2", "--threads", "1", "--then", THEN, *more],
                            cwd=REPO, env=env(THEN_LOG=str(then_log), **extra),
                            stdout=open(then_log.parent / "watch.log", "ab"), stderr=subprocess.STDOUT)


def wait_for(check, what: str, seconds: float = 300):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"waited {seconds:.0f} s for {what}")


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def state(caps: Path) -> dict:
    path = caps / ".triage-watch" / "state.json"
    return json.loads(path.read_text())["captures"] if path.exists() else {}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_a_run_diverging_beside_the_watcher_gets_its_report_and_then_receives_its_path(tmp_path):
    caps, then_log = tmp_path / "captures", tmp_path / "then.txt"
    caps.mkdir()
    watch = watcher(caps, then_log)
    try:
        run = subprocess.run([sys.executable, "-m", "tests.watch_run", str(caps)], cwd=REPO, env=env(),
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        step = int(run.stdout.split("captured at step ")[1].split()[0])
        assert step > 40, "the LR jumps at step 40: the run diverges after it"
        received = wait_for(lambda: lines(then_log), "--then to run")
        capture = caps / f"capture-{step:07d}-spike"
        # the watcher records the capture done after its --then returns: wait for that before stopping it
        wait_for(lambda: state(caps).get(capture.name, {}).get("status") == "done", "the capture recorded done")
    finally:
        watch.terminate()
        watch.wait(30)
    report_html, root_cause, confidence, then_step = received[0].split("|")
    assert Path(report_html) == report_dir(capture) / "report.html"
    assert Path(report_html).is_file() and root_cause == "lr_too_high" and then_step == str(step)
    report = json.loads((Path(report_html).parent / "report.json").read_text())
    assert (report["status"], report["root_cause"], report["confidence"]) == ("complete", "lr_too_high", confidence)
    assert report["checkpoint"]["capture_rank"] is None, "a single process: no rank on the report"
    assert state(caps)[capture.name]["status"] == "done"


def test_a_watcher_killed_mid_triage_finishes_that_report_exactly_once(tmp_path):
    caps, then_log, hold = tmp_path / "captures", tmp_path / "then.txt", tmp_path / "hold"
    step = watch_run.train(str(caps))
    capture = caps / f"capture-{step:07d}-spike"
    hold.touch()  # the triage waits in setup() while this exists: the watcher is surely killed mid-triage
    first = watcher(caps, then_log, WATCH_RUN_HOLD=str(hold))
    child = int(wait_for(lambda: Path(f"{hold}.pid").exists() and Path(f"{hold}.pid").read_text(), "the triage"))
    assert state(caps)[capture.name]["status"] == "running"
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    wait_for(lambda: not alive(child), "the killed watcher's triage to die with it", 30)
    assert not (report_dir(capture) / "report.json").exists() and not lines(then_log)

    hold.unlink()
    again = subprocess.run([sys.executable, "-m", "triage", "watch", str(caps), "--entry", watch_run.ENTRY, "--once",
                            "--threads", "1", "--then", THEN], cwd=REPO, env=env(THEN_LOG=str(then_log)),
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "stopped in the middle of its triage" in again.stderr
    report = json.loads((report_dir(capture) / "report.json").read_text())
    assert (report["status"], report["root_cause"]) == ("complete", "lr_too_high")
    record = state(caps)[capture.name]
    assert (record["status"], record["attempts"]) == ("done", 2)
    assert len(lines(then_log)) == 1

    third = subprocess.run([sys.executable, "-m", "triage", "watch", str(caps), "--entry", watch_run.ENTRY, "--once",
                            "--then", THEN], cwd=REPO, env=env(THEN_LOG=str(then_log)),
                           capture_output=True, text=True, timeout=120)
    assert third.returncode == 0 and len(lines(then_log)) == 1, "a triaged capture is never triaged again"
    assert sorted(p.name for p in caps.iterdir()) == [".triage-watch", capture.name]
    assert [p.name for p in caps.glob("capture-*")] == [capture.name], "a setup()'s capture glob meets captures only"
    assert report_dir(capture) == tmp_path / "captures-reports" / capture.name


def test_only_folders_whose_manifest_is_written_are_captures(tmp_path):
    step = watch_run.train(str(tmp_path))
    half = tmp_path / "capture-0000099-spike"  # the recorder is still writing it: no manifest yet
    half.mkdir()
    (half / "checkpoint.pt").write_bytes(b"partial")
    assert finished_captures(tmp_path) == [tmp_path / f"capture-{step:07d}-spike"]


@pytest.mark.parametrize("args, says", [
    (["/no/such/dir", "--entry", "tests.watch_run:setup"], "Expected DIR '/no/such/dir'"),
    (["{tmp}", "--entry", "no_such_module:setup"], "Expected a module 'no_such_module'"),
    (["{tmp}", "--entry", "setup"], "Expected --entry as 'module:function'"),
    (["{tmp}", "--entry", "missing.py:setup"], "Expected the file 'missing.py'"),
])
def test_bad_input_is_a_clear_error_and_exit_2(tmp_path, args, says):
    done = subprocess.run([sys.executable, "-m", "triage", "watch", *[a.format(tmp=tmp_path) for a in args], "--once"],
                          cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr


def test_a_failing_then_is_logged_and_the_capture_still_counts_as_done(tmp_path):
    step = watch_run.train(str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "triage", "watch", str(tmp_path), "--entry", watch_run.ENTRY,
                           "--once", "--steps", "10", "--then", "echo no ticket system >&2; exit 7"],
                          cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0
    assert "--then exited with status 7" in done.stderr and "no ticket system" in done.stderr
    record = state(tmp_path)[f"capture-{step:07d}-spike"]
    assert (record["status"], record["then_exit"]) == ("done", 7)
    assert (report_dir(tmp_path / f"capture-{step:07d}-spike") / "report.html").is_file()


def test_once_exits_1_when_a_capture_it_triaged_failed(tmp_path):
    step = watch_run.train(str(tmp_path))
    capture = tmp_path / f"capture-{step:07d}-spike"
    checkpoint = next(p for p in capture.iterdir() if p.suffix == ".pt")
    checkpoint.write_bytes(b"not a checkpoint")  # the triage of it fails with a clear error
    done = subprocess.run([sys.executable, "-m", "triage", "watch", str(tmp_path), "--entry", watch_run.ENTRY,
                           "--once"], cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and f"the triage of {capture.name} failed" in done.stdout + done.stderr
    assert state(tmp_path)[capture.name]["status"] == "failed"


class Started:
    def __init__(self):
        self.calls = []

    def __call__(self, argv, **kwargs):
        self.calls.append((argv, kwargs))
        return type("P", (), {"pid": 1})()


def test_only_rank_0_launches_the_triage_of_its_capture(tmp_path, monkeypatch):
    started = Started()
    monkeypatch.setattr(subprocess, "Popen", started)
    now = AutoTriage(when="now", threads=1)
    launch(tmp_path / "capture-0000043-spike", "mymod:setup", now, rank=1)
    assert started.calls == [], "rank 1's capture is left to rank 0: one triage per failure"
    launch(tmp_path / "capture-0000043-spike", "mymod:setup", now, rank=0)
    (argv, kwargs), = started.calls
    assert argv[3:8] == ["watch", str(tmp_path), "--once", "--only", "capture-0000043-spike"]
    assert kwargs["start_new_session"] is True and "preexec_fn" not in kwargs  # detached; nothing runs in training
    assert argv[argv.index("--nice") + 1] == str(now.nice)  # the watcher nices the triage it starts


def test_a_healthy_run_with_the_setting_starts_nothing(tmp_path, monkeypatch):
    started = Started()
    monkeypatch.setattr(subprocess, "Popen", started)
    import torch

    import triage

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = triage.Recorder(model, opt, dir=tmp_path, entry="mymod:setup",
                          triage_on_capture=AutoTriage(when="now"))
    for _ in range(30):
        x = torch.randn(8, 4)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        rec.step(loss)
    assert rec.captures == [] and started.calls == [] and list(tmp_path.iterdir()) == []


def test_the_setting_without_an_entry_fails_before_training(tmp_path):
    import torch

    import triage

    model = torch.nn.Linear(4, 1)
    with pytest.raises(triage.TriageError, match="Expected an entry for triage_on_capture"):
        triage.Recorder(model, torch.optim.SGD(model.parameters(), lr=0.1), dir=tmp_path, triage_on_capture=True)


def test_the_capture_and_its_report_record_the_rank_and_world_size(tmp_path, monkeypatch):
    import triage

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    step = watch_run.train(str(tmp_path))
    capture = tmp_path / f"capture-{step:07d}-spike"
    manifest = json.loads((capture / "manifest.json").read_text())
    assert (manifest["rank"], manifest["world_size"]) == (0, 2)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    report, files = triage.run(watch_run.setup, capture, out=tmp_path / "report", steps=10)
    assert (report.checkpoint.capture_rank, report.checkpoint.capture_world_size) == (0, 2)
    assert "Captured on rank 0 of 2" in files["md"].read_text()


def test_the_lightning_callback_with_triage_on_capture_triages_its_own_capture(tmp_path):
    pytest.importorskip("lightning", reason="the lightning extra is not installed")
    then_log = tmp_path / "then.txt"
    run = subprocess.run([sys.executable, "-m", "tests.watch_lightning", str(tmp_path), THEN], cwd=REPO,
                         env=env(THEN_LOG=str(then_log)), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "captured " in run.stdout, run.stdout + run.stderr
    assert "starts when this process exits" in run.stderr
    # The training process has exited; its triage goes on in a process of its own.
    received = wait_for(lambda: lines(then_log), "the detached triage's --then")
    report_html, root_cause, _, _ = received[0].split("|")
    capture = Path(run.stdout.split("captured ")[1].split(" at step")[0])
    assert Path(report_html) == report_dir(capture) / "report.html"
    report = json.loads((Path(report_html).parent / "report.json").read_text())
    assert (report["status"], report["root_cause"], root_cause) == ("complete", "lr_too_high", "lr_too_high")
    wait_for(lambda: state(capture.parent).get(capture.name, {}).get("status") == "done",
             "the capture recorded done (after its --then returns)")


def test_the_trainer_callback_refuses_the_setting_without_an_entry(tmp_path):
    pytest.importorskip("transformers", reason="the transformers extra is not installed")
    import triage
    from triage.integrations.transformers import TriageCallback

    with pytest.raises(triage.TriageError, match="Expected an entry for triage_on_capture"):
        TriageCallback(dir=tmp_path, triage_on_capture=True)
    from triage.flight.autotriage import auto_triage

    callback = TriageCallback(dir=tmp_path, triage_on_capture="mymod:make_trainer")
    assert auto_triage(callback.triage_on_capture, None).entry == "mymod:make_trainer"


# --- --then after a watcher stopped at the wrong moment ---------------------------------------------

def _watcher_with_state(tmp_path, **record):
    log = tmp_path / "then.txt"
    watcher = Watcher(WatchOptions(root=tmp_path, then=f'echo "$TRIAGE_STATUS $TRIAGE_THEN_REPEAT" >> {log}'))
    watcher.state.update("capture-0000007-spike", **record)
    return watcher, tmp_path / "capture-0000007-spike", log


def test_a_failed_triage_whose_then_never_ran_gets_it_on_restart_once(tmp_path):
    """A watcher stopped between recording the failure and running --then: the next one runs it (the on-call
    hears of the failure), once."""
    watcher, capture, log = _watcher_with_state(tmp_path, status="failed", error="setup() raised")
    assert watcher.process(capture) == 1
    assert watcher.process(capture) == 0
    assert log.read_text().splitlines() == ["failed 0"]
    assert watcher.state.get(capture.name).then_exit == 0


def test_a_then_stopped_midway_runs_again_and_is_told_it_is_a_repeat(tmp_path):
    report = report_dir(tmp_path / "capture-0000007-spike")
    report.mkdir(parents=True)
    (report / "report.json").write_text(json.dumps({"status": "complete", "root_cause": "lr_too_high"}))
    watcher, capture, log = _watcher_with_state(tmp_path, status="reported", report=str(report), then_started=True)
    assert watcher.process(capture) == 1
    assert log.read_text().splitlines() == ["complete 1"]
    assert watcher.state.get(capture.name).status == "done"


def test_a_capture_given_up_on_is_notified_once_and_an_old_give_up_is_left_alone(tmp_path):
    """Three triages started and none finished: the watcher gives up and --then hears of it at once. A
    capture an older watcher gave up on without running --then is not notified late, on an upgrade."""
    watcher, capture, log = _watcher_with_state(tmp_path, status="running", attempts=3)
    assert watcher.process(capture) == 1
    assert log.read_text().splitlines() == ["failed 0"]
    assert watcher.state.get(capture.name).status == "failed"

    old = tmp_path / "old"
    old.mkdir()
    watcher, capture, log = _watcher_with_state(old, status="failed", attempts=3, error="gave up")
    assert watcher.process(capture) == 0 and not log.exists()
