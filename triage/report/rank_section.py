"""The report's per-rank section of a distributed run: where the ranks differed.

Conditions read figures reduced across ranks; this section shows them rank by rank where they were
not the same: each replay's loss on each rank's own batches, the rank that first saw a non-finite value,
the parameters whose replicas diverged and the ranks that held them apart, and every other figure
that differed. Presentation only: it reads report.json's records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from triage.report import labels
from triage.report.model import Report
from triage.outcomes.locate import LocateOutcome
from triage.outcomes.replay import ReplayOutcome
from triage.outcomes.replicas import ReplicaOutcome
from triage.report.outcomes import outcome_of

MAX_RANKS_SHOWN = 16  # columns; the rest are in report.json


@dataclass
class RankRow:
    node: str
    figure: str
    values: list[Any]  # one per rank shown


@dataclass
class RankSection:
    world_size: int
    backend: str
    wrapper: str
    batches_per_rank: int
    shown: int  # ranks with a column
    notes: list[str] = field(default_factory=list)
    rows: list[RankRow] = field(default_factory=list)


def rank_section(report: Report) -> Optional[RankSection]:
    info = report.environment.distributed
    if info is None:
        return None
    shown = min(info.world_size, MAX_RANKS_SHOWN)
    section = RankSection(world_size=info.world_size, backend=info.backend, wrapper=info.wrapper,
                          batches_per_rank=info.batches_per_rank, shown=shown)
    for run in report.experiments:
        replay, located, replicas = (outcome_of(run, ReplayOutcome), outcome_of(run, LocateOutcome),
                                     outcome_of(run, ReplicaOutcome))
        ends = (replay.rank_loss_end if replay is not None else None) or []
        if ends and len(set(map(repr, ends))) > 1:
            section.rows.append(RankRow(run.node, "end loss (own batches)", ends[:shown]))
        if replay is not None and replay.first_nonfinite_ranks:
            ranks = ", ".join(map(str, replay.first_nonfinite_ranks))
            section.notes.append(f"{run.node}: the first non-finite value appeared on rank {ranks} "
                                 f"(step {replay.first_nonfinite_step}).")
        if run.experiment == "locate_nonfinite" and located is not None and located.rank is not None:
            where = " · ".join(str(part) for part in (located.module, located.op, located.source) if part)
            section.notes.append(f"{run.node}: the non-finite value starts on rank {located.rank}"
                                 + (f" ({where})" if where else "") + ".")
        if run.experiment == "replica_sync" and replicas is not None and replicas.parameters:
            apart = ", ".join(map(str, replicas.ranks_apart or []))
            section.notes.append(f"{run.node}: {replicas.out_of_sync_count} parameter(s) out of sync "
                                 f"({replicas.first_moment}), worst {replicas.worst_parameter}"
                                 + (f"; ranks apart: {apart}" if apart else "") + ".")
        for name, values in run.per_rank.items():
            section.rows.append(RankRow(run.node, labels.words(name), values[:shown]))
    if report.stopped:
        section.notes.insert(0, f"The walk stopped: {report.stopped}.")
    return section
