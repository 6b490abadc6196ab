"""The fix in values beyond the learning rate: zoo runs whose proof changes the clip, the precision, the
initial weights, the trained set, the skipped batches or the weight decay; report.fix_trial names each setting
before and after, and they are the proof replay's own parameters and outcome, as is what it reached."""

from __future__ import annotations

import json

import pytest

from tests.zoo.test_e2e_zoo import triage_example
from triage.cli.zoo import load_example
from triage.report.fix_trial import _INITS, _float, tried


def _proof_and_reference(report):
    proof = report.experiment(report.proof)
    return proof, report.experiment(proof.params.get("against") or "baseline")


def _the_change(report, key):
    assert report.fix_trial is not None, report.root_cause
    changes = {c.key: c for c in report.fix_trial.changes}
    assert list(changes) == [key], changes
    return changes[key]


def _expected(name, report):
    """(before, after) of the setting the proof changed, read from the proof replay and the run as it was."""
    proof, reference = _proof_and_reference(report)
    out, params = proof.outcome, proof.params
    if name == "exploding_gradients":
        return reference.outcome["clip_threshold"], out["clip_threshold"]
    if name == "fp16_overflow":
        return report.environment.precision, params["precision"]
    if name == "frozen_parameters":
        assert params["unfreeze"]
        return "as the run", load_example(name).LOCATION["parameters"]
    if name == "bad_batch":
        return None, [str(i) for i in out["skipped"]]
    if name == "bad_initialization":
        init = out["chosen"].removeprefix("init=") if str(out.get("chosen")).startswith("init=") else params["init"]
        return _INITS[reference.params.get("init", "checkpoint")], _INITS[init]
    if name == "weight_decay_too_high":
        run_decay = load_example(name).setup().optimizer.param_groups[0]["weight_decay"]
        return run_decay * reference.params["wd_scale"], run_decay * params["wd_scale"]
    raise AssertionError(name)


CASES = {"exploding_gradients": "clip", "fp16_overflow": "precision", "frozen_parameters": "unfreeze",
         "bad_batch": "skip_batches", "bad_initialization": "init", "weight_decay_too_high": "weight_decay"}


@pytest.mark.parametrize("name", list(CASES))
def test_the_fix_is_shown_in_the_values_its_proof_replay_used(name, tmp_path):
    _, report, files = triage_example(name, tmp_path)
    assert report.root_cause == load_example(name).ROOT_CAUSE
    change = _the_change(report, CASES[name])
    assert (change.before, change.after) == _expected(name, report)
    assert change.before != change.after
    proof, reference = _proof_and_reference(report)
    trial = report.fix_trial
    assert trial.node == report.proof and trial.against == reference.node
    assert trial.steps == proof.outcome["steps_run"] and trial.fix_works is proof.outcome["fix_works"] is True
    assert trial.loss_with_fix == _float(proof.outcome["loss_end"])
    assert trial.loss_without_fix == _float(proof.outcome.get("reference_end", reference.outcome["loss_end"]))
    assert trial.loss_with_fix < trial.loss_without_fix
    restarted = proof.params.get("init", "checkpoint") != "checkpoint" or str(proof.outcome.get("chosen")).startswith("init=")
    assert trial.restarted is restarted and trial.from_step == (0 if restarted else report.checkpoint.step)
    written = json.loads(files["json"].read_text())["fix_trial"]  # the same values, typed, in report.json
    assert written["changes"][0]["key"] == CASES[name] and written["changes"][0]["after"] == change.after
    assert change.words() in files["md"].read_text().replace("\\", "")


def test_a_report_without_fix_trial_reads_the_run_s_weight_decay_from_its_path_or_keeps_the_factor(tmp_path):
    # Schema 1.6 and before carry no fix_trial: it is worked out from the experiments. The run's weight
    # decay is known there only where a decision on the path read setup.weight_decay; else the factor stays.
    _, report, _ = triage_example("weight_decay_too_high", tmp_path)
    old = report.model_copy(update={"fix_trial": None})
    assert tried(old).changes[0].words() == "weight decay as the run → x0 of the run's"
    read = old.decisions[-1].model_copy(update={"figures": {**old.decisions[-1].figures, "setup.weight_decay": 1.0}})
    assert tried(old.model_copy(update={"decisions": old.decisions[:-1] + [read]})).changes == report.fix_trial.changes
