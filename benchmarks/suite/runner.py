"""Running the benchmark: worker processes (spawn, one torch thread each) that each take many cases in
turn, generate and validate them (cached), and triage the valid ones in-process through `triage.run`.

A case whose generation or triage raises is recorded with its error; the run goes on.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Iterator, Optional

from pydantic import BaseModel, ConfigDict

from suite.cases import CaseSpec, build_case, split_of
from suite.check import Validity


class CaseResult(BaseModel):
    """One case of a benchmark run: its validity, and what triage said about it."""

    model_config = ConfigDict(frozen=True)

    id: str
    split: str
    expected: str
    family: str
    optimizer: str
    severity: str
    story: str = ""
    valid: bool
    validity: Validity
    validity_cached: bool = False
    predicted: Optional[str] = None     # None: excluded, or triage failed (see error)
    confidence: Optional[str] = None
    path: tuple[str, ...] = ()
    seconds: Optional[float] = None     # triage.run wall time
    error: Optional[str] = None
    report: Optional[str] = None        # the report folder, with --keep
    replayed_steps: Optional[int] = None  # optimizer steps triage took (every replay, trial and reference)


# Optimizer steps taken in this worker since it started (counted by a torch hook the worker installs).
_STEPS = [0]


def _init_worker() -> None:
    import torch

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    torch.set_num_threads(1)

    def count(optimizer, args, kwargs) -> None:
        _STEPS[0] += 1
    register_optimizer_step_pre_hook(count)
    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")


def run_case(job: tuple[str, Optional[str], Optional[str], bool, bool]) -> CaseResult:
    """Generate, validate and (when valid and asked) triage one case. Never raises."""
    case_id, cache_root, keep, with_triage, race = job
    from suite.cache import CaseCache  # imported in the worker, after torch's thread setting

    spec = CaseSpec.from_id(case_id)
    case = build_case(spec)
    base = dict(id=case_id, split=split_of(spec), expected=spec.cause, family=spec.family,
                optimizer=spec.optimizer, severity=spec.severity)
    try:
        base["story"] = case.story
        verdict, checkpoint, cached = CaseCache(Path(cache_root) if cache_root else None).validity(case)
    except Exception as exc:  # the cache could not be written, or the generator broke outside validate()
        verdict = Validity(ok=False, reason=f"generation failed: {type(exc).__name__}: {exc}")
        return CaseResult(**base, valid=False, validity=verdict)
    result = CaseResult(**base, valid=verdict.ok, validity=verdict, validity_cached=cached)
    if not verdict.ok or not with_triage:
        return result
    return result.model_copy(update=_triage(case, checkpoint, keep, race))


def _triage(case, checkpoint: Path, keep: Optional[str], race: bool = True) -> dict:
    import triage

    out = Path(keep) / case.spec.id if keep else Path(tempfile.mkdtemp(prefix="suite-report-"))
    started, steps = time.perf_counter(), _STEPS[0]
    try:
        report, _ = triage.run(case.setup, checkpoint, out=out, race=race)
        return dict(predicted=report.root_cause, confidence=report.confidence, path=tuple(report.path),
                    seconds=round(time.perf_counter() - started, 3), report=str(out) if keep else None,
                    replayed_steps=_STEPS[0] - steps)
    except Exception as exc:
        return dict(seconds=round(time.perf_counter() - started, 3),
                    error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-3)}")
    finally:
        if not keep:
            shutil.rmtree(out, ignore_errors=True)


def run_cases(specs: list[CaseSpec], workers: int = 2, cache: Optional[Path] = None, keep: Optional[Path] = None,
              with_triage: bool = True, race: bool = True) -> Iterator[CaseResult]:
    """Results as they finish (not in `specs` order). `workers` processes, spawn context."""
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the workers before they import torch
    jobs = [(s.id, str(cache) if cache else None, str(keep) if keep else None, with_triage, race) for s in specs]
    if workers <= 1:
        _init_worker()
        yield from map(run_case, jobs)
        return
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, initializer=_init_worker, maxtasksperchild=50) as pool:
        yield from pool.imap_unordered(run_case, jobs, chunksize=1)
