"""The fix as it was tried, in values: each setting before and after (LR 1 -> 0.1, clip none -> 1,
fp16 -> bf16, the parameters unfrozen), the training step the replays started from, and what the run
reached with the fix against without it. Read from the proof's own replay and the run it was paired
with, never from a template; pure functions of report data (no torch).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from triage.records import ExperimentRun
from triage.report.coordinates import batch_step, restarted as started_fresh
from triage.outcomes.gradient_flow import GradientFlowOutcome
from triage.outcomes.replay import ReplayOutcome
from triage.outcomes.search import LrSearchOutcome, SearchOutcome
from triage.report.outcomes import outcome_of, read_as

if TYPE_CHECKING:
    from triage.report.model import Report

Value = Union[bool, int, float, str, list[str], None]


class SettingChange(BaseModel):
    """One setting the fix changed: what the run had, what the replay that trained used."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")

    setting: str = Field(description="The setting in words: 'learning rate', 'gradient clip', 'precision', ...")
    key: str = Field(description="A stable id of the setting: lr, clip, precision, init, unfreeze, skip_batches, "
                                 "weight_decay, unsquash, revive_dead, swap_saturating, loop.")
    before: Value = Field(description="The run's value (None: the setting was off, e.g. no clipping).")
    after: Value = Field(description="The value the fix's replay used.")
    run_steps: Optional[list[int]] = Field(
        default=None, description="skip_batches: the training step of each skipped batch as the run counted it "
                                  "(a capture's record, else the checkpoint's step + 1 + its index; schema 1.8).")

    def words(self) -> str:
        """`learning rate 1 → 0.1`: the setting, the run's value, the fix's."""
        return f"{self.setting} {show(self.before)} → {self.shown_after()}"

    def shown_after(self) -> str:
        """The fix's value; skipped batches with the run's steps: `5 (step 11 of the run)`."""
        if self.run_steps and isinstance(self.after, list):
            at = ", ".join(map(str, self.run_steps[:4])) + (" …" if len(self.run_steps) > 4 else "")
            return f"{show(self.after)} (step{'s' if len(self.run_steps) > 1 else ''} {at} of the run)"
        return show(self.after)


class FixTrial(BaseModel):
    """The proof's replay in values: what it changed, from where, and what the run reached with it and
    without it (the run as it was, replayed over the same steps)."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")

    node: str = Field(description="The proof's node: the replay that applied the fix.")
    against: Optional[str] = Field(default=None, description="The node of the run as it was, replayed.")
    changes: list[SettingChange] = Field(default_factory=list)
    from_step: Optional[int] = Field(
        default=None, description="The training step the replays started after, as the run counted it (the "
                                  "checkpoint's step); 0 for a restart from a fresh initialisation.")
    restarted: bool = Field(default=False, description="The fix's replay restarted from a fresh initialisation "
                                                       "instead of the checkpoint's weights.")
    steps: Optional[int] = Field(default=None, description="Steps the fix's replay ran.")
    loss_with_fix: Optional[float] = Field(default=None, description="The fix's end-window loss.")
    loss_without_fix: Optional[float] = Field(
        default=None, description="The run as it was over the same steps: its end-window loss (inf: not finite).")
    without_nonfinite_step: Optional[int] = Field(
        default=None, description="The training step (the run's count) where the run as it was went non-finite.")
    neighbours_with_fix: Optional[float] = Field(
        default=None, description="Where the labels name groups (metric learning): the validation examples' "
                                  "nearest-neighbour label agreement with the fix at its end (schema 1.9).")
    neighbours_without_fix: Optional[float] = Field(
        default=None, description="The same agreement of the run as it was over the same steps (schema 1.9).")
    fix_works: Optional[bool] = Field(default=None, description="The replay's own verdict on the fix.")

    def to_step(self) -> Optional[int]:
        return self.from_step + self.steps if self.from_step is not None and self.steps else None

    def sentence(self) -> str:
        """`learning rate 1 -> 0.1, tried from step 3 for 40 steps: loss 0.1038 with the fix, 2.357 without`."""
        changed = "; ".join(c.words() for c in self.changes) or "the fix"
        where = ("restarted from a fresh initialisation" if self.restarted
                 else f"tried from step {self.from_step}" if self.from_step is not None else "tried")
        span = f" to step {self.to_step()}" if self.to_step() is not None and not self.restarted \
            else f" for {self.steps} steps" if self.steps else ""
        return f"{changed}, {where}{span}: {self.reached()}"

    def reached(self) -> str:
        with_fix = f"loss {show(self.loss_with_fix)} with the fix" if self.loss_with_fix is not None \
            else "nothing measured with the fix"
        if self.without_nonfinite_step is not None:
            return f"{with_fix}; without it the loss went non-finite at step {self.without_nonfinite_step}"
        if self.loss_without_fix is None:
            return with_fix
        if not math.isfinite(self.loss_without_fix):
            return f"{with_fix}; without it the loss did not stay finite"
        return f"{with_fix}, {show(self.loss_without_fix)} without it" + self._neighbours()

    def _neighbours(self) -> str:
        if self.neighbours_with_fix is None or self.neighbours_without_fix is None:
            return ""
        return (f"; validation examples whose nearest neighbour shares their label {self.neighbours_with_fix:.1%} "
                f"with the fix, {self.neighbours_without_fix:.1%} without it")


def show(value: Value) -> str:
    """A setting's value as a person reads it: 4 significant digits, `none` for off, names joined."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.4g}"
    if isinstance(value, list):
        shown = ", ".join(map(str, value[:4]))
        return (shown + f" (+{len(value) - 4} more)" if len(value) > 4 else shown) or "none"
    return str(value)


def fix_trial(proof: Optional[ExperimentRun], reference: Optional[ExperimentRun], experiments: list[ExperimentRun],
              checkpoint_step: Optional[int], run_precision: str, batch_steps: Optional[list[int]] = None,
              run_weight_decay: Optional[float] = None) -> Optional[FixTrial]:
    """The proof's replay in values; None where there is no proof replay with a loss to show."""
    if proof is None or proof.status != "ok" or not proof.outcome:
        return None
    nothing = read_as(ReplayOutcome, {})  # a proof or reference that is no replay: nothing of one to read
    out = outcome_of(proof, ReplayOutcome) or nothing
    params = proof.params
    paired = reference is not None and reference.node != proof.node and bool(reference.outcome)
    ref = (outcome_of(reference, ReplayOutcome) or nothing) if paired else None
    ref_params = reference.params if ref is not None and reference is not None else {}
    restarted = started_fresh(proof)
    changes = _changes(proof, out, ref or nothing, paired, ref_params, experiments, run_precision,
                       lambda i: batch_step(i, checkpoint_step, batch_steps)[0], run_weight_decay)
    if not changes and ref is None:
        return None
    step0 = 0 if restarted else checkpoint_step
    bad = ref.first_nonfinite_step if ref is not None else None
    ref_step0 = (0 if started_fresh(reference) else checkpoint_step) if ref is not None else None
    return FixTrial(
        node=proof.node, against=reference.node if ref is not None else None, changes=changes,
        from_step=step0, restarted=restarted, steps=_int(out.steps_run),
        loss_with_fix=_float(out.loss_end),
        loss_without_fix=_float(out.reference_end) if out.reference_end is not None
        else _float(ref.loss_end if ref is not None else None),
        # The run's count where the reference's start is known (a restart counts from 0); else no step is claimed.
        without_nonfinite_step=ref_step0 + 1 + bad if isinstance(bad, int) and ref_step0 is not None
        and ref is not None and ref.finite is False else None,
        neighbours_with_fix=_float(out.fix_val_neighbours), neighbours_without_fix=_float(out.reference_val_neighbours),
        fix_works=out.fix_works if isinstance(out.fix_works, bool) else None)


def _changes(proof: ExperimentRun, out: ReplayOutcome, ref: ReplayOutcome, paired: bool, ref_params: dict[str, Any],
             experiments: list[ExperimentRun], run_precision: str, step_of: Callable[[int], Optional[int]],
             run_weight_decay: Optional[float]) -> list[SettingChange]:
    """`out`, `ref`: the fix's replay and the run as it was (`paired`: there is one with an outcome)."""
    params, changes = proof.params, []
    search, lr_search = outcome_of(proof, SearchOutcome), outcome_of(proof, LrSearchOutcome)
    lr_before, lr_after = _first(ref.lrs), _first(out.lrs)
    if lr_before is not None and lr_after is not None and not _close(lr_before, lr_after):
        owner = (lr_search.lr_owner if lr_search is not None else None) or params.get("lr_of")
        factor = _float(lr_search.lr_factor if lr_search is not None else None)
        if owner and factor:  # the run as it was logs another optimizer's LR first: the owner's was after / factor
            lr_before = lr_after / factor
        changes.append(SettingChange(setting=f"learning rate of '{owner}'" if owner else "learning rate", key="lr",
                                     before=lr_before, after=lr_after))
    clip_before, clip_after = _float(ref.clip_threshold), _float(out.clip_threshold)
    if paired and (clip_before is None) != (clip_after is None) or (
            clip_before is not None and clip_after is not None and not _close(clip_before, clip_after)):
        changes.append(SettingChange(setting="gradient clip", key="clip", before=clip_before, after=clip_after))
    if params.get("precision") and params["precision"] != (ref_params.get("precision") or run_precision):
        changes.append(SettingChange(setting="precision", key="precision",
                                     before=ref_params.get("precision") or run_precision, after=params["precision"]))
    chosen = (search.chosen if search is not None else None) or ""
    init = chosen.removeprefix("init=") if chosen.startswith("init=") else params.get("init", "checkpoint")
    if init != ref_params.get("init", "checkpoint"):
        changes.append(SettingChange(setting="initial weights", key="init",
                                     before=_INITS.get(ref_params.get("init", "checkpoint"), "as the run"),
                                     after=_INITS.get(init, init)))
    if params.get("unfreeze") and not ref_params.get("unfreeze"):
        changes.append(SettingChange(setting="trained parameters", key="unfreeze", before="as the run",
                                     after=_frozen(experiments) or "every parameter"))
    skipped = [str(i) for i in out.skipped or []]
    if skipped and skipped != [str(i) for i in ref.skipped or []]:
        steps = [step_of(int(i)) for i in skipped]
        changes.append(SettingChange(setting="snapshot batches skipped", key="skip_batches", before=None,
                                     after=skipped, run_steps=steps if all(s is not None for s in steps) else None))
    wd = params.get("wd_scale")
    if isinstance(wd, (int, float)) and wd != ref_params.get("wd_scale", 1.0):
        # The run's weight decay (its largest param group's, as setup.weight_decay reads it) and the fix's.
        base = ref_params.get("wd_scale", 1.0)
        if run_weight_decay is not None and isinstance(base, (int, float)):
            changes.append(SettingChange(setting="weight decay", key="weight_decay",
                                         before=run_weight_decay * base, after=run_weight_decay * wd))
        else:
            changes.append(SettingChange(setting="weight decay", key="weight_decay", before="as the run",
                                         after=f"x{show(float(wd))} of the run's"))
    for key, setting, after in (("unsquash", "output", "raw scores (squashing undone)"),
                                ("revive_dead", "dead units", "re-initialised"),
                                ("swap_saturating", "sigmoid/tanh", "ReLU"),
                                ("hold_peak_of", "learning-rate schedule", "held at its peak")):
        if params.get(key) and not ref_params.get(key):
            changes.append(SettingChange(setting=setting, key=key, before="as the run", after=after))
    if params.get("loop") != ref_params.get("loop", params.get("loop")) and out.loop_used != ref.loop_used:
        changes.append(SettingChange(setting="training step", key="loop", before=_LOOPS.get(ref.loop_used),
                                     after=_LOOPS.get(out.loop_used)))
    return changes


_LOOPS = {"user": "your train_step", "reference": "zero_grad, forward, backward, step"}
_INITS = {"checkpoint": "the checkpoint's weights", "setup": "setup()'s own init, redrawn", "default": "PyTorch's default init",
          "kaiming": "Kaiming init", "xavier": "Xavier init", "scaled": "scaled init"}


def _frozen(experiments: list[ExperimentRun]) -> list[str]:
    """The parameters the gradient-flow check found frozen or left out of the optimizer."""
    for run in experiments:
        flow = outcome_of(run, GradientFlowOutcome)
        names = [n for group in ((flow.frozen, flow.not_in_optimizer) if flow is not None else ()) for n in group or []]
        if names:
            return list(dict.fromkeys(names))
    return []


def _first(values: Any) -> Optional[float]:
    return _float(values[0]) if isinstance(values, list) and values else None


def _float(value: Any) -> Optional[float]:
    if isinstance(value, bool) or value is None:
        return None
    if value in ("Infinity", "-Infinity", "NaN"):
        return float(value.replace("Infinity", "inf"))
    return float(value) if isinstance(value, (int, float)) else None


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def reference_of(experiments: list[ExperimentRun], run: ExperimentRun) -> Optional[ExperimentRun]:
    """The run `run` is verified against (its `against` parameter), else the first run of the same
    experiment from the checkpoint (the baseline); as report/views.py pairs them."""
    against = run.params.get("against")
    paired = next((r for r in experiments if isinstance(against, str) and r.node == against), None)
    return paired or next((r for r in experiments if r.experiment == run.experiment
                           and r.params.get("init", "checkpoint") == "checkpoint"), None)


def tried(report: "Report", run_weight_decay: Optional[float] = None) -> Optional[FixTrial]:
    """The report's proof replay in values: as report.json carries it, else (a report of schema 1.6 or
    before) worked out from its experiments. `run_weight_decay`: the run's (setup.weight_decay), where the
    caller knows it; else as a decision on the path read it."""
    if report.fix_trial is not None:
        return report.fix_trial
    proof = report.experiment(report.proof) if report.proof else None
    if proof is None:
        return None
    return fix_trial(proof, reference_of(report.experiments, proof), report.experiments, report.checkpoint.step,
                     report.environment.precision, report.checkpoint.batch_steps,
                     run_weight_decay if run_weight_decay is not None else _read_weight_decay(report))


def _read_weight_decay(report: "Report") -> Optional[float]:
    """setup.weight_decay as a decision on the path recorded it (a condition that read it)."""
    for decision in report.decisions:
        value = _float(decision.figures.get("setup.weight_decay"))
        if value is not None:
            return value
    return None
