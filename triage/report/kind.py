"""What kind of verdict a report holds, which decides how it looks: a fix a replay verified, a fault seen
directly (no fix replayed), a likely cause (medium or low confidence), a healthy run, a symptom no tested
cause explains, or no verdict at all. Only the first two offer a fix as settled."""

from __future__ import annotations

from typing import Literal

from triage.report.model import Report
from triage.outcomes.verify import VerifiedFix
from triage.report.outcomes import outcome_of

Kind = Literal["verified", "observed", "likely", "healthy", "unexplained", "inconclusive"]

NO_VERDICT = {"inconclusive", "interrupted", "incomplete"}

HEADINGS: dict[str, tuple[str, str]] = {  # kind: (what the verdict is, what the fix box is called)
    "verified": ("Root cause", "Fix, verified by a replay"),
    "observed": ("Root cause", "Fix (the fault was seen directly; no fix replayed)"),
    "likely": ("Likely cause", "Likely fix: not verified enough to be sure"),
    "healthy": ("No fault reproduced", "What to do"),
    "unexplained": ("Symptom reproduced, cause not found", "What to try next (no fix verified)"),
    "inconclusive": ("No verdict", "What to do"),
}


def verdict_kind(report: Report) -> Kind:
    if report.status != "complete" or report.root_cause in NO_VERDICT:
        return "inconclusive"
    if report.root_cause in ("unexplained", "healthy"):
        return report.root_cause
    if report.confidence != "high":
        return "likely"
    proof = report.experiment(report.proof) if report.proof else None
    fix = outcome_of(proof, VerifiedFix)
    if proof is not None and (fix is None or fix.fix_works is not False) and proof.status == "ok":
        return "verified"
    return "observed"
