"""A small, safe condition language over outcomes: `baseline.loss_ratio > 1.5 and not lower_lr.finite`.

Text is parsed with Python's `ast` and walked against a whitelist; it is never passed to eval.
Grammar: `node.field` references, numbers, strings, true/false/none, lists of literals,
comparisons (== != < <= > >= in, not in), + - * /, and/or/not, parentheses.
A missing value (an experiment that failed, a figure that could not be measured) is *unknown*:
comparisons with it are unknown, `not unknown` is unknown (Kleene logic), and a branch is
taken only when its condition is true.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from typing import Any, Callable

_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_ARITH = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_NAMES = {"true": True, "false": False, "none": None, "True": True, "False": False, "None": None}

Lookup = Callable[[str, str], Any]


class ConditionError(ValueError):
    """The condition text is not in the language; the message says where."""


@dataclass(frozen=True)
class Condition:
    text: str
    tree: ast.expr
    refs: frozenset[tuple[str, str]]

    def evaluate(self, lookup: Lookup) -> bool:
        """True only when the condition holds; unknown counts as not taken."""
        return _eval(self.tree, lookup) is True

    def value(self, lookup: Lookup) -> Any:
        """The expression's value (for location references like `locate.module`)."""
        return _eval(self.tree, lookup)


def parse_condition(text: str) -> Condition:
    try:
        tree = ast.parse(str(text).strip(), mode="eval").body
    except SyntaxError as exc:
        raise ConditionError(f"'{text}' is not a valid condition ({exc.msg})") from None
    refs: set[tuple[str, str]] = set()
    _check(tree, text, refs)
    return Condition(text=str(text), tree=tree, refs=frozenset(refs))


def _check(node: ast.AST, text: str, refs: set[tuple[str, str]]) -> None:
    if isinstance(node, ast.Attribute):
        if not isinstance(node.value, ast.Name):
            raise ConditionError(f"in '{text}': write references as node.field (one dot)")
        refs.add((node.value.id, node.attr))
        return
    if isinstance(node, ast.Name):
        if node.id not in _NAMES:
            raise ConditionError(f"in '{text}': '{node.id}' alone means nothing; write {node.id}.<field>")
        return
    if isinstance(node, ast.Constant):
        if not isinstance(node.value, (int, float, str, bool, type(None))):
            raise ConditionError(f"in '{text}': literal {node.value!r} is not allowed")
        return
    allowed = (ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.Compare, ast.BinOp,
               ast.List, ast.Tuple, ast.Load, *_COMPARE, *_ARITH)
    if not isinstance(node, allowed):
        raise ConditionError(f"in '{text}': {type(node).__name__} is not part of the condition language")
    for child in ast.iter_child_nodes(node):
        _check(child, text, refs)


def _eval(node: ast.AST, lookup: Lookup) -> Any:
    if isinstance(node, ast.Attribute):
        return lookup(node.value.id, node.attr)
    if isinstance(node, ast.Name):
        return _NAMES[node.id]
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_eval(e, lookup) for e in node.elts]
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, lookup)
        if value is None:
            return None
        return (not value) if isinstance(node.op, ast.Not) else -value
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, lookup), _eval(node.right, lookup)
        if left is None or right is None or (isinstance(node.op, ast.Div) and right == 0):
            return None
        return _ARITH[type(node.op)](left, right)
    if isinstance(node, ast.BoolOp):
        values = [_truth(_eval(v, lookup)) for v in node.values]
        decisive = isinstance(node.op, ast.Or)  # True decides an `or`, False decides an `and`
        if decisive in values:
            return decisive
        return None if None in values else not decisive
    if isinstance(node, ast.Compare):
        left = _eval(node.left, lookup)
        for op, comparator in zip(node.ops, node.comparators):
            right = _eval(comparator, lookup)
            if left is None or right is None:
                if not isinstance(op, (ast.Eq, ast.NotEq)):
                    return None
            try:
                if not _COMPARE[type(op)](left, right):
                    return False
            except TypeError:
                return None
            left = right
        return True
    raise ConditionError(f"cannot evaluate {type(node).__name__}")  # _check keeps us from here


def _truth(value: Any) -> Any:
    return None if value is None else bool(value)
