"""Every rank's outcome of one experiment, reduced to the one outcome all ranks decide on.

A field that every rank measured alike is kept. One that differs is reduced by the rule its Outcome
declares (`Field(json_schema_extra={"ranks": "all"})`), else by its type:

    float  mean          a loss is the mean over ranks; NaN or Inf on one rank stays non-finite
    int    max           counts of problems (outliers, NaN tensors): one rank's count shows
    bool   any           a problem seen on one rank is seen; declare "all" for a health flag (finite)
    list   union         names and indices, in order; equal-length number lists: their elementwise mean
    other  rank 0's

Declared rules: mean, max, min, sum, any, all, union, first. The figures that differed are kept per rank
for the report (which rank saw what).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

from pydantic import BaseModel

RULE_KEY = "ranks"


def _numbers(column: list[Any]) -> list[float]:
    return [v for v in column if isinstance(v, (int, float)) and not isinstance(v, bool)]


def _mean(column: list[Any]) -> Any:
    values = _numbers(column)
    return sum(values) / len(values) if values else None


def _max(column: list[Any]) -> Any:
    values = _numbers(column)
    if any(isinstance(v, float) and math.isnan(v) for v in values):
        return math.nan
    return max(values) if values else None


def _min(column: list[Any]) -> Any:
    values = _numbers(column)
    return min(values) if values else None


def _sum(column: list[Any]) -> Any:
    values = _numbers(column)
    return sum(values) if values else None


def _any(column: list[Any]) -> Any:
    flags = [v for v in column if v is not None]
    return any(flags) if flags else None


def _all(column: list[Any]) -> Any:
    flags = [v for v in column if v is not None]
    return all(flags) if flags else None


def _union(column: list[Any]) -> Any:
    seen, out = set(), []
    for values in column:
        for v in values or []:
            key = repr(v)
            if key not in seen:
                seen.add(key)
                out.append(v)
    return out


def _first(column: list[Any]) -> Any:
    return column[0]


RULES: dict[str, Callable[[list[Any]], Any]] = {
    "mean": _mean, "max": _max, "min": _min, "sum": _sum, "any": _any, "all": _all, "union": _union,
    "first": _first,
}


def rule_of(model: type[BaseModel], name: str) -> Optional[str]:
    """The rule a field declares (None: by its type). An unknown rule is an error naming the field."""
    extra = model.model_fields[name].json_schema_extra
    rule = extra.get(RULE_KEY) if isinstance(extra, dict) else None
    if rule is not None and rule not in RULES:
        raise ValueError(f"{model.__name__}.{name} declares ranks={rule!r}; expected one of {sorted(RULES)}")
    return rule


def _by_type(column: list[Any]) -> str:
    present = [v for v in column if v is not None]
    if not present:
        return "first"
    if all(isinstance(v, bool) for v in present):
        return "any"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return "max"
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return "mean"
    if all(isinstance(v, list) for v in present):
        if _number_lists(present) and len({len(v) for v in present}) == 1:
            return "elementwise"
        return "union" if all(_plain(x) for v in present for x in v) else "first"
    return "first"


def _number_lists(lists: list[list[Any]]) -> bool:
    return all(isinstance(x, float) or x is None for v in lists for x in v) and any(v for v in lists)


def _plain(value: Any) -> bool:
    return isinstance(value, (str, int)) and not isinstance(value, bool)


def _elementwise(column: list[Any]) -> list[Any]:
    return [_mean(list(items)) for items in zip(*column)]


def _same(a: Any, b: Any) -> bool:
    return a == b or repr(a) == repr(b)  # repr: NaN equals NaN, as two ranks' NaN losses should


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def reduce_outcomes(outcomes: list[BaseModel]) -> tuple[BaseModel, dict[str, list[Any]]]:
    """The one outcome every rank decides on, and {field: value per rank} for the fields that differed."""
    first = outcomes[0]
    model = type(first)
    update: dict[str, Any] = {}
    per_rank: dict[str, list[Any]] = {}
    for name in model.model_fields:
        column = [getattr(o, name) for o in outcomes]
        if all(_same(v, column[0]) for v in column[1:]):
            continue
        rule = rule_of(model, name) or _by_type(column)
        update[name] = _elementwise(column) if rule == "elementwise" else RULES[rule](column)
        if all(_scalar(v) for v in column):
            per_rank[name] = column
    return (first.model_copy(update=update) if update else first), per_rank
