"""No work twice: a node whose experiment would measure exactly what an earlier node measured (the same
experiment, the same parameters as they act in this session) takes its figures instead of running it."""

from tests.tiny import blobs, mlp_setup
from triage.load.session import session_from_factory
from triage.walk.engine import walk
from triage.walk.playbook import load_playbook


def test_without_validation_data_the_validation_check_is_the_baseline_not_run_again():
    result = walk(session_from_factory(mlp_setup), load_playbook())
    assert "val_check" in result.path
    assert result.runs["val_check"].same_as == "baseline"
    assert result.runs["val_check"].outcome == result.runs["baseline"].outcome
    assert result.runs["val_check"].params["val_every"] == 5  # its own parameters, as the playbook wrote them


def test_with_validation_data_the_validation_check_runs_and_measures_validation_loss():
    result = walk(session_from_factory(lambda: mlp_setup(val_batches=blobs(2, seed=7))), load_playbook())
    assert "val_check" in result.path
    assert result.runs["val_check"].same_as is None
    assert len(result.runs["val_check"].outcome["val_losses"]) == 8  # every 5 of its 40 steps
