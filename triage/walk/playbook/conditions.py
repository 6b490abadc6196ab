"""A small, safe condition language over outcomes: `baseline.loss_ratio > 1.5 and not lower_lr.finite`.

Text is parsed with Python's `ast` and walked against a whitelist; it is never passed to eval.
Grammar: `node.field` references, numbers, strings, true/false/none, lists of literals,
comparisons (== != < <= > >= in, not in), + - * /, and/or/not, parentheses, and the judge's named
rules called on node names (`stalls(baseline)`, judge/named.py), spelt out when the condition is parsed.
A missing value (an experiment that failed, a figure that could not be measured) is *unknown*:
comparisons with it are unknown, `not unknown` is unknown (Kleene logic), and a branch is
taken only when its condition is true.

Evaluation never raises. What the load-time type check (triage/walk/playbook/typecheck.py) cannot rule
out, e.g. an overflow (`x * 1e308`) or a value of another type than its field declares, makes that
part unknown and is recorded in the `errors` list the caller passes.

Limits: a condition is at most MAX_CHARS characters and MAX_DEPTH levels of nesting.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from typing import Any, Callable, Optional

from triage.judge.named import NAMED

_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_ARITH = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_NAMES = {"true": True, "false": False, "none": None, "True": True, "False": False, "None": None}

Lookup = Callable[[str, str], Any]

MAX_CHARS = 2000  # the longest condition of the default playbook is under 300
MAX_DEPTH = 40  # levels of nested operators and parentheses


class ConditionError(ValueError):
    """The condition text is not in the language; the message says where."""


@dataclass(frozen=True)
class Condition:
    text: str  # what is evaluated: the judge's named rules spelt out
    tree: ast.expr
    refs: frozenset[tuple[str, str]]
    written: str  # as the playbook wrote it (a named rule called by name)

    @property
    def quoted(self) -> str:
        """For an error: as written, in quotes, and what it spells out to where that differs."""
        if self.written.strip() == self.text.strip():
            return f"'{self.text}'"
        return f"'{self.written.strip()}' (spelt out: '{self.text}')"

    def evaluate(self, lookup: Lookup, errors: Optional[list[str]] = None) -> bool:
        """True only when the condition holds; unknown counts as not taken. What could not be evaluated
        is appended to `errors` (when given) as one line naming the condition."""
        return _Evaluator(self.text, lookup, errors).eval(self.tree) is True

    def value(self, lookup: Lookup, errors: Optional[list[str]] = None) -> Any:
        """The expression's value (for location references like `locate.module`)."""
        return _Evaluator(self.text, lookup, errors).eval(self.tree)

    def settled(self, lookup: Lookup) -> list[tuple[str, list[str]]]:
        """The clauses that settled the condition's value, as (text, `node.field` refs) in reading order:
        of an `or` that holds, the operands that were true; of an `and` that fails, those that were false;
        of any other `and`/`or`, every operand (each was needed; unknown settles nothing). Evaluated as
        `evaluate` does, on the same figures (so at full precision, not as a report rounds them)."""
        evaluator, source = _Evaluator(self.text, lookup, None), self.text.strip()
        found: list[ast.expr] = []
        stack = [self.tree]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.BoolOp):
                decisive = isinstance(node.op, ast.Or)  # True settles an `or`, False settles an `and`
                operands = [v for v in node.values if _truth(evaluator.eval(v)) is decisive] or node.values
                stack.extend(reversed(operands))
            else:
                found.append(node)
        return [(ast.get_source_segment(source, node) or ast.unparse(node), _refs_in(node)) for node in found]


def parse_condition(text: str) -> Condition:
    written = str(text)
    if len(written) > MAX_CHARS:
        raise ConditionError(f"a condition of {len(written)} characters is longer than the {MAX_CHARS} allowed; "
                             "split it over a decision node")
    text = _written_out(written)
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ConditionError(f"'{_short(text)}' is not a valid condition ({exc.msg})") from None
    except (RecursionError, MemoryError, ValueError):
        raise ConditionError(f"'{_short(text)}' is nested too deeply to parse (at most {MAX_DEPTH} "
                             "levels)") from None
    depth = _depth(tree)
    if depth > MAX_DEPTH:
        raise ConditionError(f"'{_short(text)}' is nested more than the {MAX_DEPTH} levels allowed; "
                             "simplify it")
    refs: set[tuple[str, str]] = set()
    _check(tree, text, refs)
    return Condition(text=text, tree=tree, refs=frozenset(refs), written=written)


def _written_out(text: str) -> str:
    """The judge's named rules called in `text` (`stalls(baseline)`, judge/named.py) spelt out on the nodes
    each call names, in parentheses where the call is part of a larger condition. A call of anything else,
    or with other than node names, is refused."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, RecursionError, MemoryError, ValueError):
        return text  # parse_condition says what is wrong with it
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    if not calls:
        return text
    source = text.strip().encode()  # ast's offsets count UTF-8 bytes, on lines as splitlines() cuts them
    line_starts = [0]
    for line in source.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    spelt = []
    for call in calls:
        name = call.func.id if isinstance(call.func, ast.Name) else ast.unparse(call.func)
        rule = NAMED.get(name)
        if rule is None:
            raise ConditionError(f"in '{_short(text)}': '{name}(...)' is not part of the condition language, "
                                 f"which calls only the judge's named rules: {', '.join(sorted(NAMED))}")
        if (call.keywords or len(call.args) != len(rule.nodes)
                or not all(isinstance(a, ast.Name) and a.id not in _NAMES for a in call.args)):
            raise ConditionError(f"in '{_short(text)}': {name}() takes {len(rule.nodes)} node name(s), "
                                 f"{name}({', '.join(rule.nodes)}): {rule.says}; found "
                                 f"{name}({', '.join(map(ast.unparse, [*call.args, *call.keywords]))})")
        whole = call is tree
        body = rule.written_out([a.id for a in call.args])
        spelt.append((line_starts[call.lineno - 1] + call.col_offset,
                      line_starts[call.end_lineno - 1] + call.end_col_offset, body if whole else f"({body})"))
    for start, end, body in sorted(spelt, reverse=True):  # from the end, so earlier offsets stay right
        source = source[:start] + body.encode() + source[end:]
    return source.decode()


def _depth(tree: ast.AST) -> int:
    """Nesting depth, without recursion (a deep tree must not overflow the stack while it is measured)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth <= MAX_DEPTH:  # past the limit the answer is known
            stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node)
                         if not isinstance(child, (ast.Load, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)))
    return deepest


def _short(text: str, width: int = 120) -> str:
    return text if len(text) <= width else text[:width] + "…"


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


def _refs_in(node: ast.expr) -> list[str]:
    refs = sorted((a for a in ast.walk(node) if isinstance(a, ast.Attribute)), key=lambda a: (a.lineno, a.col_offset))
    return list(dict.fromkeys(f"{a.value.id}.{a.attr}" for a in refs))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return "a number" if _is_number(value) else f"a {type(value).__name__}"


class _Evaluator:
    """One evaluation: reads through `lookup`, turns what cannot be computed into unknown (None) and
    says why in `errors`."""

    def __init__(self, text: str, lookup: Lookup, errors: Optional[list[str]]) -> None:
        self.text, self.lookup, self.errors = text, lookup, errors

    def unknown(self, why: str) -> None:
        if self.errors is not None:
            self.errors.append(f"'{_short(self.text)}': {why}; taken as unknown")
        return None

    def eval(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Attribute):
            return self.lookup(node.value.id, node.attr)
        if isinstance(node, ast.Name):
            return _NAMES[node.id]
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.eval(e) for e in node.elts]
        if isinstance(node, ast.UnaryOp):
            value = self.eval(node.operand)
            if value is None:
                return None
            if isinstance(node.op, ast.Not):
                return not value
            return -value if _is_number(value) else self.unknown(f"'-' needs a number, found {_kind(value)}")
        if isinstance(node, ast.BinOp):
            return self.arithmetic(node)
        if isinstance(node, ast.BoolOp):
            values = [_truth(self.eval(v)) for v in node.values]
            decisive = isinstance(node.op, ast.Or)  # True decides an `or`, False decides an `and`
            if decisive in values:
                return decisive
            return None if None in values else not decisive
        if isinstance(node, ast.Compare):
            return self.compare(node)
        raise ConditionError(f"cannot evaluate {type(node).__name__}")  # _check keeps us from here

    def arithmetic(self, node: ast.BinOp) -> Any:
        left, right = self.eval(node.left), self.eval(node.right)
        if left is None or right is None or (isinstance(node.op, ast.Div) and right == 0):
            return None
        symbol = _SYMBOLS[type(node.op)]
        concatenation = isinstance(node.op, ast.Add) and (
            (isinstance(left, list) and isinstance(right, list)) or (isinstance(left, str) and isinstance(right, str)))
        if not concatenation and not (_is_number(left) and _is_number(right)):  # never a repetition: 'ab' * 10**9
            return self.unknown(f"'{symbol}' needs numbers, found {_kind(left)} and {_kind(right)}")
        try:
            return _ARITH[type(node.op)](left, right)
        except (ArithmeticError, ValueError) as exc:
            return self.unknown(f"'{symbol}' failed ({type(exc).__name__}: {exc})")

    def compare(self, node: ast.Compare) -> Any:
        left = self.eval(node.left)
        for op, comparator in zip(node.ops, node.comparators):
            right = self.eval(comparator)
            if (left is None or right is None) and not isinstance(op, (ast.Eq, ast.NotEq)):
                return None
            try:
                if not _COMPARE[type(op)](left, right):
                    return False
            except (TypeError, ValueError, ArithmeticError) as exc:
                return self.unknown(f"cannot compare {_kind(left)} with {_kind(right)} "
                                    f"({type(exc).__name__})")
            left = right
        return True


_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def _truth(value: Any) -> Any:
    return None if value is None else bool(value)
