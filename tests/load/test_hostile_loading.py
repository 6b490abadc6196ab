"""Hostile and careless inputs, second probe (issue 22): checkpoints as real projects save them and inputs
that cost a report. One row per class, run through the CLI as a user would, asserting what they would
check: the exit code, no traceback, what the message or the report says, no file left behind.
The rows share test_hostile_inputs.py's project folder and CLI runner."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.load.test_hostile_inputs import assert_refused, assert_written, project, report, run_cli  # noqa: F401

LOADING = '''
import torch
from torch import nn
import triage
from hostile_entry import batches, loss, model


def make(m, opt=None):
    return triage.Setup(model=m, optimizer=opt or torch.optim.SGD(m.parameters(), lr=0.1), loss_fn=loss,
                        batches=batches())


def plain():
    return make(model())


def compiled():
    return make(torch.compile(model(), backend="eager"))


def data_parallel():
    return make(nn.DataParallel(model()))


def per_epoch():
    m = model()
    return triage.Setup(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1), loss_fn=loss, batches=batches(),
                        steps_per_epoch=25)


def adafactor():
    m = model()
    return make(m, torch.optim.Adafactor(m.parameters(), lr=1e-2))


def lbfgs():
    m = model()
    return make(m, torch.optim.LBFGS(m.parameters(), lr=0.1, max_iter=2))


class Scaled(torch.optim.SGD):
    """A team's own optimizer: SGD with one setting of its own."""

    def __init__(self, params, lr=0.1, scale=0.5):
        super().__init__(params, lr=lr)
        for group in self.param_groups:
            group.setdefault("scale", scale)
        self.defaults["scale"] = scale


def own_optimizer():
    m = model()
    return make(m, Scaled(m.parameters()))


def groups(m, reverse):
    chosen = [{"params": [m[0].weight, m[2].weight], "weight_decay": 0.1},
              {"params": [m[0].bias, m[2].bias], "weight_decay": 0.0}]
    return list(reversed(chosen)) if reverse else chosen


def adam_groups():
    m = model()
    return make(m, torch.optim.Adam(groups(m, reverse=False), lr=1e-3))


def adam_groups_reversed():
    m = model()
    return make(m, torch.optim.Adam(groups(m, reverse=True), lr=1e-3))
'''


@pytest.fixture
def loading(project):
    (project / "loading_entry.py").write_text(LOADING)
    import sys
    sys.modules.pop("loading_entry", None)
    return project


def _save(folder: Path, name: str, make: str, extra: dict | None = None, steps: int = 2) -> None:
    import importlib

    entry = importlib.import_module("loading_entry")
    s = getattr(entry, make)()
    for batch in s.batches[:steps]:
        def closure():
            s.optimizer.zero_grad()
            loss = entry.loss(s.model, batch)
            loss.backward()
            return loss
        s.optimizer.step(closure)
    torch.save({"model": s.model.state_dict(), "optimizer": s.optimizer.state_dict(), **(extra or {})}, folder / name)


def _finding(data: dict, fid: str) -> str:
    texts = [f["text"] for f in data["findings"] if f["id"] == fid]
    assert texts, [f["id"] for f in data["findings"]]
    return texts[0]


# ── wrapper prefixes, both ways ─────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("saved, built, said", [
    ("compiled", "plain", "start with '_orig_mod.' (torch.compile) and the model setup() built expects none"),
    ("plain", "compiled", "start with no wrapper prefix and the model setup() built expects '_orig_mod.' (torch.compile)"),
    ("data_parallel", "plain", "start with 'module.' (DataParallel/DDP)"),
    ("plain", "data_parallel", "expects 'module.' (DataParallel/DDP)"),
])
def test_a_compiled_or_wrapped_model_and_a_plain_checkpoint_load_either_way_and_say_so(loading, saved, built, said):
    _save(loading, "wrapped.pt", saved)
    code, text = run_cli(loading, entry=f"loading_entry:{built}", checkpoint="wrapped.pt")
    data = assert_written(loading, code, text)
    assert said in _finding(data, "checkpoint_keys_mapped")


# ── the step, under the names real projects use ─────────────────────────────────────────────────────

@pytest.mark.parametrize("saved, step, source", [
    ({"iter_num": 1200}, 1200, "the checkpoint's 'iter_num'"),
    ({"iteration": torch.tensor(77)}, 77, "the checkpoint's 'iteration'"),
    ({"global_step": 5, "epoch": 1}, 5, "the checkpoint's 'global_step'"),
    ({"epoch": 3}, None, "the checkpoint's 'epoch' (3; the step needs the steps per epoch)"),
])
def test_the_checkpoint_step_is_read_from_the_names_projects_use_and_its_source_said(loading, saved, step, source):
    _save(loading, "named.pt", "plain", saved)
    code, text = run_cli(loading, entry="loading_entry:plain", checkpoint="named.pt")
    data = assert_written(loading, code, text)
    assert data["checkpoint"]["step"] == step and data["checkpoint"]["step_source"] == source
    assert f"from {source}" in (loading / "out" / "report.html").read_text().replace("&#39;", "'")


def test_an_epoch_becomes_the_step_where_setup_says_the_steps_per_epoch_through_the_cli(loading):
    _save(loading, "epoch.pt", "plain", {"epoch": 3})
    code, text = run_cli(loading, entry="loading_entry:per_epoch", checkpoint="epoch.pt")
    data = assert_written(loading, code, text)
    assert data["checkpoint"]["step"] == 75
    assert data["checkpoint"]["step_source"] == "the checkpoint's 'epoch' 3 x Setup.steps_per_epoch 25"


def test_an_epoch_becomes_the_step_where_setup_says_the_steps_per_epoch():
    from types import SimpleNamespace

    from triage.load.checkpoint import Checkpoint, read_step
    from triage.load.session import _with_epoch_step

    read = Checkpoint(layout="dict", model_state={}, **read_step({"epoch": 3}, ("step",)))
    step = _with_epoch_step(read, SimpleNamespace(steps_per_epoch=25))  # Setup.steps_per_epoch (issue 21)
    assert step.step == 75 and step.step_source == "the checkpoint's 'epoch' 3 x Setup.steps_per_epoch 25"
    assert _with_epoch_step(read, SimpleNamespace()).step is None


@pytest.mark.parametrize("value, said", [
    (float("inf"), "'step' is inf"),
    (float("nan"), "'step' is nan"),
    (torch.tensor([3, 4]), "'step' is a tensor of 2 values (shape (2,))"),
    (-5, "'step' is negative (-5)"),
    ("12", "'step' is str '12'"),
])
def test_an_odd_checkpoint_step_is_left_out_with_a_note(loading, value, said):
    _save(loading, "odd.pt", "plain", {"step": value})
    code, text = run_cli(loading, entry="loading_entry:plain", checkpoint="odd.pt")
    data = assert_written(loading, code, text)
    assert data["checkpoint"]["step"] is None
    assert said in _finding(data, "checkpoint_step_left_out")


@pytest.mark.parametrize("global_step, said", [("Infinity", "is inf"), ("NaN", "is nan"), ("-3", "is negative (-3)"),
                                               ("[1, 2]", "is list [1, 2]")])
def test_an_odd_step_in_a_trainer_folder_is_left_out_with_a_note(loading, global_step, said):
    import hostile_entry

    folder = loading / "checkpoint-7"
    folder.mkdir()
    torch.save(hostile_entry.model().state_dict(), folder / "pytorch_model.bin")
    (folder / "trainer_state.json").write_text(
        '{"global_step": %s, "log_history": [{"step": %s, "loss": 1.0}, {"step": 2, "loss": 0.9}]}'
        % (global_step, global_step))
    code, text = run_cli(loading, entry="loading_entry:plain", checkpoint="checkpoint-7")
    data = assert_written(loading, code, text)
    assert data["checkpoint"]["step"] is None
    assert f"trainer_state.json's 'global_step' {said}" in _finding(data, "checkpoint_step_left_out")
    if global_step != "[1, 2]":  # the log's own row with that step: its history is left out, said so
        assert "log_history' was left out (row 1 has step" in _finding(data, "checkpoint_history_left_out")


# ── optimizers and their param groups ───────────────────────────────────────────────────────────────

@pytest.mark.parametrize("make", ["adafactor", "lbfgs", "own_optimizer"])
def test_an_optimizer_checkpoint_loads_into_the_optimizer_that_saved_it(loading, make):
    _save(loading, "saved.pt", make)
    code, text = run_cli(loading, entry=f"loading_entry:{make}", checkpoint="saved.pt")
    assert_written(loading, code, text)  # the replays are the loop's business: loading no longer refuses it


def test_param_groups_saved_in_another_order_are_matched_and_said(loading):
    _save(loading, "groups.pt", "adam_groups")
    code, text = run_cli(loading, entry="loading_entry:adam_groups_reversed", checkpoint="groups.pt")
    data = assert_written(loading, code, text)
    assert "saved group 1 -> group 0, saved group 0 -> group 1" in _finding(data, "optimizer_groups_reordered")


# ── a pickled whole model whose class cannot be imported ────────────────────────────────────────────

NET = "import torch\nclass Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n" \
      "        self.l = torch.nn.Linear(4, 2)\n"


@pytest.mark.parametrize("saved_as, said", [
    ("script", ["holds __main__.Net: a class defined in the script that saved it", "re-save model.state_dict()"]),
    ("module", ["needs gone_models.Net", "the module 'gone_models' cannot be imported here",
                "Run triage where `import gone_models` works"]),
])
def test_a_pickled_model_whose_class_cannot_be_imported_names_the_class_and_what_to_import(loading, saved_as, said):
    import subprocess
    import sys

    elsewhere = loading / "elsewhere"
    elsewhere.mkdir()
    if saved_as == "script":
        (elsewhere / "save.py").write_text(NET + "torch.save(Net(), '../whole.pt')\n")
        command = [sys.executable, "save.py"]
    else:
        (elsewhere / "gone_models.py").write_text(NET)
        command = [sys.executable, "-c", "import torch, gone_models; torch.save(gone_models.Net(), '../whole.pt')"]
    subprocess.run(command, cwd=elsewhere, check=True, capture_output=True)
    code, text = run_cli(loading, "--trust-checkpoint", checkpoint="whole.pt")
    assert_refused(loading, code, text, *said)
    assert "truncated" not in text


# ── inputs that cost a report ───────────────────────────────────────────────────────────────────────

def test_triage_run_without_a_checkpoint_exits_2_saying_what_to_pass(loading):
    code, text = run_cli(loading, checkpoint=None)
    assert_refused(loading, code, text, "Expected --checkpoint", "found none", "Pass --checkpoint PATH")


@pytest.mark.parametrize("seed", ["-1", str(2**40)])
def test_a_seed_numpy_cannot_take_is_refused(loading, seed):
    code, text = run_cli(loading, "--seed", seed)
    assert_refused(loading, code, text, "Expected the seed to be a whole number from 0 to 4294967295",
                   f"found {seed}", "Pass a seed in that range")


def test_a_seed_numpy_cannot_take_is_refused_by_the_python_api_too(loading):
    import triage

    with pytest.raises(triage.TriageError, match="Expected the seed to be a whole number from 0 to 4294967295"):
        triage.run("hostile_entry:setup", "ckpt.pt", out="out", seed=2**40)


def test_checkpoint_and_report_that_never_end_are_refused(loading):
    code, text = run_cli(loading, checkpoint="/dev/zero")
    assert_refused(loading, code, text, "Expected a checkpoint at '/dev/zero' to be a file or a folder, found a device")
    from typer.testing import CliRunner

    from triage.cli.commands import app

    result = CliRunner().invoke(app, ["report", "/dev/zero"])
    assert result.exit_code == 2 and "not a regular file" in " ".join(result.output.split())
    assert "Traceback" not in result.output
    code, text = run_cli(loading, "--history", "/dev/zero")
    assert_refused(loading, code, text, "Expected a history at '/dev/zero', found a device, a pipe or a socket")


def test_a_playbook_with_a_node_twice_is_refused_naming_both_lines(loading):
    from tests.load.test_hostile_inputs import SHORT

    doubled = SHORT.replace("  fine:\n", "  first:\n    run: replay\n    with: {steps: 2}\n    otherwise: fine\n  fine:\n")
    (loading / "twice.yaml").write_text(doubled)
    lines = [i + 1 for i, line in enumerate(doubled.splitlines()) if line == "  first:"]
    code, text = run_cli(loading, playbook="twice.yaml")
    assert_refused(loading, code, text, f"twice.yaml:{lines[1]}", f"node 'first' at lines {lines[0]} and {lines[1]}",
                   "Rename or remove one")


MOVES = '''
import os
from hostile_entry import setup as plain


def setup():
    os.makedirs("elsewhere", exist_ok=True)
    os.chdir("elsewhere")
    return plain()
'''


def test_a_setup_that_changes_folder_does_not_move_the_report(loading):
    (loading / "moving_entry.py").write_text(MOVES)
    code, text = run_cli(loading, "--snapshot-dir", "snap", entry="moving_entry:setup")
    try:
        assert code == 0, text
        assert (loading / "out" / "report.html").is_file() and not (loading / "elsewhere" / "out").exists()
        assert text.endswith(str(loading / "out" / "report.html"))  # the printed path is where it is
        assert (loading / "snap").is_dir() and not (loading / "elsewhere" / "snap").exists()
    finally:
        os.chdir(loading)


def test_a_re_run_into_the_same_out_never_leaves_the_previous_verdict_looking_current(loading):
    code, text = run_cli(loading)
    assert_written(loading, code, text)
    from triage.cli import api

    kept = {}

    def killed(*args, **kwargs):  # the second run is killed during its walk: what does the folder hold then?
        kept.update({p.name: p.read_text() for p in (loading / "out").iterdir()})
        raise KeyboardInterrupt

    import pytest as _pytest
    with _pytest.MonkeyPatch.context() as patch:
        patch.setattr(api, "walk", killed)
        code, text = run_cli(loading)
    assert code == 130
    assert "report.html" not in kept and "summary.md" not in kept and "report.json" not in kept
    assert not (loading / "out" / "report.html").exists()


def test_a_full_disk_while_the_snapshot_spills_leaves_no_temporary_file(loading, monkeypatch):
    import errno

    real_save = torch.save

    def full(obj, f, *args, **kwargs):
        if str(f).endswith("snapshot.pt"):
            with open(f, "wb") as handle:
                handle.write(b"\0" * 1000)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full)
    code, text = run_cli(loading, "--snapshot-dir", "snap")
    assert_refused(loading, code, text, "Expected to keep the snapshot in", "No space left on device")
    assert list((loading / "snap").iterdir()) == []


def test_an_unwritable_cache_still_runs_the_demo_and_a_full_one_still_draws_the_page(loading, monkeypatch):
    import errno

    from triage import atomic
    from triage.cli import zoo

    monkeypatch.setenv("TRIAGE_CACHE", "/proc/no-cache-here")  # not even root can write there
    path = zoo.demo_checkpoint("lr_too_high")
    assert path.is_file() and not str(path).startswith("/proc")

    code, text = run_cli(loading)
    assert_written(loading, code, text)
    monkeypatch.setenv("TRIAGE_CACHE", str(loading / "cache"))
    real_write = atomic.write_text

    def full(target, text_):
        if "cache" in Path(target).parts:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(target, text_)

    import jinja2.bccache

    def no_room(self, f):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic, "write_text", full)
    monkeypatch.setattr(jinja2.bccache.Bucket, "write_bytecode", no_room)
    from typer.testing import CliRunner

    from triage.cli.commands import app

    result = CliRunner().invoke(app, ["report", "out/report.json"])
    assert result.exit_code == 0, result.output
    page = (loading / "out" / "report.html").read_text()
    assert page.rstrip().endswith("</html>") and "<svg" in page and "could not be rendered" not in page
