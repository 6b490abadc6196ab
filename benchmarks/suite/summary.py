"""The benchmark's figures, computed from `CaseResult`s and printed as plain text tables."""

from __future__ import annotations

import re
import statistics
from collections import Counter, defaultdict
from typing import Iterable, TextIO

from suite.faults import CAUSES, HEALTHY
from suite.runner import CaseResult
from suite.symptoms import NO_LEARNING

ERROR = "(triage raised)"


def exclusion_kind(reason: str) -> str:
    """The reason an excluded case was excluded, without its figures (to count them)."""
    competitor = re.match(r"a competing fix \((.*?)\) also removes it", reason)
    if competitor:
        return f"a competing fix also removes it: {competitor.group(1)}"
    kind = re.sub(r" \(.*", "", reason).strip()
    return re.sub(r": expected .*", "", kind)


def predicted(r: CaseResult) -> str:
    return r.predicted or ERROR


def print_validity(results: list[CaseResult], out: TextIO) -> None:
    """Counts, exclusions by reason, and valid/generated per cause x family, optimizer and severity."""
    valid = [r for r in results if r.valid]
    out.write(f"generated {len(results)}, valid {len(valid)}, excluded {len(results) - len(valid)}\n")
    reasons = Counter(exclusion_kind(r.validity.reason) for r in results if not r.valid)
    for reason, n in reasons.most_common():
        out.write(f"  excluded {n:4d}: {reason}\n")
    families = sorted({r.family for r in results})
    width = max(len(c) for c in CAUSES + (HEALTHY,)) + 2
    out.write("\nvalid / generated per cause and family (sgd, adamw; mild+severe)\n")
    out.write(f"{'cause':<{width}}" + "".join(f"{f[:14]:>16}" for f in families)
              + f"{'mild':>8}{'severe':>8}{'total':>8}\n")
    for cause in CAUSES + (HEALTHY,):
        row = [r for r in results if r.expected == cause]
        if not row:
            continue
        cells = []
        for family in families:
            per = {o: [r for r in row if r.family == family and r.optimizer == o] for o in ("sgd", "adamw")}
            cells.append(" ".join(f"{sum(r.valid for r in per[o])}/{len(per[o])}" for o in ("sgd", "adamw")))
        severities = [[r for r in row if r.severity == s] for s in ("mild", "severe")]
        totals = [f"{sum(r.valid for r in group)}/{len(group)}" for group in severities + [row]]
        out.write(f"{cause:<{width}}" + "".join(f"{c:>16}" for c in cells)
                  + "".join(f"{t:>8}" for t in totals) + "\n")
    by_severity = Counter((r.severity, r.valid) for r in results)
    out.write("by severity: " + ", ".join(
        f"{s} {by_severity[(s, True)]}/{by_severity[(s, True)] + by_severity[(s, False)]}"
        for s in ("mild", "severe")) + "\n")


def print_accuracy(results: list[CaseResult], out: TextIO, title: str = "") -> None:
    """Per-cause precision and recall, confusion, top-1, false alarms, confidence levels, timings."""
    runs = [r for r in results if r.valid and r.seconds is not None]
    if title:
        out.write(f"\n=== {title} ===\n")
    if not runs:
        out.write("no valid case was triaged\n")
        return
    labels = sorted({r.expected for r in runs} | {predicted(r) for r in runs})
    width = max(len(x) for x in labels) + 2
    out.write(f"\n{'cause':<{width}}{'n':>5}{'precision':>11}{'recall':>9}\n")
    for label in labels:
        truth = [r for r in runs if r.expected == label]
        said = [r for r in runs if predicted(r) == label]
        hit = sum(predicted(r) == label for r in truth)
        precision = f"{hit / len(said):.0%}" if said else "-"
        recall = f"{hit / len(truth):.0%}" if truth else "-"
        out.write(f"{label:<{width}}{len(truth):>5}{precision:>11}{recall:>9}\n")
    out.write("\nconfusion (expected → predicted: count)\n")
    for (expected, got), n in sorted(Counter((r.expected, predicted(r)) for r in runs).items()):
        out.write(f"  {'✓' if expected == got else '✗'} {expected} → {got}: {n}\n")
    right = sum(r.expected == predicted(r) for r in runs)
    healthy = [r for r in runs if r.expected == HEALTHY]
    stuck = [r for r in runs if r.validity.symptom == NO_LEARNING]
    errors = sum(r.predicted is None for r in runs)
    out.write(f"\ntop-1 accuracy: {right}/{len(runs)} = {right / len(runs):.1%}\n")
    out.write(f"false alarms on healthy runs: {sum(predicted(r) != HEALTHY for r in healthy)}/{len(healthy)}\n")
    out.write(f"runs that learn nothing called healthy: {sum(predicted(r) == HEALTHY for r in stuck)}/{len(stuck)}\n")
    out.write(f"faults called healthy: {sum(predicted(r) == HEALTHY for r in runs if r.expected != HEALTHY)}"
              f"/{len(runs) - len(healthy)}\n")
    out.write(f"triage raised: {errors}\n")
    out.write("accuracy per confidence level:\n")
    for level in ("high", "medium", "low", None):
        group = [r for r in runs if r.confidence == level]
        if group:
            ok = sum(r.expected == predicted(r) for r in group)
            out.write(f"  {level or 'none':<7} n={len(group):4d}  right {ok / len(group):.0%}\n")
    misses = [r for r in runs if r.expected != predicted(r)]
    order = {"high": 0, "medium": 1, "low": 2}
    if misses:
        out.write("misses (high confidence first): id, truth -> verdict (confidence)\n")
        for r in sorted(misses, key=lambda r: (order.get(r.confidence, 3), r.id)):
            out.write(f"  {r.id}: {r.expected} -> {predicted(r)} ({r.confidence or 'none'})\n")
    seconds = sorted(r.seconds for r in runs)
    out.write(f"seconds per triage run: median {statistics.median(seconds):.1f}, max {seconds[-1]:.1f}, "
              f"sum {sum(seconds):.0f}\n")


def print_by_split(results: list[CaseResult], out: TextIO) -> None:
    splits = defaultdict(list)
    for r in results:
        if r.valid and r.seconds is not None:
            splits[r.split].append(r)
    for split in ("tune", "heldout", "lofo"):
        runs = splits.get(split, [])
        if runs:
            right = sum(r.expected == predicted(r) for r in runs)
            out.write(f"  {split:<8} top-1 {right}/{len(runs)} = {right / len(runs):.1%}\n")


def print_generation_times(results: Iterable[CaseResult], out: TextIO) -> None:
    fresh = sorted(r.validity.seconds for r in results if not r.validity_cached and r.validity.seconds)
    if fresh:
        out.write(f"seconds per case to generate and validate (not cached: {len(fresh)}): median "
                  f"{statistics.median(fresh):.1f}, max {fresh[-1]:.1f}, sum {sum(fresh):.0f}\n")
