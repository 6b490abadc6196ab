"""Hostile and careless inputs (issue 10): one case per class, as a user would check it.

Every case runs `triage run` (in process, through the CLI; a real process where a signal or a file-size
limit is involved) on tiny real runs and asserts what a user would look at: the exit code (0 finished,
2 bad input, 130 interrupted), no traceback, what the message says, whether the report was written as
documented, and that no input file changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from triage.cli.commands import app
from triage.report.model import SCHEMA_VERSION

ENTRY = '''
import sys
import torch
from torch import nn
import triage


def batches(n=6):
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(2, 4, generator=g) * 3
    out = []
    for _ in range(n):
        y = torch.randint(0, 2, (32,), generator=g)
        out.append((centers[y] + torch.randn(32, 4, generator=g), y))
    return out


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))


def loss(m, batch):
    return nn.functional.cross_entropy(m(batch[0]), batch[1])


def make(loss_fn=loss, data=None, opt="sgd", m=None):
    m = m or model()
    o = torch.optim.SGD(m.parameters(), lr=0.1) if opt == "sgd" else torch.optim.Adam(m.parameters(), lr=1e-3)
    return triage.Setup(model=m, optimizer=o, loss_fn=loss_fn, batches=batches() if data is None else data)


def setup():
    return make()


def adam():
    return make(opt="adam")


def scaling_loss(m, batch):
    x, y = batch
    x.mul_(1.5)  # "normalises" in place: without protection every call changes the snapshot
    return nn.functional.cross_entropy(m(x), y)


def mutating():
    return make(loss_fn=scaling_loss)


def casting_loss(m, batch):
    batch["x"] = batch["x"].double().float()  # replaces the entry
    batch["y"] = batch["y"].to(torch.int32).long()
    batch["mask"] = batch["x"] > 0  # and adds one
    return nn.functional.cross_entropy(m(batch["x"]), batch["y"])


def casting():
    return make(loss_fn=casting_loss, data=[{"x": x, "y": y} for x, y in batches()])


def breaks_on_batch_3(m, batch):
    if float(batch[0][0, 0]) == float(batches()[3][0][0, 0]):
        raise ValueError("corrupt record")
    return loss(m, batch)


def failing_batch():
    return make(loss_fn=breaks_on_batch_3)


class Loader:
    def __iter__(self):
        yield from batches(2)
        raise OSError("shard 2 is unreadable")


def failing_loader():
    return make(data=Loader())


def exits():
    sys.exit(5)


def wide():
    return make(m=nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2)))
'''

SHORT = """
name: short
entry: data
nodes:
  data:
    run: data_check
    otherwise: checkpoint
  checkpoint:
    run: checkpoint_check
    branches:
      - when: checkpoint.nonfinite_count > 0
        goto: broken
    otherwise: first
  first:
    run: replay
    with: {steps: 6}
    otherwise: second
  second:
    run: replay
    with: {steps: 6}
    branches:
      - when: second.loss_end > first.loss_end * 2
        goto: worse
    otherwise: fine
  broken:
    diagnosis: nonfinite_checkpoint
    fix: Take an earlier checkpoint.
    evidence: [checkpoint]
  worse:
    diagnosis: lr_too_high
    fix: lower it
    evidence: [first, second]
  fine:
    diagnosis: healthy
    fix: nothing
    evidence: [first, second]
"""


def short_with(condition: str = "second.loss_end > first.loss_end * 2", replay_id: str = "second",
               title: str = "", imports: str = "", long_steps: int = 0) -> str:
    text = SHORT.replace("second.loss_end > first.loss_end * 2", json.dumps(condition)).replace("second", replay_id)
    if title:
        text = text.replace("    run: data_check\n", f"    run: data_check\n    title: {json.dumps(title)}\n")
    if imports:
        text = text.replace("entry: data\n", f"entry: data\nimports: [{imports}]\n")
    if long_steps:
        text = text.replace("with: {steps: 6}\n    branches", f"with: {{steps: {long_steps}}}\n    branches")
    return text


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A folder as a user has it: their module, checkpoints, playbooks. Each case adds what it needs."""
    (tmp_path / "hostile_entry.py").write_text(ENTRY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [n for n in sys.modules if n.startswith(("hostile_entry", "team_", "exits_"))]:
        monkeypatch.delitem(sys.modules, name)
    sys.path.insert(0, str(tmp_path))
    import hostile_entry

    s = hostile_entry.setup()
    torch.save({"model": s.model.state_dict(), "optimizer": s.optimizer.state_dict()}, tmp_path / "ckpt.pt")
    (tmp_path / "short.yaml").write_text(SHORT)
    return tmp_path


def digest(folder: Path) -> dict[str, str]:
    """Every input file's hash (the output folder and caches left out)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and "out" not in p.relative_to(folder).parts[:1]
            and "__pycache__" not in p.parts}


def run_cli(folder: Path, *args: str, playbook: str | None = "short.yaml", checkpoint: str | None = "ckpt.pt",
            entry: str = "hostile_entry:setup"):
    before = digest(folder)
    command = ["run", "--entry", entry, "--out", "out", "--output", "quiet"]
    command += ["--checkpoint", checkpoint] if checkpoint else []
    command += ["--playbook", playbook] if playbook else []
    result = CliRunner().invoke(app, [*command, *args])
    text = " ".join(result.output.split())
    assert "Traceback" not in result.output, result.output
    assert digest(folder) == before, "an input file changed"
    return result.exit_code, text


def report(folder: Path) -> dict:
    return json.loads((folder / "out" / "report.json").read_text())


def assert_refused(folder: Path, code: int, text: str, *fragments: str) -> None:
    assert code == 2, text
    for fragment in fragments:
        assert fragment in text, text
    assert not (folder / "out" / "report.json").exists()


def assert_written(folder: Path, code: int, text: str) -> dict:
    assert code == 0, text
    files = {p.name for p in (folder / "out").iterdir()}
    assert files == {"report.html", "report.json", "summary.md"}, files  # no temporary left behind
    return report(folder)


# ── 1. The data is in the snapshot ──────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("entry, changed", [
    ("hostile_entry:mutating", "[0] values changed"),
    ("hostile_entry:casting", "['mask'] added"),
])
def test_a_loss_fn_that_changes_its_batch_leaves_every_replay_the_same_data_and_is_a_finding(project, entry,
                                                                                             changed):
    code, text = run_cli(project, entry=entry)
    data = assert_written(project, code, text)
    first, second = (next(e for e in data["experiments"] if e["node"] == n)["outcome"] for n in ("first", "second"))
    assert first["losses"] == second["losses"]  # two identical replays agree
    finding = next(f for f in data["findings"] if f["id"] == "loss_fn_mutates_batch")
    assert "snapshot batch 0" in finding["text"] and changed in finding["text"]


def test_the_snapshot_batches_are_not_changed_by_a_mutating_loss_fn(project):
    import hostile_entry
    from triage.walk.engine import walk
    from triage.walk.playbook import load_playbook
    from triage.load.session import session_from_factory

    session = session_from_factory(hostile_entry.mutating)
    pristine = [x.clone() for x, _ in hostile_entry.batches()]
    walk(session, load_playbook(project / "short.yaml"))
    assert all(torch.equal(x, p) for (x, _), p in zip(session.batches, pristine))


def test_two_runs_on_the_same_inputs_agree(project):
    outcomes = []
    for _ in range(2):
        code, text = run_cli(project, entry="hostile_entry:mutating")
        outcomes.append([e["outcome"] for e in assert_written(project, code, text)["experiments"]])
    assert outcomes[0] == outcomes[1]


# ── 2. Nothing raised after the experiments loses the report ────────────────────────────────────────

@pytest.mark.parametrize("condition, found", [
    ("second.loss_end * [1, 2] > 1", "'*' needs numbers, found a list"),
    ("-setup.precision == 1", "'-' needs numbers, found a string"),
    ("setup.precision > 1", "cannot order a string against a number"),
    ("'ab' * setup.batch_count == 'x'", "'*' needs numbers, found a string"),
    ("first.losses in 3", "'in' needs a list or a string on its right"),
])
def test_a_condition_that_can_never_be_evaluated_is_refused_when_the_playbook_loads(project, condition, found):
    (project / "typed.yaml").write_text(short_with(condition))
    code, text = run_cli(project, playbook="typed.yaml")
    assert_refused(project, code, text, "typed.yaml:", found)


def test_a_condition_that_fails_at_walk_time_is_unknown_recorded_and_the_walk_goes_on(project):
    huge = "1" + "0" * 400  # an int too large for a float: only known to fail when evaluated
    (project / "overflow.yaml").write_text(short_with(f"second.loss_end * {huge} > 1"))
    code, text = run_cli(project, playbook="overflow.yaml")
    data = assert_written(project, code, text)
    assert data["root_cause"] == "healthy"  # unknown is not taken: the walk went on to `otherwise`
    decision = next(d for d in data["decisions"] if d["node"] == "second")
    assert any("OverflowError" in e and "taken as unknown" in e for e in decision["errors"])


def test_a_very_long_replay_node_id_renders_and_re_renders(project):
    long_id = "replay_" + "x" * 120
    (project / "long.yaml").write_text(short_with(replay_id=long_id))
    code, text = run_cli(project, playbook="long.yaml")
    assert_written(project, code, text)
    assert "<svg" in (project / "out" / "report.html").read_text()  # the plots were drawn
    again = CliRunner().invoke(app, ["report", "out/report.json"])
    assert again.exit_code == 0 and "Traceback" not in again.output


def test_user_text_is_escaped_and_bidi_controls_are_neutralised(project):
    title = "<script>alert(1)</script> total \u202etxt.exe\u202c"
    (project / "bidi.yaml").write_text(short_with(title=title))
    code, text = run_cli(project, playbook="bidi.yaml")
    assert_written(project, code, text)
    for name in ("report.html", "summary.md"):
        page = (project / "out" / name).read_text()
        assert "\u202e" not in page and "\u202c" not in page
        assert "<script>alert" not in page
    assert "\u27e8U+202E\u27e9" in (project / "out" / "report.html").read_text()


def slow_run(project: Path, output: str = "quiet", **extra) -> subprocess.Popen:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "triage", "run", "--entry", "hostile_entry:setup", "--checkpoint",
                             "ckpt.pt", "--playbook", "slow.yaml", "--out", "out", "--output", output],
                            cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **extra)


def test_ctrl_c_mid_walk_writes_a_report_marked_interrupted_with_what_was_measured(project):
    (project / "slow.yaml").write_text(short_with(long_steps=100_000))
    before = digest(project)
    # Ctrl-C as a terminal sends it, whatever this test inherited: a shell that starts a job in the background
    # (`.ci/run &`) ignores SIGINT for it, and an ignored SIGINT stays ignored in every child.
    proc = slow_run(project, output="jsonl", preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in proc.stdout:  # Ctrl-C once the long replay has started (its start is an event of the jsonl output)
        if '"event": "started"' in line and '"node": "second"' in line:
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted after 3 experiments" in " ".join(err.split())
    data = report(project)
    assert data["status"] == "interrupted" and data["root_cause"] == "interrupted"
    assert [e["node"] for e in data["experiments"]] == ["data", "checkpoint", "first"]
    assert (project / "out" / "report.html").exists()
    assert digest(project) == before


def test_a_full_disk_while_the_report_is_written_leaves_no_truncated_file_and_says_so(project):
    def limit_file_size():  # as a full disk does: writes past 60 KB fail (EFBIG, not a signal)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))

    (project / "slow.yaml").write_text(short_with())
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "MPLCONFIGDIR": str(project / "mpl")}
    proc = subprocess.run([sys.executable, "-m", "triage", "run", "--entry", "hostile_entry:setup", "--checkpoint",
                           "ckpt.pt", "--playbook", "slow.yaml", "--out", "out", "--output", "quiet"], cwd=project,
                          env=env, capture_output=True, text=True, preexec_fn=limit_file_size, timeout=300)
    message = " ".join(proc.stderr.split())
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "found it cannot be written (File too large). No file there is truncated" in message
    assert all(not p.name.endswith(".tmp") for p in (project / "out").iterdir())
    json.loads((project / "out" / "report.json").read_text())  # what was written is whole
    if (project / "out" / "report.html").exists():
        assert (project / "out" / "report.html").read_text().rstrip().endswith("</html>")


# ── 3. Limits on size and nesting ───────────────────────────────────────────────────────────────────

def chain(n: int) -> str:
    text = "name: chain\nentry: n0\nnodes:\n"
    for i in range(n - 1):
        text += f"  n{i}:\n    run: data_check\n    otherwise: n{i + 1}\n"
    return text + f"  n{n - 1}:\n    diagnosis: healthy\n    fix: f\n"


@pytest.mark.parametrize("text, found", [
    ("name: x\nentry: a\nnodes: " + "[" * 3000 + "]" * 3000 + "\n", "nested at most 64 levels deep"),
    ("a: &a [x,x,x,x,x,x,x,x,x,x]\n" + "".join(f"{c}: &{c} [" + ",".join([f"*{p}"] * 10) + "]\n"
                                              for p, c in zip("abcdefgh", "bcdefghi")), "aliases expanded"),
    (chain(2001), "at most 2,000 nodes and candidates, found 2,001 nodes"),
    ("# " + "x" * (3 * 2**20) + "\n", "at most 2 MiB"),
    (SHORT.replace("second.loss_end > first.loss_end * 2", "not " * 520 + "second.finite"), "characters is longer"),
    (SHORT.replace("second.loss_end > first.loss_end * 2", "'" + "not (" * 45 + "second.finite" + ")" * 45 + "'"),
     "nested more than the 40 levels"),
    (SHORT.replace("second.loss_end > first.loss_end * 2", "'" + "-" * 60 + "second.loss_end > 1'"),
     "nested more than the 40 levels"),
])
def test_a_playbook_over_a_limit_is_refused_with_the_limit(project, text, found):
    (project / "big.yaml").write_text(text)
    started = time.perf_counter()
    code, message = run_cli(project, playbook="big.yaml")
    assert_refused(project, code, message, "big.yaml", found)
    assert time.perf_counter() - started < 60


@pytest.mark.parametrize("refuses", ["libyaml", "every parser"])
def test_a_deep_playbook_gets_triage_s_limit_whatever_the_yaml_library_refuses_itself(project, monkeypatch, refuses):
    """PyYAML 6.0.4's libyaml refuses flow nesting past 1000 levels with its own syntax error; a later
    version may refuse earlier, or in its pure-Python parser too. The user still reads triage's limit."""
    import yaml

    parse = yaml.parse

    def limited(text, Loader=yaml.SafeLoader):
        if "[" * 100 in text and (refuses == "every parser" or Loader is not yaml.SafeLoader):
            raise yaml.YAMLError("exceeded maximum nesting depth")
        return parse(text, Loader=Loader)

    monkeypatch.setattr(yaml, "parse", limited)
    (project / "deep.yaml").write_text("name: x\nentry: a\nnodes: " + "[" * 3000 + "]" * 3000 + "\n")
    code, message = run_cli(project, playbook="deep.yaml")
    assert_refused(project, code, message, "deep.yaml", "line 3", "nested at most 64 levels deep", "flatten it")


def test_a_playbook_that_is_not_utf8_is_refused(project):
    (project / "latin.yaml").write_bytes(SHORT.replace("name: short", "name: caf\xe9").encode("latin-1"))
    code, text = run_cli(project, playbook="latin.yaml")
    assert_refused(project, code, text, "expected UTF-8 text")


def test_a_history_over_the_limit_is_read_from_its_tail(project):
    with open(project / "history.csv", "w") as handle:  # ~45 MB: more than the 32 MiB tail triage reads
        handle.write("step,loss\n")
        for block in range(30):
            handle.write("".join(f"{i},{1 + 1 / (i + 1):.6f}\n" for i in range(block * 100_000, (block + 1) * 100_000)))
    code, text = run_cli(project, "--history", "history.csv")
    data = assert_written(project, code, text)
    steps = [p["step"] for p in data["history"]]
    assert len(steps) == 100_000 and steps[-1] == 2_999_999  # the newest points


@pytest.mark.parametrize("name, content, found", [
    ("inf.csv", b"step,loss\n0,1.0\ninf,0.5\n", "row 2 has step inf"),
    ("nan.jsonl", b'{"step": 0, "loss": 1}\n{"step": NaN, "loss": 1}\n', "has step nan"),
    ("trainer_state.json", b'{"log_history": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "JSON nested too deeply"),
    ("rows.jsonl", b"[1, 2]\n", "row 1 is a list"),
    ("missing.csv", None, "found none"),
])
def test_a_broken_history_exits_2_naming_the_problem(project, name, content, found):
    if content is not None:
        (project / name).write_bytes(content)
    code, text = run_cli(project, "--history", name)
    assert_refused(project, code, text, found)


def test_a_latin1_history_is_read(project):
    (project / "latin.csv").write_bytes("step,loss,note\n0,2.0,caf\xe9\n1,1.5,d\xe9j\xe0\n".encode("latin-1"))
    code, text = run_cli(project, "--history", "latin.csv")
    assert [p["loss"] for p in assert_written(project, code, text)["history"]] == [2.0, 1.5]


# ── 4. Trusted code, named ──────────────────────────────────────────────────────────────────────────

TEAM = '''
from triage import Experiment, Outcome, Params

class NoParams(Params):
    pass

class Count(Outcome):
    batches: int

EXPERIMENTS = [Experiment("count_batches", "counts", NoParams, Count, lambda ctx, p: Count(batches=len(ctx.session.batches)))]
'''


def test_playbook_imports_run_only_with_trust_playbook(project):
    (project / "team_checks.py").write_text(TEAM)
    (project / "team.yaml").write_text(short_with(imports="team_checks"))
    code, text = run_cli(project, playbook="team.yaml")
    assert_refused(project, code, text, "['team_checks'], which would run their code on import", "--trust-playbook")
    assert "team_checks" not in sys.modules  # refused before anything was imported
    code, text = run_cli(project, "--trust-playbook", playbook="team.yaml")
    assert code == 0 and "team_checks" in sys.modules, text


@pytest.mark.parametrize("where, args, found", [
    ("playbook", ["--trust-playbook"], "found it called sys.exit(4) while being imported"),
    ("entry", [], "found it called sys.exit(4) while being imported"),
    ("setup", [], "found it called sys.exit(5)"),
])
def test_a_sys_exit_in_imported_code_is_a_message(project, where, args, found):
    (project / "exits_mod.py").write_text("import sys\nsys.exit(4)\n")
    (project / "team.yaml").write_text(short_with(imports="exits_mod"))
    kwargs = {"playbook": "team.yaml"} if where == "playbook" else \
        {"entry": "exits_mod:setup"} if where == "entry" else {"entry": "hostile_entry:exits"}
    code, text = run_cli(project, *args, **kwargs)
    assert_refused(project, code, text, found)


def test_conditions_never_run_code(project):
    (project / "evil.yaml").write_text(short_with("__import__('os').system('touch PWNED') == 0"))
    code, text = run_cli(project, playbook="evil.yaml")
    assert_refused(project, code, text, "not part of the condition language")
    assert not (project / "PWNED").exists()


# ── 5. A checkpoint that is already broken ──────────────────────────────────────────────────────────

@pytest.mark.parametrize("entry, poison, named", [
    ("hostile_entry:setup", "weights", "0.weight"),
    ("hostile_entry:adam", "optimizer", "optimizer exp_avg_sq of 2.weight"),
])
def test_a_checkpoint_saved_after_the_failure_is_its_own_verdict_before_any_replay(project, entry, poison, named):
    import hostile_entry

    s = getattr(hostile_entry, entry.split(":")[1])()
    hostile_entry.loss(s.model, s.batches[0]).backward()
    s.optimizer.step()
    with torch.no_grad():
        if poison == "weights":
            s.model[0].weight[0, 0] = float("nan")
        else:
            s.optimizer.state[s.model[2].weight]["exp_avg_sq"].fill_(float("inf"))
    torch.save({"model": s.model.state_dict(), "optimizer": s.optimizer.state_dict()}, project / "broken.pt")
    code, text = run_cli(project, entry=entry, checkpoint="broken.pt", playbook=None)  # the shipped playbook
    data = assert_written(project, code, text)
    assert data["root_cause"] == "nonfinite_checkpoint" and data["confidence"] == "high"
    assert named in data["location"]["parameters"]
    assert [e["experiment"] for e in data["experiments"]] == ["data_check", "checkpoint_check"]  # no replay
    assert "earlier checkpoint" in data["fix"]


# ── 6. Messages that say what, where and what to do ─────────────────────────────────────────────────

class Evil:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_a_refused_pickle_names_the_global_it_wanted_and_runs_nothing(project):
    torch.save({"model": {"w": torch.zeros(1)}, "x": Evil()}, project / "evil.pt")
    code, text = run_cli(project, checkpoint="evil.pt")
    assert_refused(project, code, text, "calls posix.system", "do not pass --trust-checkpoint")
    assert "truncated" not in text
    assert not (project / "PWNED").exists()


def test_a_whole_pickled_module_is_named_and_trust_takes_its_state_dict(project):
    import hostile_entry

    torch.save(hostile_entry.model(), project / "module.pt")
    code, text = run_cli(project, checkpoint="module.pt")
    assert_refused(project, code, text, "found a whole pickled module (torch.nn.modules.container.Sequential)",
                   "torch.save(model.state_dict(), path)", "--trust-checkpoint")
    code, text = run_cli(project, "--trust-checkpoint", checkpoint="module.pt")
    assert assert_written(project, code, text)["checkpoint"]["layout"] == "module"


def test_each_key_of_another_shape_is_named_with_both_shapes(project):
    code, text = run_cli(project, entry="hostile_entry:wide")
    assert_refused(project, code, text, "found 3 that differ", "0.weight: checkpoint (16, 4), model (32, 4)",
                   "2.weight: checkpoint (2, 16), model (2, 32)")


def test_an_optimizer_state_of_another_type_names_both(project):
    code, text = run_cli(project, entry="hostile_entry:adam")
    assert_refused(project, code, text, "lack betas, eps (settings setup()'s Adam needs)",
                   "and hold dampening, momentum, which Adam has no setting for", "setup() built (Adam)")


@pytest.mark.parametrize("make_out, found", [
    (lambda p: (p / "out").write_text("a file"), "Expected --out 'out' to be a folder (or not to exist yet), found a file"),
])
def test_an_out_that_is_a_file_is_refused_before_any_experiment(project, make_out, found):
    make_out(project)
    code, text = run_cli(project)
    assert code == 2 and found in text and (project / "out").read_text() == "a file"


def test_a_batch_that_fails_is_named_by_its_index(project):
    code, text = run_cli(project, entry="hostile_entry:failing_loader")
    assert_refused(project, code, text, "reading batch 2 raised OSError: shard 2 is unreadable")
    code, text = run_cli(project, entry="hostile_entry:failing_batch")
    data = assert_written(project, code, text)  # a loss_fn that raises is the fault shown, not bad input
    first = next(e for e in data["experiments"] if e["node"] == "first")
    assert first["status"] == "error" and "loss_fn raised on snapshot batch 3 (of 6)" in first["error"]


# ── Input classes that already held: they stay held ─────────────────────────────────────────────────

@pytest.mark.parametrize("checkpoint, content, found", [
    ("missing.pt", None, "found no such file"),
    ("garbage.pt", b"not a checkpoint at all", "could not be read"),
    ("empty.pt", b"", "could not be read"),
])
def test_unreadable_checkpoints_exit_2(project, checkpoint, content, found):
    if content is not None:
        (project / checkpoint).write_bytes(content)
    code, text = run_cli(project, checkpoint=checkpoint)
    assert_refused(project, code, text, found)


def test_a_truncated_checkpoint_exits_2(project):
    data = (project / "ckpt.pt").read_bytes()
    (project / "cut.pt").write_bytes(data[: len(data) // 2])
    code, text = run_cli(project, checkpoint="cut.pt")
    assert_refused(project, code, text, "could not be read", "truncated")


def test_a_good_run_exits_0_and_writes_the_report_without_touching_inputs(project):
    code, text = run_cli(project)
    data = assert_written(project, code, text)
    assert data["status"] == "complete" and data["schema_version"] == SCHEMA_VERSION
