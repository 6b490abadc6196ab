"""Writing a Report as report.html, report.json and summary.md; reading report.json back.

Templates only present: they get the Report and plain view data (views.py, flowchart.py), never torch.
The HTML is autoescaped; the only markup passed through unescaped is SVG that plots.py generated
(matplotlib escapes the text it writes into <text>). Rendering is deterministic: the same
Report gives the same bytes, so `triage report report.json` reproduces the page.
"""

from __future__ import annotations

import html
import json
import logging
import os
import re
from pathlib import Path
from typing import Optional

import jinja2
import pydantic

from triage import atomic, user_cache
from triage.errors import ReportError
from triage.report import flowchart
from triage.report.model import SCHEMA_VERSION, Report
from triage.report.sections import build_views, summary_views
from triage.report.fix_trial import show as show_setting
from triage.report.labels import condition_words
from triage.report.words import describe_change, format_figure

__all__ = ["format_figure", "neutralise_bidi", "read_report", "render_html", "render_markdown", "write_report"]

log = logging.getLogger(__name__)

MAX_REPORT_BYTES = 256 * 2**20  # `triage report` reads report.json whole: a report is a few MiB at most
# 1.2 added `status` and `Decision.errors`; 1.3 `views`, `Decision.held`, the Location's module type and the
# layer before it, and source lines as records. All are defaulted: an older report renders without its
# plots (it carries no views) and names every figure a decision read. 1.4 keeps one record of the clauses
# that settled a branch (`Decision.settled`) where 1.3 had two (`held`, `deciding`); a 1.3 one is read as 1.4.
# 1.5 adds `CandidateResult.outranked` (a candidate not run because a fix of a lower tier worked).
# 1.6 adds the status `not_applicable` (an experiment that cannot run in this setup, its reason in `error`) and
# `CandidateResult.status` (how a candidate's experiment ended), and `CheckpointInfo.step_source` (where the step
# was read; optional).
# 1.7 adds `fix_trial` (the proof's replay in values: settings before and after, from which step, the loss with the
# fix and without; optional: a 1.6 report is drawn with it worked out from its experiments).
READABLE_VERSIONS = ("1.1", "1.2", "1.3", "1.4", "1.5", "1.6", "1.7", SCHEMA_VERSION)

_TEMPLATES = Path(__file__).parent / "templates"


def _environment(autoescape: bool) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        autoescape=autoescape, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
        keep_trailing_newline=True, bytecode_cache=_compiled_templates(),
    )
    env.filters.update(fig=format_figure, change=describe_change, md=markdown_text, code=markdown_code,
                       codeblock=markdown_block, said=condition_words, setting=show_setting)
    return env


def _compiled_templates() -> Optional[jinja2.BytecodeCache]:
    """Templates compiled once and kept (compiling them is a third of a re-render); keyed by jinja2 on
    each template's source, so an edited template is compiled again."""
    folder = user_cache.root() / "templates"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return _QuietBytecodeCache(str(folder)) if os.access(folder, os.W_OK) else None


class _QuietBytecodeCache(jinja2.FileSystemBytecodeCache):
    """The compiled templates, kept where there is room: a full or broken cache costs a compile, never the page."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except (OSError, EOFError, ValueError):
            bucket.reset()

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except OSError as exc:
            log.debug("compiled template not kept in the cache: %s", exc)


def render_html(report: Report) -> str:
    views = build_views(report)
    chart = flowchart.layout(report, views.anchors)
    page = _environment(autoescape=True).get_template("report.html.j2").render(r=report, v=views, chart=chart)
    return neutralise_bidi(page)


def render_markdown(report: Report) -> str:
    views = summary_views(report)
    return neutralise_bidi(_environment(autoescape=False).get_template("summary.md.j2").render(r=report, v=views))


def write_report(report: Report, out_dir: Path) -> dict[str, Path]:
    """report.json first (it holds everything), then report.html and summary.md; each file is written
    whole or not at all (triage/atomic.py). A page that cannot be rendered (a bug, never the user's
    input) is replaced by a plain page that says so; report.json is complete either way."""
    out_dir = Path(out_dir)
    paths = {"html": out_dir / "report.html", "json": out_dir / "report.json", "md": out_dir / "summary.md"}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json(report, out_dir)
        atomic.write_text(paths["html"], _rendered(render_html, report, _fallback_html))
        atomic.write_text(paths["md"], _rendered(render_markdown, report, _fallback_markdown))
    except OSError as exc:
        written = [p.name for p in paths.values() if p.exists()]
        raise ReportError(
            f"Expected to write the report into '{out_dir}', found it cannot be written "
            f"({exc.strerror or exc}). No file there is truncated"
            + (f" ({', '.join(written)} as last written)" if written else "")
            + ". Free some space or pass another --out; `triage report DIR/report.json` re-renders a "
              "report.json that was written."
        ) from None
    return paths


def write_json(report: Report, out_dir: Path) -> Path:
    """report.json alone, atomically: what the engine's journal writes after every experiment."""
    return atomic.write_text(Path(out_dir) / "report.json", report.model_dump_json(indent=2))


def _rendered(render, report: Report, fallback) -> str:
    try:
        return render(report)
    except Exception as exc:  # noqa: BLE001  (the measurements are in report.json; the page must not be lost)
        log.error("the report page could not be rendered (%s: %s); writing a plain page instead",
                  type(exc).__name__, exc, exc_info=True)
        return neutralise_bidi(fallback(report, exc))


def _fallback_html(report: Report, exc: BaseException) -> str:
    e = html.escape
    rows = "".join(f"<tr><td>{e(run.node)}</td><td>{e(run.experiment)}</td><td>{e(run.status)}</td></tr>"
                   for run in report.experiments)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>triage: {e(report.title)}</title></head>"
            f"<body><h1>{e(report.title)} ({e(report.root_cause)}, {e(report.confidence)} confidence)</h1>"
            f"<p>Fix: {e(report.fix)}</p><p>This page could not be drawn in full "
            f"({e(type(exc).__name__)}: {e(str(exc))}); report.json beside it holds every figure. "
            "Please report this as a bug.</p>"
            f"<table><tr><th>node</th><th>experiment</th><th>status</th></tr>{rows}</table></body></html>\n")


def _fallback_markdown(report: Report, exc: BaseException) -> str:
    return (f"### triage: {markdown_text(report.title)} ({markdown_code(report.root_cause)})\n\n"
            f"**Fix:** {markdown_text(report.fix)}\n\n(The full summary could not be rendered: "
            f"{markdown_text(type(exc).__name__)}; report.json holds every figure.)\n")


# Characters that reorder how text displays (Trojan Source, CVE-2021-42574): a name holding one could
# make a report read differently from what it holds. Shown as visible codes instead.
_BIDI = {c: f"\u27e8U+{c:04X}\u27e9" for c in (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F),
                                               *range(0x2066, 0x206A))}


def neutralise_bidi(text: str) -> str:
    """`text` with every bidirectional control character replaced by a visible ⟨U+XXXX⟩."""
    return text.translate(_BIDI)


def read_report(path: Path) -> Report:
    path = Path(path)
    try:
        if path.exists() and not path.is_file():  # /dev/zero or a pipe: its size says nothing, reading never ends
            raise ValueError("not a regular file (a device, a pipe or a folder)")
        size = path.stat().st_size
        if size > MAX_REPORT_BYTES:
            raise ValueError(f"{size} bytes, over the {MAX_REPORT_BYTES // 2**20} MiB a report can be")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        found = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ReportError(f"Expected a report.json written by triage at '{path}', found it unreadable "
                          f"({found}). Pass the report.json from a triage output folder.") from None
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version not in READABLE_VERSIONS:
        raise ReportError(f"Expected report schema version {' or '.join(READABLE_VERSIONS)}, found {version!r}. "
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
