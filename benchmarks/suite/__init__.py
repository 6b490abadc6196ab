"""triage's fault-injection benchmark: generated runs, one root cause each (or healthy), every one
certified by a stock-PyTorch check before it counts.

Import with `benchmarks/` on sys.path (`import suite`). Run it with `python benchmarks/suite.py`.

    from suite import all_cases, build_case, validate, split_of
    case = build_case(all_cases()[0])
    verdict = validate(case)          # the stock check, independent of triage
    report, _ = triage.run(case.setup, case.write_checkpoint("ckpt.pt"))
"""

from suite.cases import Case, CaseSpec, all_cases, build_case, sample_for_ci, split_of
from suite.check import Figures, Validity, validate
from suite.faults import CAUSES, HEALTHY
from suite.families import FAMILY_NAMES

__all__ = ["CaseSpec", "Case", "all_cases", "build_case", "split_of", "sample_for_ci", "validate", "Validity",
           "Figures", "CAUSES", "HEALTHY", "FAMILY_NAMES"]
