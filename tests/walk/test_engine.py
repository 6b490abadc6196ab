"""The engine: a failing experiment becomes an outcome, the walk goes on, the report is still written."""

import textwrap

from pydantic import Field

import pytest
import torch

from tests.tiny import mlp_setup
from triage.walk.engine import walk
from triage.experiments import Experiment, Outcome, Params, default_registry
from triage.walk.playbook import load_playbook
from triage.load.session import session_from_factory


class BoomParams(Params):
    message: str = "boom"


class BoomOutcome(Outcome):
    value: float = Field(description="never measured")


def boom(ctx, params):
    raise RuntimeError(params.message)


BOOK = """
name: t
entry: explode
nodes:
  explode:
    run: boom
    branches:
      - when: explode.value > 1
        goto: never
      - when: explode.status == "error"
        goto: base
    otherwise: never
  base:
    run: replay
    with: {steps: 5}
    otherwise: fine
  never:
    diagnosis: lr_too_high
    fix: x
  fine:
    diagnosis: healthy
    fix: nothing
"""


def test_a_raising_experiment_is_an_error_outcome_and_the_walk_goes_on(tmp_path):
    registry = default_registry()
    registry.register(Experiment("boom", "raises", BoomParams, BoomOutcome, boom))
    path = tmp_path / "b.yaml"
    path.write_text(textwrap.dedent(BOOK))
    result = walk(session_from_factory(mlp_setup), load_playbook(path, registry))
    assert result.path == ["explode", "base", "fine"]
    failed = result.runs["explode"]
    assert failed.status == "error" and "RuntimeError: boom" in failed.error and failed.outcome is None
    assert result.decisions[0].figures == {"explode.value": None, "explode.status": "error"}
    assert result.runs["base"].status == "ok"


def test_the_walk_leaves_the_users_model_as_it_was():
    session = session_from_factory(lambda: mlp_setup(lr=1.0))
    before = {k: v.clone() for k, v in session.setup.model.state_dict().items()}
    walk(session, load_playbook())
    after = session.setup.model.state_dict()
    assert all((before[k] == after[k]).all() for k in before)


def test_a_run_that_cannot_be_replayed_is_inconclusive_not_healthy():
    def breaks_on_batch_2():
        s = mlp_setup()
        batches = list(s.batches)
        batches[2] = (batches[2][0][:, :5], batches[2][1])  # a batch of the wrong width
        return s.model_copy(update={"batches": batches})

    result = walk(session_from_factory(breaks_on_batch_2), load_playbook())
    assert result.runs["baseline"].status == "error"
    assert result.leaf.diagnosis == "inconclusive"
