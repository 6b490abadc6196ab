"""The one checked way the report and the terminal read an experiment's outcome back from report.json.

report.json carries each run's outcome as a JSON dict (NaN and inf written as "NaN", "Infinity"). A reader
asks `outcome_of(run, ReplayOutcome)` and gets the outcome read as its experiment's own Outcome model, or
None where the run holds no outcome or its experiment measures something else (a data check is no
replay). The models are the experiments' own, declared without torch in triage/outcomes/ (SHIPPED names
each shipped experiment's), so nothing here restates a field. Readers use attributes (`outcome.loss_end`):
a misspelt or renamed field is an AttributeError, never a blank; tests/report/test_report_outcomes.py
checks every field a reader in report/ and cli/ asks for exists on the model it asked `outcome_of` for.

Read leniently, so an older report renders: a field missing from the dict (a report of an earlier schema)
reads as None, whatever its default (a list too: readers write `or []`); a field whose value does not fit
its type reads as None too; fields the model does not have are ignored; a list of records (a search's
trials) is read record by record, alike. The reading is built without validating the model as a whole
(`model_construct`): it is a record of what was written, not a new measurement. An experiment SHIPPED does
not name (one a playbook's `imports:` registered) is read as the model the reader asked for, with the
fields of it that it has: it renders as it did when readers picked fields by name.
"""

from __future__ import annotations

import functools
import logging
import types
import typing
from typing import Any, Optional, TypeVar

import pydantic
from pydantic import TypeAdapter

from triage.outcomes import SHIPPED, Outcome
from triage.records import ExperimentRun

__all__ = ["outcome_of", "read_as"]

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Outcome)


def outcome_of(run: Optional[ExperimentRun], expected: type[R]) -> Optional[R]:
    """`run`'s outcome read as its experiment's model, where that model is `expected` or a subclass of it;
    None where there is no run, it holds no outcome, or its experiment measures something else."""
    if run is None or not run.outcome:
        return None
    model: type[Outcome]
    if run.experiment not in SHIPPED:
        log.debug("experiment %r is not a shipped one: its outcome is read as a %s", run.experiment, expected.__name__)
        model = expected
    else:
        model = SHIPPED[run.experiment]
        if not issubclass(model, expected):
            return None
    return read_as(model, run.outcome)  # type: ignore[return-value]


def read_as(model: type[R], data: dict[str, Any]) -> R:
    """`data` read leniently as `model` (see above); `read_as(ReplayOutcome, {})` is a reading with nothing
    measured, every field None."""
    values = {name: _read_value(field.annotation, data[name]) if name in data else None
              for name, field in model.model_fields.items()}
    bad = sorted(name for name, value in values.items() if value is None and data.get(name) is not None)
    if bad:
        log.debug("outcome fields %s do not fit %s: read as None", bad, model.__name__)
    return model.model_construct(**values)


def _read_value(annotation: Any, value: Any) -> Any:
    """`value` validated as `annotation`, None where it does not fit; records (and lists of them) read
    field by field with read_as."""
    record = _record_of(annotation)
    if record is not None and value is not None:
        if isinstance(value, dict):
            return read_as(record, value)
        if isinstance(value, list) and all(isinstance(item, dict) for item in value):
            return [read_as(record, item) for item in value]
        return None
    try:
        return _adapter(annotation).validate_python(value)
    except pydantic.ValidationError:
        return None


def _record_of(annotation: Any) -> Optional[type[Outcome]]:
    """The Outcome model that `annotation` holds one of or a list of (Optional or not), where it does."""
    if isinstance(annotation, type) and issubclass(annotation, Outcome):
        return annotation
    arguments = [a for a in typing.get_args(annotation) if a is not type(None)]
    if len(arguments) == 1 and typing.get_origin(annotation) in (list, typing.Union, types.UnionType):
        return _record_of(arguments[0])
    return None


@functools.lru_cache(maxsize=None)
def _adapter(annotation: Any) -> TypeAdapter:
    return TypeAdapter(annotation)
