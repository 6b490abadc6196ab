"""The report: its schema, how it is built from a walk, and how it is rendered (HTML, JSON, Markdown)."""

from triage.report.model import SCHEMA_VERSION, Report
from triage.report.render import read_report, write_report

__all__ = ["SCHEMA_VERSION", "Report", "read_report", "write_report"]
