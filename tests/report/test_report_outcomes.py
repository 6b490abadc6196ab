"""The report and the terminal read outcomes one checked way (triage/report/outcomes.py, issue 24 item 2), through
the experiments' own torch-free Outcome models (triage/outcomes/, issue 36 item 3): every field a reader asks
for exists on the model it asked for, no reader in report/ or cli/ picks an outcome field by string, and an
older report or an experiment the report does not know still reads."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import math
import typing
from pathlib import Path

import pytest

from triage.outcomes import SHIPPED, Outcome
from triage.outcomes.batch_scan import BatchScanOutcome
from triage.outcomes.data_check import DataCheckOutcome, NonFiniteTensor
from triage.outcomes.replay import ReplayOutcome
from triage.outcomes.search import LrSearchOutcome, SearchOutcome, Trial
from triage.records import ExperimentRun
from triage.report.outcomes import outcome_of, read_as

REPO = Path(__file__).resolve().parents[2]
READERS = sorted((REPO / "triage" / "report").glob("*.py")) + sorted((REPO / "triage" / "cli").rglob("*.py"))


def _bare(annotation):
    """`annotation` without Optional[...] around it."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, getattr(__import__("types"), "UnionType")) and len(args) == 1:
        return _bare(args[0])
    return annotation


def test_each_experiment_is_read_as_its_own_outcome_model():
    """outcome_of(run, ReplayOutcome) answers for exactly the experiments whose Outcome is a ReplayOutcome."""
    replays = sorted(name for name, model in SHIPPED.items() if issubclass(model, ReplayOutcome))
    assert replays == ["init_search", "lr_search", "replay", "standard_loss_swap"]
    for name, model in SHIPPED.items():
        read = outcome_of(run_of(name, {"steps_run": 3}), ReplayOutcome)
        assert (read is not None) == (name in replays) and (read is None or type(read) is model)


def misreads(source: str, namespace: dict) -> list[str]:
    """Attributes asked of a reading (a name bound from `outcome_of(run, Model)` or `read_as(Model, ...)`, or a
    parameter annotated with an outcome model) that its model lacks. `namespace`: the module's globals, to
    resolve Model."""
    found = []

    def model_named(node):
        value = namespace.get(node.id) if isinstance(node, ast.Name) else None
        return value if isinstance(value, type) and issubclass(value, Outcome) else None

    def reading_of(expr):
        """The model `expr` evaluates to a reading of, where it is one."""
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "outcome_of":
            return model_named(expr.args[1])
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "read_as":
            return model_named(expr.args[0])  # read_as(ReplayOutcome, {}): a reading with nothing measured
        if isinstance(expr, ast.BoolOp):  # outcome_of(run, ReplayOutcome) or nothing
            return next(filter(None, map(reading_of, expr.values)), None)
        if isinstance(expr, ast.IfExp):
            return reading_of(expr.body) or reading_of(expr.orelse)
        return None

    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        bound = {}
        for arg in fn.args.args:
            for name in ast.walk(arg.annotation) if arg.annotation else ():
                if model_named(name):
                    bound[arg.arg] = model_named(name)
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                targets = node.targets[0]
                pairs = (zip(targets.elts, node.value.elts) if isinstance(targets, ast.Tuple)
                         and isinstance(node.value, ast.Tuple) else [(targets, node.value)])
                for target, value in pairs:
                    if isinstance(target, ast.Name) and reading_of(value):
                        bound[target.id] = reading_of(value)
        for node in ast.walk(fn):  # `for entry in checked.nonfinite or []`: an entry is a nested reading
            if isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
                for part in ast.walk(node.iter):
                    if isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) \
                            and part.value.id in bound and part.attr in bound[part.value.id].model_fields:
                        item = typing.get_args(_bare(bound[part.value.id].model_fields[part.attr].annotation))
                        if item and isinstance(item[0], type) and issubclass(item[0], Outcome):
                            bound[node.target.id] = item[0]
        for node in ast.walk(fn):
            if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
                continue
            model = (bound.get(node.value.id) if isinstance(node.value, ast.Name)
                     else reading_of(node.value) if isinstance(node.value, ast.Call) else None)
            if model is not None and node.attr not in model.model_fields and not hasattr(model, node.attr):
                found.append(f"{fn.name}:{node.lineno} {model.__name__}.{node.attr}")
    return found


@pytest.mark.parametrize("path", READERS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_field_a_reader_asks_for_is_on_the_model_it_reads(path):
    name = ".".join(path.relative_to(REPO).with_suffix("").parts)
    module = importlib.import_module(name.removesuffix(".__init__"))
    assert misreads(path.read_text(), vars(module)) == []


def test_a_misspelt_field_is_caught():
    source = ("def reader(run):\n    replay = outcome_of(run, ReplayOutcome)\n    return replay.los_end\n"
              "def other(fix: ReplayOutcome):\n    return fix.loss_end, fix.sanee, outcome_of(None, SearchOutcome).chosn\n"
              "def blank():\n    nothing = read_as(ReplayOutcome, {})\n    return nothing.fix_workz\n")
    namespace = {"ReplayOutcome": ReplayOutcome, "SearchOutcome": SearchOutcome}
    assert misreads(source, namespace) == ["reader:3 ReplayOutcome.los_end", "other:5 ReplayOutcome.sanee",
                                           "other:5 SearchOutcome.chosn", "blank:8 ReplayOutcome.fix_workz"]
    run = ExperimentRun(node="a", experiment="replay", params={}, status="ok", seconds=1.0, outcome={"loss_end": 1.0})
    with pytest.raises(AttributeError):
        outcome_of(run, ReplayOutcome).los_end


def test_no_reader_in_report_or_cli_picks_an_outcome_field_by_string():
    spec = importlib.util.spec_from_file_location("architecture", REPO / "benchmarks" / "architecture.py")
    architecture = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(architecture)
    sites = architecture.string_reads(architecture.modules(REPO / "triage"), REPO / "triage")
    readers = [s for s in sites if s[0].startswith(("triage/report/", "triage/cli/"))]
    # build_report reads the live Outcome of the proof, whatever experiment (a playbook's own too) it is, and
    # what it reads decides whether the proof stands: it stays a read of any Outcome that has `fix_works`.
    assert [s for s in readers if s[:2] != ("triage/report/build.py", "build_report")] == []


def run_of(experiment: str, outcome: dict) -> ExperimentRun:
    return ExperimentRun(node="n", experiment=experiment, params={}, status="ok", seconds=1.0, outcome=outcome)


def test_an_outcome_reads_as_its_experiments_model_with_non_finite_numbers():
    replay = outcome_of(run_of("lr_search", {"loss_end": "NaN", "reference_end": "Infinity", "lrs": [0.1],
                                             "chosen": "lr x0.1", "lr_factor": 0.1, "finite": True}), ReplayOutcome)
    assert isinstance(replay, LrSearchOutcome) and replay.chosen == "lr x0.1" and replay.lr_factor == 0.1
    assert math.isnan(replay.loss_end) and replay.reference_end == math.inf


def test_an_experiment_that_measures_something_else_reads_as_none():
    assert outcome_of(run_of("data_check", {"nonfinite": []}), ReplayOutcome) is None
    assert outcome_of(run_of("replay", {"loss_end": 1.0}), SearchOutcome) is None
    assert outcome_of(None, ReplayOutcome) is None
    assert outcome_of(run_of("replay", {}), ReplayOutcome) is None


def test_an_older_report_reads_with_its_missing_fields_none():
    """A report of an earlier schema lacks fields added since, and may hold ones since removed."""
    replay = outcome_of(run_of("replay", {"loss_end": 0.5, "a_field_since_removed": 3}), ReplayOutcome)
    assert replay.loss_end == 0.5 and replay.fix_works is None and replay.skipped is None
    assert replay.steps_run is None and replay.lr_factor is None  # missing: None, whatever the model's default
    scan = outcome_of(run_of("batch_scan", {"worst_batch": 2, "worst_value": "not a number"}), BatchScanOutcome)
    assert scan.worst_batch == 2 and scan.worst_value is None  # a value that no longer fits reads as absent


def test_records_in_an_outcome_read_as_leniently_as_the_outcome():
    checked = outcome_of(run_of("data_check", {"nonfinite": [{"split": "train", "batch": 2, "key": "[0]",
                                                              "nan": "many", "since_removed": 1}]}), DataCheckOutcome)
    (entry,) = checked.nonfinite
    assert isinstance(entry, NonFiniteTensor) and (entry.batch, entry.key, entry.nan, entry.inf) == (2, "[0]", None, None)
    search = outcome_of(run_of("init_search", {"trials": [{"setting": "init=kaiming", "finite": True}]}), SearchOutcome)
    assert search.trials == [read_as(Trial, {"setting": "init=kaiming", "finite": True})]
    assert outcome_of(run_of("data_check", {"nonfinite": ["not a record"]}), DataCheckOutcome).nonfinite is None


def test_an_experiment_the_report_does_not_know_reads_as_the_model_asked_for():
    """A playbook's own experiment (`imports:`), re-rendered by `triage report`: read by the fields it has."""
    run = run_of("my_own_fix", {"loss_end": 0.25, "fix_works": True, "against": "baseline", "custom": [1, 2]})
    replay = outcome_of(run, ReplayOutcome)
    assert (replay.loss_end, replay.fix_works, replay.against, replay.finite) == (0.25, True, "baseline", None)
    checked = outcome_of(run, DataCheckOutcome)
    assert checked is not None and checked.nonfinite is None
