"""What a person sees in the terminal: start-up without torch, the zoo listed, the verdict's where
and proof, the decision path in words (raw figures behind --verbose), near names for a mistyped entry."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from triage.cli.commands import app
from triage.cli.zoo import demo_checkpoint, example_names, example_path, load_example

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


def step_without_zero_grad(model, optimizer, batch):
    value = loss(model, batch)
    value.backward()
    optimizer.step()
    return value


def leaky_setup():
    model = nn.Linear(4, 2)
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                        loss_fn=loss, batches=batches(), train_step=step_without_zero_grad)
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    folder = tmp_path_factory.mktemp("project")
    (folder / "terminal_entry.py").write_text(ENTRY)
    # Seeded: the labels are random, and from some inits (1 in 12) the walk meets them before the loop, and says
    # label_bug; unseeded, which init a worker drew depended on the tests it ran first.
    torch.manual_seed(0)
    torch.save({"model": torch.nn.Linear(4, 2).state_dict()}, folder / "ckpt.pt")
    return folder


@pytest.fixture(scope="module")
def report_json(project):
    proc = subprocess.run([sys.executable, "-m", "triage", "run", "--checkpoint", "ckpt.pt", "--entry",
                           "terminal_entry:setup", "--out", "out", "--output", "quiet"],
                          capture_output=True, text=True, cwd=project)
    assert proc.returncode == 0, proc.stderr
    return project / "out" / "report.json"


def _imports_torch(args, cwd) -> bool:
    """Whether `triage ARGS` imported torch (run in a fresh interpreter, as the command line is)."""
    code = ("import sys\nfrom triage.cli.commands import app\ntry:\n    app(sys.argv[1:])\nexcept SystemExit as e:\n"
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


def test_a_demo_checkpoint_is_written_once_into_an_empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIAGE_CACHE", str(tmp_path))
    first = demo_checkpoint("lr_too_high")  # what `triage demo` does on a machine that never ran it
    assert first.parent == tmp_path / "demo" and first.is_file()
    written = first.stat().st_mtime_ns
    assert demo_checkpoint("lr_too_high") == first and first.stat().st_mtime_ns == written
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no partial file left behind


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
    result = CliRunner().invoke(app, ["run", "--checkpoint", "ckpt.pt", "--entry", f"terminal_entry:{typed}",
                                      "--out", "never", "--output", "quiet"])
    message = " ".join(result.output.split())
    assert result.exit_code == 2
    assert suggested in message.lower() and "--entry terminal_entry:setup" in message
    assert f"def {typed}()" not in message  # not told to define the misspelled name


def test_an_entry_function_with_no_near_name_is_explained_as_before(project, monkeypatch):
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    result = CliRunner().invoke(app, ["run", "--checkpoint", "ckpt.pt", "--entry", "terminal_entry:build_everything",
                                      "--output", "quiet"])
    message = " ".join(result.output.split())
    assert result.exit_code == 2 and "Define `def build_everything() -> triage.Setup:`" in message


def _said(result) -> str:
    """The terminal's text with rich's wrapping undone."""
    return " ".join(result.output.split())


def _line(result, label: str) -> str:
    """The verdict line that starts with `label:`, wrapping undone."""
    return re.search(rf"{label}:\s+(.*?)(?= (Fix|Tried|Where|Proof|Evidence|Report):|$)", _said(result)).group(1)


@pytest.fixture(scope="module")
def lr_too_high(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lr_too_high")
    checkpoint = load_example("lr_too_high").write_checkpoint(folder / "ckpt.pt")
    return CliRunner().invoke(app, ["run", "--checkpoint", str(checkpoint), "--entry",
                                    f"{example_path('lr_too_high')}:setup", "--out", str(folder / "out")])


def test_the_verdict_says_where_and_gives_the_proof_before_and_after(lr_too_high):
    assert lr_too_high.exit_code == 0, lr_too_high.output
    assert _line(lr_too_high, "Where") == "not narrowed to a module, batch or parameter"
    proof = _line(lr_too_high, "Proof")
    # the experiment whose fix worked, what it changed, the run before and after, measured
    assert proof.startswith("lower_lr: A lower learning rate") and "lr x0.1 chosen" in proof
    before, after = map(float, re.search(r"end loss ([\d.]+) → ([\d.]+) \(baseline, as the run was → with "
                                         r"the fix; 40 steps\)", proof).groups())
    assert after < 0.5 * before


def test_the_verdict_gives_the_fix_in_values_measured_by_its_replay(lr_too_high, tmp_path_factory):
    """The LR the run had and the one that trained, the step it was tried from, the loss with and without:
    each the figure the proof's replay measured (report.json), not a template's words."""
    tried = _line(lr_too_high, "Tried")
    report = json.loads((Path(_line(lr_too_high, "Report")).parent / "report.json").read_text())
    proof = next(e for e in report["experiments"] if e["node"] == report["proof"])
    baseline = next(e for e in report["experiments"] if e["node"] == proof["params"]["against"])
    lr_before, lr_after = baseline["outcome"]["lrs"][0], proof["outcome"]["lrs"][0]
    step = report["checkpoint"]["step"]
    assert tried.startswith(f"learning rate {lr_before:.4g} → {lr_after:.4g}, tried from step {step} to step "
                            f"{step + proof['outcome']['steps_run']}:")
    assert f"loss {proof['outcome']['loss_end']:.4g} with the fix, {proof['outcome']['reference_end']:.4g} without" \
        in tried
    trial = report["fix_trial"]  # the same values, typed, in report.json
    assert trial["changes"] == [{"setting": "learning rate", "key": "lr", "before": lr_before, "after": lr_after,
                                 "run_steps": None}]  # run_steps: skipped batches only (schema 1.8)
    assert trial["from_step"] == step and trial["loss_with_fix"] == proof["outcome"]["loss_end"]


def test_progress_lines_answer_each_question_in_words_without_raw_dumps(lr_too_high):
    said = _said(lr_too_high)
    # the node that found the fault is marked, not checked like a passing one
    assert "! baseline Does the run, replayed as it was, go wrong? yes: it diverges (largest rise of the loss" in said
    assert "✓ data Are there NaN or Inf values in the data snapshot? no (non-finite values in the training batches 0)" in said
    assert "+ lower_lr A lower learning rate (x0.1 down to x1e-5): works" in said
    assert "⇒ divergence lower_lr works best (high confidence) → lr_too_high" in said
    assert "=" not in said.split("Fix:")[0]  # no field=value dumps
    assert "baseline.loss_ratio > 1.5" not in said and "None" not in said


@pytest.fixture(scope="module")
def leaky(project):
    def run(*flags):
        import os
        here = os.getcwd()
        os.chdir(project)
        sys.path.insert(0, str(project))
        try:
            return CliRunner().invoke(app, ["run", "--checkpoint", "ckpt.pt", "--entry", "terminal_entry:leaky_setup",
                                            "--out", f"out{len(flags)}", *flags])
        finally:
            os.chdir(here)
            sys.path.remove(str(project))
    return run


def test_a_loop_bug_verdict_names_the_bug_and_where_train_step_is(leaky, project):
    result = leaky()
    assert result.exit_code == 0, result.output
    line = ENTRY.splitlines().index("def step_without_zero_grad(model, optimizer, batch):") + 1
    fix = _line(result, "Fix")
    assert fix.startswith("Call optimizer.zero_grad() every step in train_step (terminal_entry.py:%d)" % line)
    assert "the gradients accumulate across steps" in fix
    assert _line(result, "Where") == f"terminal_entry.py:{line}"
    # the reference loop, replayed against this one, does not train clearly better on this tiny run: the bug is
    # named as measured, at medium, and the evidence says its fix did not verify
    assert _line(result, "Evidence").startswith('measured at loop, its fix replayed at loop_fixed did not verify: '
                                                '"no: a bug in it (which one below)" (has train step, gradients '
                                                'accumulate)')
    assert "loop_bug, medium confidence" in _said(result)


def test_verbose_adds_the_raw_figures_and_the_branch_condition(leaky):
    quiet, verbose = _said(leaky()), _said(leaky("--verbose"))
    raw = "loop.has_train_step=true"
    assert raw not in quiet and raw in verbose
    assert "loop_diff" in verbose and "[loop.grads_accumulate]" in verbose
    assert "! loop Does the run's own train_step do what the reference loop does? no: a bug in it" in verbose
    assert "loop_which its gradients accumulate across steps" in verbose


def test_version_prints_the_installed_version():
    import triage

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"triage {triage.__version__}"


def test_help_shows_each_flag_as_the_parser_takes_it():
    """typer's rich help showed `--verbose <bool>` (click 8.5), which the parser then refuses."""
    shown = CliRunner().invoke(app, ["run", "--help"]).output
    assert "<bool>" not in shown and "-v, --verbose" in shown and "--debug" in shown


def test_a_piped_verdict_is_not_hard_wrapped(lr_too_high):
    """Output that is not a terminal keeps each verdict line whole (a ticket, a file): the fix is one line."""
    fix = next(line for line in lr_too_high.output.splitlines() if line.startswith("Fix:"))
    assert len(fix) > 80 and fix.rstrip().endswith("or add warmup."), fix
