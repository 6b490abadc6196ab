"""Writing a Report as report.html, report.json and summary.md; reading report.json back.

Templates only present: they get the Report and plain view data (views.py, flowchart.py), never torch.
The HTML is autoescaped; the only markup passed through unescaped is SVG that plots.py generated
(matplotlib escapes the text it writes into <text>). Rendering is deterministic: the same
Report gives the same bytes, so `triage report report.json` reproduces the page.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jinja2
import pydantic

from triage.errors import ReportError
from triage.report import flowchart
from triage.report.model import SCHEMA_VERSION, Report
from triage.report.views import build_views, describe_change, format_figure, summary_views

__all__ = ["format_figure", "read_report", "render_html", "render_markdown", "write_report"]

_TEMPLATES = Path(__file__).parent / "templates"


def _environment(autoescape: bool) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        autoescape=autoescape, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(fig=format_figure, change=describe_change, md=markdown_text, code=markdown_code,
                       codeblock=markdown_block)
    return env


def render_html(report: Report) -> str:
    views = build_views(report)
    chart = flowchart.layout(report, views.anchors)
    return _environment(autoescape=True).get_template("report.html.j2").render(r=report, v=views, chart=chart)


def render_markdown(report: Report) -> str:
    views = summary_views(report)
    return _environment(autoescape=False).get_template("summary.md.j2").render(r=report, v=views)


def write_report(report: Report, out_dir: Path) -> dict[str, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"html": out_dir / "report.html", "json": out_dir / "report.json", "md": out_dir / "summary.md"}
    paths["json"].write_text(report.model_dump_json(indent=2))
    paths["html"].write_text(render_html(report))
    paths["md"].write_text(render_markdown(report))
    return paths


def read_report(path: Path) -> Report:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ReportError(f"Expected a report.json written by triage at '{path}', found it unreadable "
                          f"({exc}). Pass the report.json from a triage output folder.") from None
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != SCHEMA_VERSION:
        raise ReportError(f"Expected report schema version {SCHEMA_VERSION}, found {version!r}. "
                          "Re-run triage with this version, or render with the version that wrote it.")
    try:
        return Report.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ReportError(f"Expected '{path}' to match the report schema {SCHEMA_VERSION}, found "
                          f"{exc.error_count()} problems (first: {exc.errors()[0]['msg']} at "
                          f"{'.'.join(map(str, exc.errors()[0]['loc']))}).") from None


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]|#])")


def markdown_text(value) -> str:
    """User text inside Markdown prose or a table cell: one line, no markup, no raw HTML."""
    text = " ".join(str(value).split())
    text = _MD_SPECIAL.sub(r"\\\1", text)
    return text.replace("<", "&lt;").replace(">", "&gt;")


def markdown_code(value) -> str:
    """User text as an inline code span (literal in GitHub and Jira's Markdown), fenced past its backticks."""
    text = " ".join(str(value).split()).replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def markdown_block(value) -> str:
    """A fenced code block whose fence is longer than any backtick run inside."""
    text = str(value)
    fence = "`" * max(3, max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    return f"{fence}\n{text}\n{fence}"
