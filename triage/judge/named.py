"""The judge's symptom rules, which a playbook calls by name: `when: stalls(baseline)`.

Each rule is written in the playbook's condition language (walk/playbook/conditions.py) and is spelt out
in place when the playbook is loaded, on the nodes the call names. So a rule reads the same figures as any
condition, with the same unknowns (a figure that could not be measured leaves it unknown, and the branch
is not taken), it is type-checked at load like one (a node that does not run the right experiment, or
runs after the branch, is refused then), and the report names the clause of it that settled the branch.
A name the judge does not know, or a call with the wrong number of nodes, is refused at load too.

The thresholds are the judge's and live here, nowhere else; a team's playbook that calls a rule follows
any change to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template

# Over the baseline replay's steps (40 by default), in steps of this run:
DIVERGES_LOSS_RATIO = 1.5  # the loss ends 50% above where it started
STALL_LOSS_RATIO = 0.9  # under a 10% drop: a stall
CLEAR_STALL_LOSS_RATIO = 0.95  # under a 5% drop: clear of the stall threshold
SLOW_PACE = 0.1  # a tenth of the run's own pace before the checkpoint (pace_vs_run)
NOTHING_LEARNED = 0.9  # at 90% of the loss of learning nothing or above: nothing learned
CONVERGED = 0.1  # under a tenth of it: a converged run, nothing left to fix
LITTLE_SINCE_INIT = 0.8  # the checkpoint's loss above 80% of setup()'s fresh init's: little learned since


@dataclass(frozen=True)
class NamedRule:
    nodes: tuple[str, ...]  # what each node named in the call must be, in call order (the placeholders)
    rule: str  # condition text, a $placeholder for each node
    says: str  # the rule in words, for `triage playbook` errors and the docs (generated into docs/playbooks.md)

    def written_out(self, names: list[str]) -> str:
        return Template(self.rule).substitute(dict(zip(self.nodes, names)))


NAMED: dict[str, NamedRule] = {
    # A spike counts as divergence when it rose above the best loss so far by more than the whole starting
    # loss (minibatch noise on a healthy run rises a fraction of it) and reached a tenth of chance level and
    # of the loss of learning nothing, where they are known (a memorised run at loss 0.002 jumping to 0.006
    # is noise; a binary classifier has no ln K, but has its label entropy).
    "diverges": NamedRule(
        ("replay", "init"),
        f"not $replay.finite or $replay.loss_ratio > {DIVERGES_LOSS_RATIO} or ($replay.max_rise > 1.0 "
        "and ($init.expected_loss == none or $replay.loss_max > 0.1 * $init.expected_loss) "
        "and ($replay.nothing_level == none or $replay.loss_max > 0.1 * $replay.nothing_level))",
        "the replay's loss went non-finite, ended 50% above its start, or spiked by more than its starting "
        "loss to a tenth of chance level"),
    # Clear of the threshold (under a 5% drop), or near it (5-10%) while learning at under a tenth of the
    # run's own pace before the checkpoint; or at the loss of learning nothing however it moved. Not a
    # converged run (its loss still above a tenth of learning nothing: a memorised run flat at 0.005 has
    # nothing left to fix).
    "stalls": NamedRule(
        ("replay",),
        f"$replay.level_ratio > {NOTHING_LEARNED} or (($replay.level_ratio == none or $replay.level_ratio > "
        f"{CONVERGED}) and $replay.loss_ratio > {STALL_LOSS_RATIO} and ($replay.loss_ratio > "
        f"{CLEAR_STALL_LOSS_RATIO} or $replay.pace_vs_run < {SLOW_PACE}))",
        "the replay's loss dropped under 5% (or under 10% at a tenth of the run's own pace), or sits at the "
        "loss of learning nothing"),
    # Near the threshold and keeping up its pace (a slow run still learning, or one whose pace is unknown):
    # a verdict reached through it is medium at most (the playbook's branch says so).
    "slows_to_a_stall": NamedRule(
        ("replay",),
        f"$replay.loss_ratio > {STALL_LOSS_RATIO} and ($replay.level_ratio == none or $replay.level_ratio > "
        f"{CONVERGED})",
        "the replay's loss dropped under 10%, not yet converged"),
    "learned_nothing": NamedRule(
        ("replay",), f"$replay.level_ratio > {NOTHING_LEARNED}",
        "the replay ended at 90% or more of the loss of learning nothing (a constant prediction)"),
    # The run's own progress: its checkpoint barely below setup()'s fresh init, or the replay at the loss
    # of learning nothing. A drastic change (another init) is worth trying only then.
    "barely_trained": NamedRule(
        ("init", "replay"),
        f"$init.loss_checkpoint > {LITTLE_SINCE_INIT} * $init.loss_setup_init or $replay.level_ratio > "
        f"{NOTHING_LEARNED}",
        "the checkpoint's loss is above 80% of a fresh init's, or the replay learned nothing"),
}
