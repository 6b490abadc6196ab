"""Playbooks are validated before anything runs; errors name the file, the node and the line."""

import textwrap

import networkx as nx
import pytest

from triage.errors import PlaybookError
from triage.walk.playbook import load_playbook

GOOD = """
name: mini
entry: data
nodes:
  data:
    run: data_check
    branches:
      - when: data.nonfinite_count > 0
        goto: bad_data
    otherwise: base
  base:
    run: replay
    with: {steps: 5}
    branches:
      - when: not base.finite
        goto: lr
    otherwise: fine
  lr:
    run: replay
    with: {steps: 5, lr_scale: 0.1}
    otherwise: too_high
  bad_data:
    diagnosis: nonfinite_data
    fix: clean it
    evidence: [data]
  too_high:
    diagnosis: lr_too_high
    fix: lower it
    evidence: [base, lr]
    proof: lr
  fine:
    diagnosis: healthy
    fix: nothing
"""


def write(tmp_path, text):
    path = tmp_path / "book.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_the_shipped_playbook_is_valid():
    book = load_playbook()
    assert book.name == "default"
    assert nx.is_directed_acyclic_graph(book.graph)


def test_a_good_playbook_becomes_a_graph(tmp_path):
    book = load_playbook(write(tmp_path, GOOD))
    assert set(book.graph.successors("base")) == {"lr", "fine"}
    assert book.params["lr"].lr_scale == 0.1


@pytest.mark.parametrize("old, new, message", [
    ("run: replay\n    with: {steps: 5}\n    branches", "run: replaay\n    with: {steps: 5}\n    branches",
     "node 'base': runs 'replaay', which is not a registered experiment"),
    ("with: {steps: 5, lr_scale: 0.1}", "with: {steps: 5, lr_scael: 0.1}", "node 'lr': parameters of 'replay'"),
    ("with: {steps: 5, lr_scale: 0.1}", "with: {steps: -5}", "node 'lr': parameters of 'replay'"),
    ("goto: lr\n", "goto: lower\n", "node 'base': goes to 'lower', which is not a node"),
    ("otherwise: too_high", "otherwise: base", "is on a cycle"),
    ("    diagnosis: healthy\n", "    diagnosis: healthy_ish\n", "node 'fine': diagnosis 'healthy_ish' is not a known"),
    ("when: not base.finite", "when: not base.finit", "has no field 'finit'"),
    ("when: not base.finite", "when: lr.finite", "does not always run before this point"),
    ("when: not base.finite", "when: __import__('os')", "'__import__(...)' is not part of the condition language"),
    ("when: not base.finite", "when: stalls(lr)", "does not always run before this point"),  # a named rule's node too
    ("  fine:\n    diagnosis: healthy\n    fix: nothing\n", "  fine:\n    fix: nothing\n", "node 'fine': expected one of `run:`"),
    ("with: {steps: 5, lr_scale: 0.1}", "with: {steps: 5, skip_outliers_of: base}",
     "node 'lr': skip_outliers_of: 'base' must be a node that runs 'batch_scan'"),
    ("fix: lower it\n", "fix: lower it below {lr.loss_endd}\n", "has no field 'loss_endd'"),
    ("fix: clean it\n", "fix: clean batch {base.loss_end}\n", "does not always run before this point"),
    ("goto: lr\n", "goto: lr\n        answer: no\n", "branches.0.answer: Value error, expected words, found the YAML "
                                                   "boolean false: quote it"),
])
def test_errors_name_the_node_and_what_is_wrong(tmp_path, old, new, message):
    assert old in GOOD
    with pytest.raises(PlaybookError) as err:
        load_playbook(write(tmp_path, GOOD.replace(old, new, 1)))
    assert message in str(err.value)
    assert "book.yaml" in str(err.value)


def test_unreachable_nodes_are_errors_with_their_line(tmp_path):
    text = GOOD + "  orphan:\n    diagnosis: healthy\n    fix: x\n"
    with pytest.raises(PlaybookError, match=r"book.yaml:\d+: node 'orphan': cannot be reached"):
        load_playbook(write(tmp_path, text))


def test_a_yaml_syntax_error_names_the_line(tmp_path):
    with pytest.raises(PlaybookError, match=r"book.yaml:\d+: expected valid YAML"):
        load_playbook(write(tmp_path, "name: x\nnodes: [\n"))


def test_a_teams_experiments_are_imported_from_beside_the_playbook(tmp_path):
    (tmp_path / "team_checks.py").write_text(textwrap.dedent("""
        from triage import Experiment, Outcome, Params

        class NoParams(Params):
            pass

        class Count(Outcome):
            batches: int

        EXPERIMENTS = [Experiment("count_batches", "counts batches", NoParams, Count,
                                  lambda ctx, p: Count(batches=len(ctx.session.batches)))]
    """))
    path = write(tmp_path, """
        name: team
        entry: count
        imports: [team_checks]
        nodes:
          count:
            run: count_batches
            branches:
              - when: count.batches > 100
                goto: many
            otherwise: fine
          many:
            diagnosis: too_many_batches
            title: Too many batches
            fix: fewer
          fine:
            diagnosis: healthy
            fix: nothing
    """)
    with pytest.raises(PlaybookError, match="pass --trust-playbook"):
        load_playbook(path)  # imports run code: refused unless trusted
    book = load_playbook(path, trust_imports=True)
    assert book.registry.get("count_batches") is not None
    assert book.spec("many").diagnosis == "too_many_batches"


def test_every_branch_of_the_shipped_playbook_answers_its_question_in_words():
    from triage.walk.playbook.schema import DecisionNode, RunNode

    book = load_playbook()
    for node in book.graph:
        spec = book.spec(node)
        if isinstance(spec, (RunNode, DecisionNode)):
            assert spec.otherwise_answer and all(b.answer for b in spec.branches), node


def test_a_fix_quotes_what_was_measured(tmp_path):
    book = load_playbook(write(tmp_path, GOOD.replace("fix: lower it", "fix: lower it (it ended at {lr.loss_end})")))
    leaf = book.spec("too_high")
    assert leaf.fix_refs() == ["lr.loss_end"]
    assert leaf.fix_text(lambda node, field: 0.123456) == "lower it (it ended at 0.1235)"
    assert leaf.fix_text(lambda node, field: None) == "lower it (it ended at (not measured))"
