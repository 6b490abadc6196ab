"""Writing a Report as report.html, report.json and summary.md; reading report.json back.

Templates only present: they get plain data (the Report and pre-rendered SVG strings), never torch.
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pydantic

from triage.errors import ReportError
from triage.report.model import SCHEMA_VERSION, Report

_TEMPLATES = Path(__file__).parent / "templates"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        autoescape=jinja2.select_autoescape(["html", "j2"], default_for_string=True),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
    )
    env.filters["fig"] = format_figure
    return env


def format_figure(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def write_report(report: Report, out_dir: Path) -> dict[str, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"html": out_dir / "report.html", "json": out_dir / "report.json", "md": out_dir / "summary.md"}
    paths["json"].write_text(report.model_dump_json(indent=2))
    env = _environment()
    paths["html"].write_text(env.get_template("report.html.j2").render(r=report))
    md = jinja2.Environment(loader=jinja2.FileSystemLoader(_TEMPLATES), autoescape=False,
                            trim_blocks=True, lstrip_blocks=True)
    md.filters["fig"] = format_figure
    paths["md"].write_text(md.get_template("summary.md.j2").render(r=report))
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
