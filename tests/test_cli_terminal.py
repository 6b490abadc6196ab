"""What a person sees in the terminal: start-up without torch, the zoo listed, the verdict's where
and proof, the decision path in words (raw figures behind --verbose), near names for a mistyped entry."""

import json
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from triage.cli import app
from triage.zoo import example_names

ENTRY = """
import torch
from torch import nn
import triage

def batches():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(16, 4, generator=g), torch.randint(0, 2, (16,), generator=g)) for _ in range(4)]

def loss(model, batch):
    return nn.functional.cross_entropy(model(batch[0]), batch[1])

def setup():
    model = nn.Linear(4, 2)
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                        loss_fn=loss, batches=batches())
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    folder = tmp_path_factory.mktemp("project")
    (folder / "mymod.py").write_text(ENTRY)
    torch.save({"model": torch.nn.Linear(4, 2).state_dict()}, folder / "ckpt.pt")
    return folder


@pytest.fixture(scope="module")
def report_json(project):
    proc = subprocess.run([sys.executable, "-m", "triage", "run", "--checkpoint", "ckpt.pt", "--entry",
                           "mymod:setup", "--out", "out", "--output", "quiet"],
                          capture_output=True, text=True, cwd=project)
    assert proc.returncode == 0, proc.stderr
    return project / "out" / "report.json"


def _imports_torch(args, cwd) -> bool:
    """Whether `triage ARGS` imported torch (run in a fresh interpreter, as the command line is)."""
    code = ("import sys\nfrom triage.cli import app\ntry:\n    app(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    assert not e.code, e.code\nprint('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1] == "True"


def test_help_demo_list_and_report_do_not_import_torch(report_json, tmp_path):
    assert not _imports_torch(["--help"], tmp_path)
    assert not _imports_torch(["demo", "--list"], tmp_path)
    assert not _imports_torch(["report", str(report_json), "--out", str(tmp_path)], tmp_path)
    assert (tmp_path / "report.html").is_file()


def test_import_triage_is_light_until_a_name_is_used():
    code = "import sys, triage\nassert 'torch' not in sys.modules\ntriage.Setup\nprint('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"


def test_demo_list_gives_each_example_a_line_that_says_what_it_is():
    result = CliRunner().invoke(app, ["demo", "--list"])
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert [line.split()[0] for line in lines] == example_names()
    described = dict(line.split(None, 1) for line in lines)
    assert "lr=1.0" in described["lr_too_high"]
    assert "zero_grad" in described["loop_bug_gru"]
    assert all(len(text) > 20 for text in described.values())


@pytest.mark.parametrize("typed, suggested", [("setpu", "did you mean setup?"), ("Setup", "did you mean setup?")])
def test_a_mistyped_entry_function_suggests_the_near_names_that_exist(project, monkeypatch, typed, suggested):
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    result = CliRunner().invoke(app, ["run", "--checkpoint", "ckpt.pt", "--entry", f"mymod:{typed}",
                                      "--out", "never", "--output", "quiet"])
    message = " ".join(result.output.split())
    assert result.exit_code == 2
    assert suggested in message.lower() and "--entry mymod:setup" in message
    assert f"def {typed}()" not in message  # not told to define the misspelled name


def test_an_entry_function_with_no_near_name_is_explained_as_before(project, monkeypatch):
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    result = CliRunner().invoke(app, ["run", "--checkpoint", "ckpt.pt", "--entry", "mymod:build_everything",
                                      "--output", "quiet"])
    message = " ".join(result.output.split())
    assert result.exit_code == 2 and "Define `def build_everything() -> triage.Setup:`" in message
