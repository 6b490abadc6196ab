"""What a figure is called where a person reads it: its words, its unit and its meaning, by the field name
report.json keeps. report.html, summary.md and the terminal all name figures through it.

Nothing is written here twice: each figure's words and unit are declared beside the field they name, in
its model's `json_schema_extra` (`{"words": "loss end / start", "unit": "×"}`), and its meaning is the
field's description. LABELS gathers them from the shipped experiments' outcome models (triage/outcomes/,
with the records their fields hold: a search's trials, a scan's layers) and from the run's own facts a
condition may read (records.ExperimentRun: `status`). Two models may declare one field name only with the
same words and unit: gathering them fails otherwise. tests/outcomes/ fails on a field declared without words.

Units: `×` a ratio, `%` a share (stored 0-1, shown in percent), `steps`, `batches`, `σ` (a z-score), or
a few words after the value (`× start loss`, `per step`); empty where the words say it (a loss, a learning
rate, a norm) or it is a count.
"""

from __future__ import annotations

import math
import re
import typing
from typing import Any, Iterable, Iterator, NamedTuple, Optional

from pydantic import BaseModel

from triage.outcomes import SHIPPED
from triage.records import ExperimentRun
from triage.report.words import format_figure


class Label(NamedTuple):
    words: str
    unit: str
    meaning: str  # the field's description; "" where the models that declare the name describe it differently


def table(models: Iterable[type[BaseModel]]) -> dict[str, Label]:
    """The labels the fields of `models` (and of the records those fields hold) declare, by field name.
    A name declared with other words or another unit than where it was first declared is a ValueError."""
    found: dict[str, Label] = {}
    first: dict[str, str] = {}
    for model in _with_records(models):
        for name, field in model.model_fields.items():
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            if "words" not in extra:
                continue
            entry = Label(str(extra["words"]), str(extra.get("unit", "")), field.description or "")
            seen = found.setdefault(name, entry)
            first.setdefault(name, model.__name__)
            if seen[:2] != entry[:2]:
                raise ValueError(f"Expected the field '{name}' to be named alike wherever it is declared, found "
                                 f"{seen.words!r} (unit {seen.unit!r}) in {first[name]} and {entry.words!r} "
                                 f"(unit {entry.unit!r}) in {model.__name__}. Give both the same words and unit, "
                                 "or rename one of the fields.")
            if seen.meaning != entry.meaning:
                found[name] = seen._replace(meaning="")
    return found


def _with_records(models: Iterable[type[BaseModel]]) -> Iterator[type[BaseModel]]:
    """`models`, each followed by the models its fields hold (list[Trial], Optional[Record]), once each."""
    seen: set[type[BaseModel]] = set()

    def walk(model: type[BaseModel]) -> Iterator[type[BaseModel]]:
        if model in seen:
            return
        seen.add(model)
        yield model
        for field in model.model_fields.values():
            for held in _models_in(field.annotation):
                yield from walk(held)

    for model in models:
        yield from walk(model)


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for argument in typing.get_args(annotation):
        yield from _models_in(argument)


# field: its words, unit and meaning
LABELS: dict[str, Label] = table([*SHIPPED.values(), ExperimentRun])


def label(key: str) -> Optional[Label]:
    """The entry of a field (`loss_ratio`) or of a decision's figure (`baseline.loss_ratio`)."""
    return LABELS.get(key.rsplit(".", 1)[-1])


def words(key: str, node: Optional[str] = None) -> str:
    """A figure's words; another node's figure (`baseline.max_rise` read at `divergence`) names its node:
    `largest rise of the loss (baseline)`. A field missing from the table shows its name in words."""
    owner, _, field = key.rpartition(".")
    entry = label(field)
    said = entry.words if entry else field.replace("_", " ")
    return f"{said} ({owner})" if owner and owner != node else said


def meaning(key: str, experiment: Optional[str] = None) -> str:
    """A figure's meaning: its description in the outcome model of `experiment` where that is a shipped
    experiment's, else the one description every model that declares the name gives it."""
    field = key.rsplit(".", 1)[-1]
    model = SHIPPED.get(experiment) if experiment else None
    if model is not None and field in model.model_fields:
        return model.model_fields[field].description or ""
    entry = label(key)
    return entry.meaning if entry else ""


def value(key: str, figure: Any) -> str:
    """A figure with its unit: `92.5%` for a share, `1.448×` for a ratio, `40 steps`."""
    entry = label(key)
    unit = entry.unit if entry else ""
    number = figure if isinstance(figure, (int, float)) and not isinstance(figure, bool) else None
    if number is None or not math.isfinite(number):
        return format_figure(figure)
    if unit == "%":
        return f"{100 * number:.3g}%"
    if unit == "×":
        return f"{format_figure(float(number))}×"
    return f"{format_figure(figure)} {unit}" if unit else format_figure(figure)


def shown(key: str, figure: Any, node: Optional[str] = None) -> str:
    """`largest rise of the loss 1.193 × start loss`: words and value, as prose and summary.md write it."""
    return f"{words(key, node)} {value(key, figure)}"


_REFERENCE = re.compile(r"\b([A-Za-z_]\w*)\.([A-Za-z_]\w*)\b")


def condition_words(text: str, node: Optional[str] = None) -> str:
    """A playbook clause in words: `baseline.loss_ratio > 1.5` -> `loss end / start (baseline) > 1.5`."""
    return _REFERENCE.sub(lambda m: words(m.group(0), node), text)
