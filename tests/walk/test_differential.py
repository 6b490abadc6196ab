"""Differential diagnosis in the playbook: candidates tried from the same snapshot, the winner by tier then
score, the confidence it earns, and the errors a malformed differential node gets when it loads."""

import textwrap
from typing import Optional

import pytest
from pydantic import Field

from tests.tiny import mlp_setup
from triage.walk.engine import walk
from triage.errors import PlaybookError
from triage.experiments import Experiment, NotApplicable, Outcome, Params, default_registry
from triage.walk.playbook import load_playbook
from triage.load.session import session_from_factory
from triage.report import write_report
from triage.report.build import build_report


class FakeParams(Params):
    works: bool = False
    end: float = 1.0
    fails: str = ""  # "raise": the experiment raises; "not_applicable": it cannot run in this setup
    lr_factor: float = 1.0
    lr: Optional[float] = None  # the LR the factor trains at
    kind: Optional[str] = None  # of this optimizer class


class FakeOutcome(Outcome):
    fix_works: bool
    loss_end: float = Field(description="what the fake 'replay' ended at")
    lr_factor: float = 1.0
    least_working_lr: Optional[float] = None
    optimizer_kind: Optional[str] = None


def fake(ctx, p):
    if p.fails == "raise":
        raise RuntimeError("the scheduler has no lambda for the new param group")
    if p.fails == "not_applicable":
        raise NotApplicable("the run's loop has no optimizer to add the parameters to")
    return FakeOutcome(fix_works=p.works, loss_end=p.end, lr_factor=p.lr_factor, least_working_lr=p.lr,
                       optimizer_kind=p.kind)


def registry():
    r = default_registry()
    r.register(Experiment("fake_fix", "a candidate whose figures the test sets", FakeParams, FakeOutcome, fake))
    return r


LEAVES = {
    "high_lr": "diagnosis: lr_too_high\n  confidence: high\n  fix: lower it",
    "exploding": "diagnosis: exploding_gradients\n  confidence: high\n  fix: clip",
    "precision": "diagnosis: fp16_overflow\n  confidence: medium\n  fix: bf16",
}


def book(tmp_path, candidates: str, extra_nodes: str = "") -> str:
    """A playbook whose entry goes straight to a differential node `which` with these candidates; the
    leaves they name are added (an unreachable leaf would be an error)."""
    used = {leaf: body for leaf, body in LEAVES.items() if leaf in candidates + extra_nodes}
    leaves = "".join(f"  {leaf}:\n" + "".join(f"    {line.strip()}\n" for line in body.splitlines())
                     for leaf, body in used.items())
    text = textwrap.dedent("""
        name: t
        entry: start
        nodes:
          start:
            decide: Go straight to the candidates
            branches:
              - when: setup.batch_count > 0
                goto: which
            otherwise: none_works
          which:
            title: Which fix works?
            differential:
        {candidates}
            otherwise: none_works
          none_works:
            diagnosis: unexplained
            title: Nothing works
            fix: look elsewhere
    """).format(candidates=textwrap.indent(textwrap.dedent(candidates), " " * 6))
    path = tmp_path / "d.yaml"
    path.write_text(text + leaves + extra_nodes)
    return path


def diagnose(tmp_path, candidates):
    result = walk(session_from_factory(mlp_setup), load_playbook(book(tmp_path, candidates), registry()))
    return result, result.decisions[-1]


def test_the_lowest_tier_that_works_wins_even_when_a_general_fix_ends_lower(tmp_path):
    result, decision = diagnose(tmp_path, """
        lower: {run: fake_fix, with: {works: true, end: 0.1}, then: high_lr, tier: 2}
        bf16: {run: fake_fix, with: {works: true, end: 0.5}, then: precision, tier: 1}
    """)
    assert result.leaf.diagnosis == "fp16_overflow"
    assert [c.id for c in decision.candidates if c.winner] == ["bf16"]
    # the general fix masking the specific one is expected: the differential stays high, but the
    # leaf claims no more than its own medium
    assert decision.confidence == "high" and result.confidence == "medium"


def test_within_a_tier_the_best_score_wins_and_a_clearly_worse_rival_leaves_it_high(tmp_path):
    result, decision = diagnose(tmp_path, """
        lower: {run: fake_fix, with: {works: true, end: 0.2}, then: high_lr, tier: 2}
        clip: {run: fake_fix, with: {works: true, end: 0.6}, then: exploding, tier: 2}
    """)
    assert result.leaf.diagnosis == "lr_too_high"
    assert decision.confidence == "high" and result.confidence == "high"
    assert not any(c.also_works for c in decision.candidates)


def test_a_rival_that_works_about_as_well_makes_it_medium(tmp_path):
    result, decision = diagnose(tmp_path, """
        lower: {run: fake_fix, with: {works: true, end: 0.20}, then: high_lr, tier: 2}
        clip: {run: fake_fix, with: {works: true, end: 0.22}, then: exploding, tier: 2}
    """)
    assert result.leaf.diagnosis == "lr_too_high" and result.confidence == "medium"
    assert [c.id for c in decision.candidates if c.also_works] == ["clip"]


def test_a_measured_abnormality_lifts_its_candidate_to_tier_1(tmp_path):
    candidates = """
        lower: {run: fake_fix, with: {works: true, end: 0.1}, then: high_lr, tier: 2}
        clip: {run: fake_fix, with: {works: true, end: 0.5}, then: exploding, tier: 2, measured: %s}
    """
    result, decision = diagnose(tmp_path, candidates % "setup.batch_count > 0")
    assert result.leaf.diagnosis == "exploding_gradients"
    assert {c.id: (c.tier, c.measured) for c in decision.candidates} == {"lower": (2, None), "clip": (1, True)}
    result, _ = diagnose(tmp_path, candidates % "setup.batch_count > 1000")
    assert result.leaf.diagnosis == "lr_too_high"


def test_a_drastic_change_that_wins_with_nothing_measured_claims_no_more_than_its_confidence(tmp_path):
    """A restart from a 10x smaller init "fixed" a 300M LM whose LR (1e-3) was too high for it, at high: its
    LR trials had not learned in 40 steps. Tier 3 with `confidence: medium` wins at medium, unless the
    abnormality it repairs was measured."""
    candidates = """
        lower: {run: fake_fix, with: {works: false, end: 0.9}, then: high_lr, tier: 2}
        reinit: {run: fake_fix, with: {works: true, end: 0.2}, then: exploding, tier: 3, confidence: medium,
                 measured: %s}
    """
    result, decision = diagnose(tmp_path, candidates % "setup.batch_count > 1000")
    assert result.leaf.diagnosis == "exploding_gradients"
    assert decision.confidence == "medium" and result.confidence == "medium"
    result, decision = diagnose(tmp_path, candidates % "setup.batch_count > 0")  # measured: tier 1, no cap
    assert decision.confidence == "high" and result.confidence == "high"


@pytest.mark.parametrize("factor, confidence", [(1000, "high"), (1e-3, "high"), (1e4, "medium"), (1e-5, "medium")])
def test_a_fix_over_three_orders_of_magnitude_from_the_runs_lr_claims_medium_at_most(tmp_path, factor, confidence):
    """An LBFGS closure without zero_grad() "trained" at lr x1e-5 in the real-programs benchmark's first blind
    run (pinn_lbfgs): the step was scaled by the loop, not by a mistyped LR. A x1000 slip is a common one."""
    result, decision = diagnose(tmp_path, f"""
        lower: {{run: fake_fix, with: {{works: true, end: 0.2, lr_factor: {factor}}}, then: high_lr, tier: 2}}
    """)
    assert result.leaf.diagnosis == "lr_too_high" and result.confidence == confidence
    winner = next(c for c in decision.candidates if c.winner)
    assert (winner.cap_reason is not None) == (confidence == "medium")


@pytest.mark.parametrize("lr, confidence", [(1.0, "high"), (1000.0, "medium")])
def test_a_fix_past_the_lrs_its_optimizer_is_run_at_claims_medium_at_most(tmp_path, lr, confidence):
    """An L-BFGS run at lr 1 that "trained" at x1000 in the real-programs benchmark (pinn_lbfgs): its closure
    summed the gradients of the line search's calls. x1000 is inside the grid, lr 1000 is not an L-BFGS LR.
    The ticket and the page say why a fix that works is not "high"."""
    session = session_from_factory(mlp_setup)
    playbook = load_playbook(book(tmp_path, f"""
        lower: {{run: fake_fix, with: {{works: true, end: 0.2, lr_factor: 1000, lr: {lr}, kind: LBFGS}},
                 then: high_lr, tier: 2}}
    """), registry())
    result = walk(session, playbook)
    assert result.confidence == confidence
    winner = next(c for c in result.decisions[-1].candidates if c.winner)
    assert (winner.cap_reason is not None and "usually run at" in winner.cap_reason) == (confidence == "medium")
    write_report(build_report(result, session, playbook, "triage run", None), tmp_path / "out")
    said = "Why not high:** the LR that trained, 1000 (x1000 the run's own), is above the LRs LBFGS"
    assert (said in (tmp_path / "out" / "summary.md").read_text()) == (confidence == "medium")
    assert ("<b>Why not high:</b>" in (tmp_path / "out" / "report.html").read_text()) == (confidence == "medium")


def test_a_candidate_of_a_higher_tier_than_a_working_fix_is_not_run(tmp_path):
    """It could neither win nor come close (both need the winner's tier): it is recorded as outranked,
    with no run; a rival of the winner's own tier still runs, and so does a failing lower tier's."""
    result, decision = diagnose(tmp_path, """
        lower: {run: fake_fix, with: {works: true, end: 0.2}, then: high_lr, tier: 2}
        clip: {run: fake_fix, with: {works: true, end: 0.21}, then: exploding, tier: 2}
        reinit: {run: fake_fix, with: {works: true, end: 0.01}, then: precision, tier: 3}
        bf16: {run: fake_fix, with: {works: false, end: 0.5}, then: precision, tier: 1}
    """)
    assert result.leaf.diagnosis == "lr_too_high" and decision.confidence == "medium"  # clip came close
    state = {c.id: (c.tried, c.outranked) for c in decision.candidates}
    assert state == {"lower": (True, False), "clip": (True, False), "reinit": (False, True), "bf16": (True, False)}
    assert "reinit" not in result.runs and {"lower", "clip", "bf16"} <= set(result.runs)


def test_a_higher_tier_candidate_a_later_one_reads_still_runs(tmp_path):
    """Outranking it would leave the later candidate's condition reading nothing."""
    result, decision = diagnose(tmp_path, """
        lower: {run: fake_fix, with: {works: true, end: 0.2}, then: high_lr, tier: 2}
        reinit: {run: fake_fix, with: {works: false, end: 0.7}, then: precision, tier: 3}
        clip: {run: fake_fix, with: {works: true, end: 0.9}, then: exploding, tier: 2, if: reinit.loss_end > 0.5}
    """)
    assert {c.id: (c.tried, c.outranked) for c in decision.candidates} == {
        "lower": (True, False), "reinit": (True, False), "clip": (True, False)}
    assert result.leaf.diagnosis == "lr_too_high"


def test_a_higher_tier_runs_while_no_lower_fix_works_and_can_then_win(tmp_path):
    result, decision = diagnose(tmp_path, """
        lower: {run: fake_fix, with: {works: false, end: 0.9}, then: high_lr, tier: 2}
        reinit: {run: fake_fix, with: {works: true, end: 0.3}, then: exploding, tier: 3}
    """)
    assert result.leaf.diagnosis == "exploding_gradients"
    assert not any(c.outranked for c in decision.candidates)


def test_no_working_fix_goes_otherwise_with_low_confidence(tmp_path):
    result, decision = diagnose(tmp_path, """
        lower: {run: fake_fix, with: {works: false, end: 0.1}, then: high_lr, tier: 2}
    """)
    assert result.leaf.diagnosis == "unexplained" and decision.confidence == "low"
    assert decision.candidates[0].tried and decision.candidates[0].works is False


def test_a_candidate_whose_if_fails_is_not_tried_and_a_control_never_wins(tmp_path):
    result, decision = diagnose(tmp_path, """
        control: {run: fake_fix, with: {works: true, end: 0.01}}
        bf16: {run: fake_fix, with: {works: true, end: 0.1}, then: precision, if: setup.precision == "fp16"}
        lower: {run: fake_fix, with: {works: true, end: 0.3}, then: high_lr, tier: 2}
    """)
    assert result.leaf.diagnosis == "lr_too_high"
    tried = {c.id: c.tried for c in decision.candidates}
    assert tried == {"control": False, "bf16": False, "lower": True}
    assert "bf16" not in result.runs and "control" not in result.runs  # no candidate reads the control


def test_a_control_runs_only_once_a_candidate_that_reads_it_is_about_to_run(tmp_path):
    reads = """
        control: {run: fake_fix, with: {end: 0.4}}
        lower: {run: fake_fix, with: {works: true, end: 0.3}, then: high_lr, if: control.loss_end < 0.5}
    """
    result, decision = diagnose(tmp_path, reads)
    assert list(result.runs) == ["control", "lower"] and result.leaf.diagnosis == "lr_too_high"
    assert {c.id: (c.tried, c.unneeded) for c in decision.candidates} == {"control": (True, False),
                                                                         "lower": (True, False)}
    result, decision = diagnose(tmp_path, reads.replace("if: control.loss_end < 0.5", "if: setup.batch_count < 0"))
    assert "control" not in result.runs and decision.candidates[0].unneeded


@pytest.mark.parametrize("candidates, message", [
    ("lower: {run: fake_fix, then: nowhere}", "goes to 'nowhere', which is not a node"),
    ("start: {run: fake_fix, then: high_lr}", "candidate id 'start' is already used"),
    ("lower: {run: fake_fix, with: {wrks: true}, then: high_lr}", "parameters of 'fake_fix' are wrong"),
    ("lower: {run: fake_fix, then: high_lr, if: clip.fix_works}\n"
     "clip: {run: fake_fix, then: exploding}", "candidate 'lower': 'clip.fix_works' reads 'clip', which does not always run before"),
    ("control: {run: fake_fix}", "found only controls"),
    ("lower: {run: replay, with: {steps: 2}, then: high_lr}\n"
     "odd: {run: data_check, then: exploding}", "whose outcome has no field 'fix_works'"),
])
def test_a_malformed_differential_names_the_candidate_and_what_is_wrong(tmp_path, candidates, message):
    with pytest.raises(PlaybookError, match=message):
        load_playbook(book(tmp_path, candidates), registry())


def test_later_nodes_may_read_a_candidates_figures(tmp_path):
    after = """
      check:
        decide: Did the control end low?
        branches:
          - when: control.loss_end < 0.5
            goto: high_lr
        otherwise: exploding
    """
    path = book(tmp_path, """
        control: {run: fake_fix, with: {end: 0.1}}
        lower: {run: fake_fix, then: high_lr}
    """, extra_nodes=textwrap.indent(textwrap.dedent(after), "  "))
    path.write_text(path.read_text().replace("otherwise: none_works\n  none_works", "otherwise: check\n  none_works"))
    result = walk(session_from_factory(mlp_setup), load_playbook(path, registry()))
    assert result.path[-2:] == ["check", "high_lr"]


def test_a_candidate_that_raised_is_not_ruled_out_and_the_winner_is_not_high(tmp_path):
    """A fix that could not be measured might have been the better one: the winner stays medium, and the
    differential's reason names the candidate as not measured rather than as a fix that does not work."""
    from triage.report.differential import reason

    result, decision = diagnose(tmp_path, """
        unfreeze: {run: fake_fix, with: {fails: raise}, then: precision, tier: 1}
        lower: {run: fake_fix, with: {works: true, end: 0.2}, then: high_lr, tier: 2}
    """)
    assert result.leaf.diagnosis == "lr_too_high" and decision.confidence == "medium"
    assert result.confidence == "medium"
    unfreeze = next(c for c in decision.candidates if c.id == "unfreeze")
    assert (unfreeze.tried, unfreeze.status, unfreeze.works) == (True, "error", None)
    assert "not measured to the end" in reason(decision, {}).lower() and "unfreeze (error)" in reason(decision, {})


def test_a_candidate_that_does_not_apply_is_not_tried_and_says_why(tmp_path):
    result, decision = diagnose(tmp_path, """
        unfreeze: {run: fake_fix, with: {fails: not_applicable}, then: precision, tier: 1}
        lower: {run: fake_fix, with: {works: true, end: 0.2}, then: high_lr, tier: 2}
    """)
    unfreeze = next(c for c in decision.candidates if c.id == "unfreeze")
    assert (unfreeze.tried, unfreeze.status) == (False, "not_applicable")
    assert result.runs["unfreeze"].status == "not_applicable"
    assert "no optimizer to add the parameters to" in result.runs["unfreeze"].error
    assert result.leaf.diagnosis == "lr_too_high" and decision.confidence == "medium"


def test_a_playbook_that_sets_its_own_bar_for_a_fix_says_so_in_the_report(tmp_path):
    """A team may loosen "clearly better" on purpose (`margin: 0.95`, `close: 0.9`): the verdict then follows
    its rule, and the report names each bar moved, the judge's own value and the nodes that used it."""
    session = session_from_factory(mlp_setup)
    candidates = """
        asis: {run: replay}
        lower: {run: replay, with: {lr_scale: 0.1, %s against: asis}, then: high_lr, tier: 2}
    """

    def overridden(candidates: str, close: str = "") -> list[str]:
        path = book(tmp_path, candidates)
        path.write_text(path.read_text().replace("    otherwise: none_works\n  none_works:",
                                                 f"{close}    otherwise: none_works\n  none_works:"))
        playbook = load_playbook(path)
        report = build_report(walk(session, playbook), session, playbook, "triage run", None)
        return [f.text for f in report.findings if f.id == "judge_overridden"]

    assert overridden(candidates % "") == []
    assert overridden(candidates % "margin: 0.8,") == []  # the judge's own value, written out: nothing moved
    found = overridden(candidates % "margin: 0.95,", close="    close: 0.9\n")
    assert len(found) == 1 and "margin 0.95 (the judge's 0.8) at lower; close 0.9 (the judge's 0.8) at which" in found[0]


def test_the_experiment_measures_and_the_walk_judges(tmp_path):
    """A replay paired with the run measures both (its end, the run's over the same steps, the levels) and
    says nothing of whether its fix works: the walk asks the judge, with the bars the node sets."""
    from triage.experiments.replay import REPLAY, ReplayParams
    from triage.experiments.verify import judged
    from tests.tiny import context

    ctx = context(lambda: mlp_setup(lr=5.0))
    ctx.outcomes["asis"] = REPLAY.measure(ctx, ReplayParams(steps=40))
    ctx.restart()
    measured = REPLAY.measure(ctx, ReplayParams(steps=40, lr_scale=0.01, against="asis"))
    assert measured.reference_end is not None and measured.levels is not None and measured.fix_works is None
    assert judged(measured)["fix_works"] and not judged(measured, margin=1e-6)["fix_works"]

    session = session_from_factory(lambda: mlp_setup(lr=5.0))
    for margin, works in ((0.8, True), (1e-6, False)):
        result = walk(session, load_playbook(book(tmp_path, f"""
            asis: {{run: replay}}
            lower: {{run: replay, with: {{lr_scale: 0.01, margin: {margin}, against: asis}}, then: high_lr, tier: 2}}
        """), registry()))
        assert result.outcomes["lower"].fix_works is works
        assert result.runs["lower"].outcome["fix_works"] is works  # report.json holds the judge's reading too
