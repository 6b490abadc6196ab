"""Bad input: exit code 2 and one message that says what was expected, what was found, what to do."""

import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from triage.cli.commands import app

ENTRY = """
import torch
from torch import nn
import triage

def batches():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(16, 4, generator=g), torch.randint(0, 2, (16,), generator=g)) for _ in range(3)]

def loss(model, batch):
    return nn.functional.cross_entropy(model(batch[0]), batch[1])

def setup():
    model = nn.Linear(4, 2)
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                        loss_fn=loss, batches=batches())

def raises():
    raise RuntimeError("cannot find /data/shards")

def wrong_type():
    return {"model": None}

def wrong_field():
    model = nn.Linear(4, 2)
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                        loss_fn=loss, batches=batches(), precision="fp8")

def on_missing_gpu():
    model = nn.Linear(4, 2)
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                        loss_fn=loss, batches=batches(), device="cuda:7")

def float_loss():
    model = nn.Linear(4, 2)
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                        loss_fn=lambda m, b: 1.0, batches=batches())

def wrong_batches():
    model = nn.Linear(4, 2)
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                        loss_fn=loss, batches={"a": 1})

def other_model():
    model = nn.Linear(4, 3)
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                        loss_fn=loss, batches=batches())
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "mymod.py").write_text(ENTRY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    model = torch.nn.Linear(4, 2)
    torch.save({"model": model.state_dict()}, tmp_path / "ckpt.pt")
    adam = torch.optim.Adam(model.parameters())
    torch.save({"model": model.state_dict(), "optimizer": adam.state_dict()}, tmp_path / "adam.pt")
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all")
    (tmp_path / "bad.yaml").write_text("name: x\nentry: a\nnodes:\n  a:\n    run: nope\n    otherwise: a\n")
    return tmp_path


def invoke(*args):
    return CliRunner().invoke(app, ["run", *args, "--out", "out", "--output", "quiet"])


@pytest.mark.parametrize("args, expected", [
    (["--checkpoint", "missing.pt", "--entry", "mymod:setup"], "found no such file"),
    (["--checkpoint", "garbage.pt", "--entry", "mymod:setup"], "could not be read"),
    (["--checkpoint", "ckpt.pt", "--entry", "nomod:setup"], "Expected a module 'nomod' importable"),
    (["--checkpoint", "ckpt.pt", "--entry", "mymod:nothere"], "Expected a function 'nothere' in 'mymod'"),
    (["--checkpoint", "ckpt.pt", "--entry", "mymod"], "Expected --entry as 'module:function'"),
    (["--checkpoint", "ckpt.pt", "--entry", "nofile.py:setup"], "Expected the file 'nofile.py'"),
    (["--checkpoint", "ckpt.pt", "--entry", "mymod:raises"], "RuntimeError: cannot find /data/shards"),
    (["--checkpoint", "ckpt.pt", "--entry", "mymod:wrong_type"], "to return a triage.Setup, found dict"),
    (["--checkpoint", "ckpt.pt", "--entry", "mymod:wrong_field"], "precision: Input should be"),
    (["--checkpoint", "ckpt.pt", "--entry", "mymod:other_model"], "to have the model's shapes"),
    (["--checkpoint", "ckpt.pt", "--entry", "mymod:float_loss"], "to return a scalar tensor, found float"),
    (["--checkpoint", "ckpt.pt", "--entry", "mymod:wrong_batches"], "batches: Value error, expected a list"),
    (["--checkpoint", "adam.pt", "--entry", "mymod:setup"], "lack dampening, momentum (settings setup()'s SGD needs), and hold betas, eps, which SGD has no setting for"),
    (["--checkpoint", "ckpt.pt", "--entry", "mymod:on_missing_gpu"], "Expected Setup.device 'cuda:7' to be usable"),
    (["--checkpoint", "ckpt.pt", "--entry", "mymod:setup", "--playbook", "bad.yaml"], "node 'a': runs 'nope'"),
])
def test_bad_input_exits_2_with_a_message(project, args, expected):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert expected in " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert not (project / "out").exists()


def test_an_out_folder_that_cannot_be_written_fails_before_any_experiment(project):
    (project / "taken").write_text("a file, not a folder")
    result = CliRunner().invoke(app, ["run", "--checkpoint", "ckpt.pt", "--entry", "mymod:setup",
                                      "--out", "taken", "--output", "quiet"])
    assert result.exit_code == 2 and "Expected --out 'taken' to be a folder" in " ".join(result.output.split())


def test_steps_outside_a_replays_range_is_refused(project):
    import triage

    with pytest.raises(triage.TriageError, match="Expected --steps to be a valid replay length"):
        triage.run("mymod:setup", "ckpt.pt", out="out", steps=10**9)
    assert CliRunner().invoke(app, ["run", "--entry", "mymod:setup", "--steps", "0"]).exit_code == 2


def test_a_real_process_exits_2_without_a_traceback(project):
    proc = subprocess.run([sys.executable, "-m", "triage", "run", "--checkpoint", "missing.pt",
                           "--entry", "mymod:setup"], capture_output=True, text=True, cwd=project)
    assert proc.returncode == 2
    assert "Expected a checkpoint at 'missing.pt'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_good_run_exits_0_and_writes_three_files(project):
    result = invoke("--checkpoint", "ckpt.pt", "--entry", "mymod:setup")
    assert result.exit_code == 0, result.output
    assert {p.name for p in (project / "out").iterdir()} >= {"report.html", "report.json", "summary.md"}


def test_the_command_skips_pythons_teardown_but_runs_exit_handlers_and_flushes(tmp_path):
    """`main()` ends with os._exit (teardown with torch imported costs ~0.8 s): an exit handler the
    user's code registered still runs, buffered output is not lost, and the exit code is kept."""
    script = ("import atexit, sys; atexit.register(lambda: print('handler ran', flush=False)); "
              "sys.argv = ['triage'] + sys.argv[1:]; from triage.cli.commands import main; main()")
    ok = subprocess.run([sys.executable, "-c", script, "demo", "--list"], capture_output=True, text=True)
    assert ok.returncode == 0 and "lr_too_high" in ok.stdout and ok.stdout.rstrip().endswith("handler ran")
    bad = subprocess.run([sys.executable, "-c", script, "report", str(tmp_path / "none.json")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "Expected a report.json" in bad.stderr and "handler ran" in bad.stdout
