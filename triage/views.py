"""What an experiment asks the report to show: typed view declarations, checked against its Outcome.

An experiment declares its views beside its Outcome model, `Experiment(..., views=(Curve(...), ...))`.
The registry checks every field a view names against that model when the experiment registers
(`check_views`), so a renamed or missing field fails there, naming the experiment, the view and the
field, instead of silently drawing nothing when a report is rendered. report.json carries the
declarations (`Report.views`), so `triage report` draws them without torch or the experiment's code.

    Curve          a series per step (or against another series), with the reference run's beside it
    Bars           one bar per item of a list: per batch, or per named layer (a list of records)
    SourceExcerpt  the user's source around a line, as SourceLine records
    Table          a list of records, or parallel lists, as rows

Plain data: no torch here. The renderer is triage/report/sections.py.
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Iterator, Literal, Optional, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field


class ViewError(ValueError):
    """A view names a field its experiment's Outcome does not have, or one of the wrong kind."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SourceLine(_Frozen):
    """One line of the user's source, as an experiment read it."""

    file: str = Field(description="As shown to the user: relative to where triage ran, when inside it.")
    line: int = Field(description="1-based line number.")
    text: str = Field(description="The line, without its newline.")
    is_culprit: bool = Field(default=False, description="The line the experiment points at.")


class Line(_Frozen):
    """Another series of the same outcome, drawn on a Curve's axis."""

    field: str
    label: str
    steps: Optional[str] = Field(default=None, description="A field of its x positions; None: 0, 1, 2, ...")
    step_offset: int = Field(default=0, description="Added to each x from `steps` (a count of finished "
                                                    "steps is 1-based; a curve's steps are 0-based).")
    style: Literal["dashed", "reference"] = Field(
        default="dashed", description="dashed: another measure of this run; reference: what it is compared with.")


class Mark(_Frozen):
    """A vertical line at the x a field holds: the checkpoint's step, the suggested learning rate."""

    field: str
    label: str
    tone: Literal["neutral", "good", "bad"] = "neutral"


class Curve(_Frozen):
    """A series per step (or against another series), optionally beside the reference run's."""

    kind: Literal["curve"] = "curve"
    title: str
    field: str = Field(description="The y values: a list of numbers (NaN and inf allowed).")
    label: Optional[str] = Field(default=None, description="Its legend; None: the node's id.")
    x: Optional[str] = Field(default=None, description="A field of x positions; None: step 0, 1, 2, ...")
    xlabel: str = "step"
    ylabel: str = ""
    against: Optional[Literal["reference"]] = Field(
        default=None, description="reference: draw the same field of the run this one is compared with "
                                  "(the first run of the experiment from the checkpoint) beside it.")
    lines: tuple[Line, ...] = ()
    marks: tuple[Mark, ...] = ()
    threshold: Optional[str] = Field(default=None, description="A number field drawn as a horizontal line "
                                                               "(the clip threshold).")
    threshold_label: str = "threshold"
    nonfinite_step: Optional[str] = Field(default=None, description="An int field: the first non-finite step.")
    log_x: bool = False
    log_y: Optional[bool] = Field(default=None, description="None: a log axis when the values span decades.")
    hide_if_constant: bool = Field(default=False, description="Leave it out when every value is the same.")
    headline: bool = Field(
        default=False, description="The experiment's main curve: the proof, overview and candidate plots "
                                   "draw it, and the one-line summary reads `start` and `end`.")
    start: Optional[str] = Field(default=None, description="A number field: where the curve started (summary).")
    end: Optional[str] = Field(default=None, description="A number field: where it ended (summary).")
    setting: Optional[str] = Field(default=None, description="A string field naming what this run changed (a "
                                                            "search's chosen trial): the report's 'Changed'.")
    caption: str = ""

    def shows(self) -> list[str]:
        return [f for f in (self.field, self.x, *(line.field for line in self.lines),
                            *(line.steps for line in self.lines)) if f]


class Bars(_Frozen):
    """One bar per item of a list: by index (batches) or by name (layers, read down the left)."""

    kind: Literal["bars"] = "bars"
    title: str
    field: str = Field(description="A list of numbers, or of records whose `value` key holds the number.")
    value: Optional[str] = Field(default=None, description="Of a list of records: the key holding the number.")
    labels: Optional[str] = Field(
        default=None, description="Names for the bars: a key of each record (with `value`) or a field holding a "
                                  "list of names; named bars are drawn across, in order. None: by index.")
    index_label: str = Field(default="item", description="What an index counts (bars by index).")
    axis_label: str = ""
    highlight: Optional[str] = Field(default=None, description="A field of indices drawn red (the outliers).")
    highlight_above: Optional[float] = Field(default=None, description="Values above this are drawn red.")
    log: bool = Field(default=False, description="A log axis when the values span more than 10x; a 0 is "
                                                 "then written as a red 0 rather than dropped.")
    limit: Optional[tuple[float, float]] = None
    caption: str = ""

    def shows(self) -> list[str]:
        return [f for f in (self.field, self.highlight, None if self.value else self.labels) if f]


class SourceExcerpt(_Frozen):
    """The user's source around a line, the line marked."""

    kind: Literal["source"] = "source"
    title: str = "Source"
    field: str = Field(description="A list of SourceLine records.")
    caption: str = ""

    def shows(self) -> list[str]:
        return [self.field]


class Table(_Frozen):
    """Rows: of one list of records (a column per key), or of parallel lists (a column each)."""

    kind: Literal["table"] = "table"
    title: str
    fields: tuple[str, ...] = Field(min_length=1)
    columns: Optional[tuple[str, ...]] = Field(default=None, description="Of a list of records: the keys shown.")
    limit: int = Field(default=20, ge=1, description="Rows shown; the rest are in report.json.")
    caption: str = ""

    def shows(self) -> list[str]:
        return list(self.fields)


View = Annotated[Union[Curve, Bars, SourceExcerpt, Table], Field(discriminator="kind")]


# --- the check at registration -------------------------------------------------------------------

def check_views(experiment: str, views: tuple[Any, ...], outcome: type[BaseModel]) -> None:
    """Raise ViewError naming the experiment, the view and the field where a view does not fit `outcome`."""
    for view in views:
        if not isinstance(view, (Curve, Bars, SourceExcerpt, Table)):
            raise ViewError(f"experiment '{experiment}': expected views of triage.views (Curve, Bars, "
                            f"SourceExcerpt, Table), found a {type(view).__name__}")
        for field, wanted in _wanted(view):
            problem = _misfit(outcome, field, wanted)
            if problem:
                raise ViewError(f"experiment '{experiment}': {view.kind} view '{view.title}' reads outcome field "
                                f"'{field}', but {outcome.__name__} {problem}. Rename the field in the view or "
                                "in the outcome so the two agree.")


def _wanted(view: Any) -> Iterator[tuple[str, str]]:
    """(field, the kind of value the view needs there) for every field it names."""
    if isinstance(view, Curve):
        yield view.field, "numbers"
        if view.x:
            yield view.x, "numbers"
        for line in view.lines:
            yield line.field, "numbers"
            if line.steps:
                yield line.steps, "numbers"
        for mark in view.marks:
            yield mark.field, "number"
        for name in (view.threshold, view.nonfinite_step, view.start, view.end):
            if name:
                yield name, "number"
        if view.setting:
            yield view.setting, "text"
    elif isinstance(view, Bars):
        if view.value:
            yield view.field, f"records:{view.value}" + (f",{view.labels}" if view.labels else "")
        else:
            yield view.field, "numbers"
            if view.labels:
                yield view.labels, "list"
        if view.highlight:
            yield view.highlight, "numbers"
    elif isinstance(view, SourceExcerpt):
        yield view.field, "source"
    else:
        if len(view.fields) == 1 and view.columns is not None:
            yield view.fields[0], "records:" + ",".join(view.columns)
        else:
            for name in view.fields:
                yield name, "list"


def _misfit(outcome: type[BaseModel], field: str, wanted: str) -> Optional[str]:
    """Why `field` of `outcome` cannot be shown as `wanted`; None when it can."""
    fields = getattr(outcome, "model_fields", {})
    if field not in fields:
        return f"has no such field (it has: {', '.join(sorted(fields)) or 'none'})"
    kind = _optional(fields[field].annotation)
    if kind is Any:
        return None
    if wanted == "number":
        return None if _is_number(kind) else f"declares it as {_name(kind)}, not a number"
    if wanted == "text":
        return None if kind is str else f"declares it as {_name(kind)}, not a str"
    if not _is_list(kind):
        return f"declares it as {_name(kind)}, not a list"
    item = _optional(get_args(kind)[0]) if get_args(kind) else Any
    if wanted == "numbers" and item is not Any and not _is_number(item):
        return f"declares it as a list of {_name(item)}, not of numbers"
    if wanted == "source" and item is not SourceLine:
        return f"declares it as a list of {_name(item)}, not of triage.views.SourceLine"
    if wanted.startswith("records:"):
        if not (isinstance(item, type) and issubclass(item, BaseModel)):
            return f"declares it as a list of {_name(item)}, not of records"
        missing = [key for key in wanted.split(":", 1)[1].split(",") if key and key not in item.model_fields]
        if missing:
            return (f"holds {item.__name__} records, which have no key '{missing[0]}' "
                    f"(they have: {', '.join(item.model_fields)})")
    return None


def _optional(kind: Any) -> Any:
    """X from Optional[X] (and X | None)."""
    if get_origin(kind) in (Union, types.UnionType):
        rest = [a for a in get_args(kind) if a is not type(None)]
        if len(rest) == 1:
            return _optional(rest[0])
    return kind


def _is_number(kind: Any) -> bool:
    if get_origin(kind) in (Union, types.UnionType):
        return all(_is_number(a) or a is type(None) for a in get_args(kind))
    return kind in (int, float)


def _is_list(kind: Any) -> bool:
    return kind in (list, tuple) or get_origin(kind) in (list, tuple)


def _name(kind: Any) -> str:
    return getattr(kind, "__name__", None) or str(kind).replace("typing.", "")
