"""The report (a floor of DESIGN §6): its schema, how it is built from a walk, and how it is rendered
(HTML, JSON, Markdown). It may import every floor below it (the walk, the experiments, loading, the
foundations); only the command line imports it. Rendering never imports torch.
"""

from triage.report.model import SCHEMA_VERSION, Report
from triage.report.render import read_report, write_report

__all__ = ["SCHEMA_VERSION", "Report", "read_report", "write_report"]
