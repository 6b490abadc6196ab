"""Type-checking a condition against the fields it reads, when the playbook loads.

Every `node.field` has a declared type: the field of its experiment's Outcome (pydantic), a run's
`status`/`seconds`, or a `setup.*` fact (triage.records.SetupFacts). From those this module infers
what each part of a condition can be and refuses, before anything runs, what can never work:
arithmetic or `-` on something that is not a number (`labels.names * 2`, `-setup.precision`), an
ordering between a number and a string, `in` on something that holds nothing. What is only possibly
wrong (an Optional field, an `Any`) is left to run time, where it makes the figure unknown.
"""

from __future__ import annotations

import ast
import types
import typing
from typing import Any, Callable, Union

from triage.walk.playbook.conditions import _NAMES, Condition, ConditionError

NUMBER, BOOL, STR, LIST, DICT, NONE, ANY = "number", "bool", "str", "list", "dict", "none", "any"
Kinds = frozenset

_WORDS = {NUMBER: "a number", BOOL: "true/false", STR: "a string", LIST: "a list", DICT: "a mapping",
          NONE: "none", ANY: "anything"}


def kinds_of(annotation: Any) -> Kinds:
    """What values a field of this type annotation can hold, as kinds."""
    if annotation is Any:
        return Kinds({ANY})
    if annotation is type(None) or annotation is None:
        return Kinds({NONE})
    origin = typing.get_origin(annotation)
    if origin in (Union, getattr(types, "UnionType", Union)):
        return Kinds().union(*(kinds_of(a) for a in typing.get_args(annotation)))
    if origin is typing.Literal:
        return Kinds().union(*(_kinds_of_value(v) for v in typing.get_args(annotation)))
    if origin is typing.Annotated:
        return kinds_of(typing.get_args(annotation)[0])
    base = origin or annotation
    if base is bool:
        return Kinds({BOOL})
    if base in (int, float):
        return Kinds({NUMBER})
    if base is str:
        return Kinds({STR})
    if isinstance(base, type) and issubclass(base, (list, tuple, set, frozenset)):
        return Kinds({LIST})
    if isinstance(base, type) and issubclass(base, dict):
        return Kinds({DICT})
    if base in (typing.Sequence, typing.List, typing.Tuple) or str(base).startswith("collections.abc.Sequence"):
        return Kinds({LIST})
    return Kinds({ANY})


def _kinds_of_value(value: Any) -> Kinds:
    if isinstance(value, bool):
        return Kinds({BOOL})
    if isinstance(value, (int, float)):
        return Kinds({NUMBER})
    if isinstance(value, str):
        return Kinds({STR})
    if value is None:
        return Kinds({NONE})
    return Kinds({ANY})


def describe(kinds: Kinds) -> str:
    return " or ".join(_WORDS[k] for k in sorted(kinds))


def check_types(condition: Condition, field_kinds: Callable[[str, str], Kinds]) -> None:
    """Raise ConditionError naming the part of `condition` that can never be evaluated."""
    _Checker(condition.quoted, field_kinds).kinds(condition.tree)


class _Checker:
    def __init__(self, quoted: str, field_kinds: Callable[[str, str], Kinds]) -> None:
        self.quoted, self.field_kinds = quoted, field_kinds

    def fail(self, node: ast.AST, message: str) -> None:
        raise ConditionError(f"in {self.quoted}: {message} (at `{ast.unparse(node)}`)")

    def kinds(self, node: ast.AST) -> Kinds:
        if isinstance(node, ast.Attribute):
            return self.field_kinds(node.value.id, node.attr)
        if isinstance(node, ast.Name):
            return _kinds_of_value(_NAMES[node.id])
        if isinstance(node, ast.Constant):
            return _kinds_of_value(node.value)
        if isinstance(node, (ast.List, ast.Tuple)):
            for element in node.elts:
                self.kinds(element)
            return Kinds({LIST})
        if isinstance(node, ast.UnaryOp):
            operand = self.kinds(node.operand)
            if isinstance(node.op, ast.Not):
                return Kinds({BOOL})
            self.need_number(node.operand, operand, "'-'")
            return Kinds({NUMBER})
        if isinstance(node, ast.BinOp):
            left, right = self.kinds(node.left), self.kinds(node.right)
            if isinstance(node.op, ast.Add):  # numbers add; lists and strings concatenate (never repeat)
                shared = left & right & {NUMBER, LIST, STR}
                if not shared and ANY not in left | right:
                    self.fail(node, f"'+' needs two numbers, two lists or two strings, found {describe(left)} "
                                    f"and {describe(right)}")
                return Kinds(shared | {NONE}) if ANY not in left | right else Kinds({ANY})
            symbol = {ast.Sub: "'-'", ast.Mult: "'*'", ast.Div: "'/'"}[type(node.op)]
            self.need_number(node.left, left, symbol)
            self.need_number(node.right, right, symbol)
            return Kinds({NUMBER, NONE})  # none: a division by zero is unknown
        if isinstance(node, ast.BoolOp):
            for value in node.values:
                self.kinds(value)
            return Kinds({BOOL, NONE})
        if isinstance(node, ast.Compare):
            left_node, left = node.left, self.kinds(node.left)
            for op, right_node in zip(node.ops, node.comparators):
                right = self.kinds(right_node)
                self.comparable(op, left_node, left, right_node, right)
                left_node, left = right_node, right
            return Kinds({BOOL, NONE})
        return Kinds({ANY})

    def need_number(self, node: ast.AST, kinds: Kinds, what: str) -> None:
        if not kinds & {NUMBER, ANY} and kinds - {NONE}:
            self.fail(node, f"{what} needs numbers, found {describe(kinds)}")
        if kinds == {NONE}:
            self.fail(node, f"{what} needs numbers, found none")

    def comparable(self, op: ast.cmpop, left_node, left: Kinds, right_node, right: Kinds) -> None:
        if isinstance(op, (ast.Eq, ast.NotEq)) or ANY in left or ANY in right:
            return
        if isinstance(op, (ast.In, ast.NotIn)):
            if not right & {LIST, STR, DICT}:
                self.fail(right_node, f"'in' needs a list or a string on its right, found {describe(right)}")
            if right <= {STR, NONE} and not left & {STR}:
                self.fail(left_node, f"'in' a string needs a string on its left, found {describe(left)}")
            return
        orderable = ({NUMBER, BOOL}, {STR})  # a bool orders like 0/1, as in Python
        if not any(left & group and right & group for group in orderable):
            self.fail(right_node, f"cannot order {describe(left)} against {describe(right)}")
