"""Loading a playbook: YAML → pydantic → a validated networkx DiGraph, before anything runs.

Errors name the file, the node and its line: unknown experiments or parameters, dangling gotos,
cycles, unreachable nodes, leaves without a diagnosis, conditions on unknown fields or on nodes
that may not have run yet.

Four kinds of node: a run node (one experiment, then branches on what it measured), a decision node
(branches on what earlier nodes measured, running nothing), a differential
node (several candidate experiments from the same snapshot; the winner by the node's rule decides
where to go) and a leaf (a diagnosis). A differential node's candidates are not nodes of the graph,
but their ids name experiments like node ids do: later conditions, evidence and proofs read them.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import networkx as nx
import pydantic
import yaml

from triage.causes import ROOT_CAUSES
from triage.errors import PlaybookError
from triage.experiments import Experiment, Registry, default_registry
from triage.walk.playbook import limits
from triage.walk.playbook.conditions import Condition, ConditionError, parse_condition
from triage.walk.playbook.schema import (FIX_REF, Candidate, DecisionNode, DifferentialNode, Finding, LeafNode,
                                         PlaybookFile, RunNode)
from triage.walk.playbook.typecheck import NONE, NUMBER, STR, Kinds, check_types, kinds_of
from triage.records import SetupFacts

log = logging.getLogger(__name__)

SETUP_FACTS = tuple(SetupFacts.model_fields)
# Every ExperimentRun has these besides its outcome's fields (`error`: the traceback, or a not_applicable reason).
RUN_FIELDS = ("status", "seconds", "error")
LOCATION_KEYS = ("module", "module_type", "previous_module", "previous_module_type", "op", "source", "batch",
                 "parameters", "rank")


Spec = Union[RunNode, DecisionNode, DifferentialNode, LeafNode]
NODE_KINDS = {"run": RunNode, "decide": DecisionNode, "differential": DifferentialNode, "diagnosis": LeafNode}
BRANCHING = (RunNode, DecisionNode)


@dataclass(frozen=True)
class Playbook:
    name: str
    path: str
    sha256: str
    entry: str
    # node attrs "spec"; "branches" on run and decision nodes, "candidates" on differential nodes;
    # edge attr "labels"
    graph: nx.DiGraph
    registry: Registry
    findings: tuple[tuple[Finding, Condition], ...]
    params: dict[str, Any]  # node or candidate id → validated Params of its experiment
    experiments: dict[str, str]  # node or candidate id → the experiment it runs

    def spec(self, node: str) -> Spec:
        return self.graph.nodes[node]["spec"]

    def branches(self, node: str) -> list[tuple[str, Optional[Condition]]]:
        """(target, condition) in the order written; the last is `otherwise` (condition None)."""
        return self.graph.nodes[node]["branches"]

    def candidates(self, node: str) -> list[tuple[str, Candidate, Optional[Condition]]]:
        """A differential node's (id, candidate, its `if` condition), in the order written."""
        return self.graph.nodes[node]["candidates"]

    def measured(self, node: str) -> dict[str, Condition]:
        """A differential node's candidates that declare the abnormality they repair, and its condition."""
        return self.graph.nodes[node]["measured"]


def default_playbook_path() -> Path:
    from triage.shipped import shipped_path

    return shipped_path("playbooks") / "default.yaml"


def load_playbook(path: Optional[Path] = None, registry: Optional[Registry] = None,
                  trust_imports: bool = False) -> Playbook:
    """Read and validate a playbook. Its `imports:` are Python modules, run when imported: they are
    refused unless `trust_imports` (`--trust-playbook`) says the user trusts them. Size limits:
    triage/walk/playbook/limits.py."""
    path = Path(path) if path else default_playbook_path()
    if not path.is_file():
        raise PlaybookError(f"Expected a playbook YAML file at '{path}', found none. Check --playbook.")
    try:
        text = limits.read_text(path)
        limits.check_yaml(text)
    except limits.LimitError as exc:
        raise PlaybookError(f"Playbook {path}: {exc}.") from None
    except OSError as exc:
        raise PlaybookError(f"Expected to read the playbook '{path}', found it unreadable ({exc.strerror or exc}). "
                            "Check --playbook.") from None
    raw, lines, candidate_lines = _parse_yaml(text, path)
    where = _Where(path, lines, candidate_lines)
    try:
        book = PlaybookFile.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise PlaybookError(where.say(None, _pydantic_message(exc))) from None
    _check_size(book, where)
    registry = (registry or default_registry()).copy()
    _check_trusted(book, trust_imports, where)
    _import_experiments(book, registry, where)
    _check_defaults(book, registry, where)
    graph, params, experiments = _build_graph(book, registry, where)
    _check_structure(graph, book.entry, where)
    refs = _Refs(graph, experiments, registry, where)
    _check_references(graph, book.entry, refs)
    findings = tuple((f, _condition(f.when, "findings", where)) for f in book.findings)
    for finding, condition in findings:
        refs.check(condition, f"finding '{finding.id}'")
        read = {node for node, _ in condition.refs}  # a finding shows only where its condition held: they ran
        for quoted in FIX_REF.findall(finding.text):
            refs.check(_condition(quoted, "findings", where), f"finding '{finding.id}'", allowed=read)
    return Playbook(name=book.name, path=str(path), sha256=hashlib.sha256(text.encode()).hexdigest(),
                    entry=book.entry, graph=graph, registry=registry, findings=findings, params=params,
                    experiments=experiments)


class _Where:
    """Formats errors as `file:line: node 'x': message` (or `candidate 'x'` for a differential's)."""

    def __init__(self, path: Path, lines: dict[str, int], candidate_lines: dict[str, int]) -> None:
        self.path, self.lines, self.candidate_lines = path, lines, candidate_lines

    def say(self, node: Optional[str], message: str) -> str:
        if node in self.candidate_lines and node not in self.lines:
            return f"Playbook {self.path}:{self.candidate_lines[node]}: candidate '{node}': {message}"
        line = f":{self.lines[node]}" if node in self.lines else ""
        at = f" node '{node}':" if node else ""
        return f"Playbook {self.path}{line}:{at} {message}"


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when installed: 10x faster, same result


def _parse_yaml(text: str, path: Path) -> tuple[Any, dict[str, int], dict[str, int]]:
    """The YAML's data, with the line of each node id and each differential candidate id (one parse)."""
    try:
        root = yaml.compose(text, Loader=_LOADER)
        data = _LOADER("").construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise PlaybookError(f"Playbook {path}{line}: expected valid YAML, found a syntax error "
                            f"({getattr(exc, 'problem', exc)}). Fix the YAML there.") from None
    twice = _first_duplicate_key(root)
    if twice:
        key, first, second, inside = twice
        what = f"node '{key}'" if inside == "nodes" else f"the key '{key}'" + (f" (under '{inside}')" if inside else "")
        raise PlaybookError(f"Playbook {path}:{second}: expected each key once in a mapping, found {what} at lines "
                            f"{first} and {second}; YAML would silently keep the later one. Rename or remove one.")
    return (data, *_node_lines(root))


def _first_duplicate_key(root: Any) -> Optional[tuple[str, int, int, str]]:
    """(key, first line, second line, the key of the mapping holding it) of the first key a YAML mapping
    holds twice; None when there is none. Iterative: the nesting is bounded (limits.py) but not small."""
    stack = [(root, "")]
    while stack:
        node, inside = stack.pop()
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key, value in node.value:
                name = str(key.value) if isinstance(key, yaml.ScalarNode) else None
                if name is not None and name in seen and name != "<<":
                    return name, seen[name], key.start_mark.line + 1, inside
                if name is not None:
                    seen[name] = key.start_mark.line + 1
                stack.append((value, name or inside))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, inside) for item in node.value)
    return None


def _node_lines(root: Any) -> tuple[dict[str, int], dict[str, int]]:
    """Line number (1-based) of each node id under `nodes:`, and of each differential candidate id."""
    if not isinstance(root, yaml.MappingNode):
        return {}, {}
    lines: dict[str, int] = {}
    candidates: dict[str, int] = {}
    for key, value in root.value:
        if key.value == "nodes" and isinstance(value, yaml.MappingNode):
            for node_key, node in value.value:
                lines[str(node_key.value)] = node_key.start_mark.line + 1
                for field_key, field in node.value if isinstance(node, yaml.MappingNode) else []:
                    if field_key.value == "differential" and isinstance(field, yaml.MappingNode):
                        candidates.update({str(k.value): k.start_mark.line + 1 for k, _ in field.value})
    return lines, candidates


def _pydantic_message(exc: pydantic.ValidationError) -> str:
    parts = []
    for error in exc.errors():
        loc = ".".join(str(p) for p in error["loc"])
        parts.append(f"{loc}: {error['msg']}" if loc else error["msg"])
    return "expected a valid playbook, found: " + "; ".join(parts)


def _check_size(book: PlaybookFile, where: _Where) -> None:
    candidates = sum(len(n["differential"]) for n in book.nodes.values()
                     if isinstance(n, dict) and isinstance(n.get("differential"), dict))
    try:
        limits.check_node_count(len(book.nodes), candidates)
    except limits.LimitError as exc:
        raise PlaybookError(where.say(None, f"{exc}.")) from None


def _check_trusted(book: PlaybookFile, trusted: bool, where: _Where) -> None:
    if book.imports and not trusted:
        raise PlaybookError(where.say(None, f"imports: expected no Python modules unless you trust them, found "
                                            f"{book.imports}, which would run their code on import. Conditions "
                                            "and parameters never run code; `imports:` does. If you trust these "
                                            "modules, pass --trust-playbook (triage.run(..., trust_playbook=True))."))


def _import_experiments(book: PlaybookFile, registry: Registry, where: _Where) -> None:
    # Like --entry: a team's modules live beside the playbook or in the folder triage runs from.
    for folder in (str(where.path.resolve().parent), str(Path.cwd())):
        if book.imports and folder not in sys.path:
            sys.path.insert(0, folder)
    for module_name in book.imports:
        try:
            module = importlib.import_module(module_name)
        except SystemExit as exc:  # sys.exit() at import time would end triage without a word
            raise PlaybookError(where.say(None, f"imports: expected '{module_name}' to import, found it called "
                                                f"sys.exit({exc.code!r}) while being imported. Move that call "
                                                "under `if __name__ == \"__main__\":`.")) from None
        except Exception as exc:
            raise PlaybookError(where.say(None, f"imports: could not import '{module_name}' "
                                                f"({type(exc).__name__}: {exc}). Make it importable.")) from None
        experiments = getattr(module, "EXPERIMENTS", None)
        if not isinstance(experiments, (list, tuple)) or not all(isinstance(e, Experiment) for e in experiments):
            found = "none" if experiments is None else f"a {type(experiments).__name__}" \
                if not isinstance(experiments, (list, tuple)) else \
                f"items of type {sorted({type(e).__name__ for e in experiments if not isinstance(e, Experiment)})}"
            raise PlaybookError(where.say(None, f"imports: expected '{module_name}' to define EXPERIMENTS "
                                                f"(a list of triage.Experiment), found {found}."))
        for experiment in experiments:
            try:
                registry.register(experiment)
            except ValueError as exc:
                raise PlaybookError(where.say(None, f"imports: {exc}")) from None


def _check_defaults(book: PlaybookFile, registry: Registry, where: _Where) -> None:
    for name in book.defaults:
        if registry.get(name) is None:
            raise PlaybookError(where.say(None, f"defaults: '{name}' is not a registered experiment. "
                                                f"Known: {registry.names()}."))


def _build_graph(book: PlaybookFile, registry: Registry, where: _Where):
    graph, params, experiments = nx.DiGraph(), {}, {}
    if book.entry not in book.nodes:
        raise PlaybookError(where.say(None, f"expected entry '{book.entry}' to be a node, found nodes "
                                            f"{sorted(book.nodes)}."))
    for node_id, raw in book.nodes.items():
        spec = _node_spec(node_id, raw, where)
        graph.add_node(node_id, spec=spec)
        if isinstance(spec, RunNode):
            params[node_id] = _node_params(node_id, spec.run, spec.with_, book, registry, where)
            experiments[node_id] = spec.run
            _warn_budget(node_id, spec.budget_s, where)
        elif isinstance(spec, DifferentialNode):
            for cid, candidate in spec.differential.items():
                _warn_budget(cid, candidate.budget_s, where)
                if cid in book.nodes or cid in experiments:
                    raise PlaybookError(where.say(cid, f"candidate id '{cid}' is already used by another node "
                                                       "or candidate; ids name experiments, so they must be unique."))
                params[cid] = _node_params(cid, candidate.run, candidate.with_, book, registry, where)
                experiments[cid] = candidate.run
    for node_id in list(graph.nodes):
        spec = graph.nodes[node_id]["spec"]
        if isinstance(spec, BRANCHING):
            targets = [(b.goto, _condition(b.when, node_id, where)) for b in spec.branches]
            targets.append((spec.otherwise, None))
            graph.nodes[node_id]["branches"] = targets
            edges = [(t, c.text if c else "otherwise") for t, c in targets]
        elif isinstance(spec, DifferentialNode):
            graph.nodes[node_id]["candidates"] = [
                (cid, c, _condition(c.if_, cid, where) if c.if_ else None) for cid, c in spec.differential.items()]
            graph.nodes[node_id]["measured"] = {
                cid: _condition(c.measured, cid, where) for cid, c in spec.differential.items() if c.measured}
            edges = [(c.then, f"{cid} works best") for cid, c in spec.differential.items() if c.then]
            edges.append((spec.otherwise, "no fix works"))
        else:
            continue
        for target, label in edges:
            if target not in graph:
                raise PlaybookError(where.say(node_id, f"goes to '{target}', which is not a node. "
                                                       f"Known nodes: {sorted(graph.nodes)}."))
            labels = graph.edges[node_id, target]["labels"] if graph.has_edge(node_id, target) else []
            graph.add_edge(node_id, target, labels=labels + [label])
    return graph, params, experiments


def _warn_budget(node_id: str, budget_s: Optional[float], where: _Where) -> None:
    """`budget_s` once cut an experiment after so many seconds, which made the verdict depend on the
    machine's speed. Read and ignored, so that an older playbook still loads."""
    if budget_s is not None:
        log.warning(where.say(node_id, f"budget_s: {budget_s:g} is ignored: an experiment runs its steps "
                                       "whatever the machine's speed; bound the whole walk with --max-minutes "
                                       "instead, and remove budget_s."))


def _node_spec(node_id: str, raw: Any, where: _Where) -> Spec:
    kinds = [key for key in NODE_KINDS if isinstance(raw, dict) and key in raw]
    if len(kinds) != 1:
        found = " and ".join(f"`{k}:`" for k in kinds) if kinds else "none of them"
        raise PlaybookError(where.say(node_id, "expected one of `run:` (an experiment), `decide:` (branches "
                                               "only), `differential:` (candidate fixes) or `diagnosis:` "
                                               f"(a leaf), found {found}."))
    try:
        spec = NODE_KINDS[kinds[0]].model_validate(raw)
    except pydantic.ValidationError as exc:
        raise PlaybookError(where.say(node_id, _pydantic_message(exc))) from None
    if isinstance(spec, LeafNode) and spec.diagnosis not in ROOT_CAUSES and not spec.title:
        raise PlaybookError(where.say(node_id, f"diagnosis '{spec.diagnosis}' is not a known root cause; "
                                               "give it a `title:` to declare it as your own."))
    if isinstance(spec, LeafNode):
        unknown = sorted(set(spec.location) - set(LOCATION_KEYS))
        if unknown:
            raise PlaybookError(where.say(node_id, f"location keys {unknown} are unknown; use {LOCATION_KEYS}."))
    return spec


def _node_params(node_id: str, run: str, with_: dict[str, Any], book: PlaybookFile, registry: Registry,
                 where: _Where):
    experiment = registry.get(run)
    if experiment is None:
        raise PlaybookError(where.say(node_id, f"runs '{run}', which is not a registered experiment. "
                                               f"Known: {registry.names()}."))
    try:
        return experiment.params.model_validate({**book.defaults.get(run, {}), **with_})
    except pydantic.ValidationError as exc:
        bad = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        known = ", ".join(experiment.params.model_fields)
        raise PlaybookError(where.say(node_id, f"parameters of '{run}' are wrong ({bad}). "
                                               f"Its parameters: {known}.")) from None


def _condition(text: str, node_id: str, where: _Where) -> Condition:
    try:
        return parse_condition(text)
    except ConditionError as exc:
        raise PlaybookError(where.say(node_id, str(exc))) from None


def _check_structure(graph: nx.DiGraph, entry: str, where: _Where) -> None:
    try:
        cycle = nx.find_cycle(graph, source=entry)
    except nx.NetworkXNoCycle:
        cycle = None
    if cycle:
        loop = " → ".join([u for u, _ in cycle] + [cycle[0][0]])
        raise PlaybookError(where.say(cycle[0][0], f"is on a cycle ({loop}); a playbook must be acyclic."))
    reachable = nx.descendants(graph, entry) | {entry}
    for node_id in graph.nodes:
        if node_id not in reachable:
            raise PlaybookError(where.say(node_id, f"cannot be reached from the entry '{entry}'. "
                                                   "Point a branch at it, or remove it."))


class _Refs:
    """Checks what a condition or a parameter names: an experiment (a run node or a candidate) that
    runs before the point that reads it, and a field its outcome has."""

    def __init__(self, graph: nx.DiGraph, experiments: dict[str, str], registry: Registry, where: _Where):
        self.graph, self.experiments, self.registry, self.where = graph, experiments, registry, where

    def with_candidates(self, nodes: set[str]) -> set[str]:
        """`nodes` and the candidates of the differential nodes among them (those ran there)."""
        out = set(nodes)
        for n in nodes:
            if isinstance(self.graph.nodes[n]["spec"], DifferentialNode):
                out |= set(self.graph.nodes[n]["spec"].differential)
        return out

    def check(self, condition: Condition, at: str, allowed: Optional[set[str]] = None) -> None:
        for ref, field in condition.refs:
            if ref == "setup":
                if field not in SETUP_FACTS:
                    raise PlaybookError(self.where.say(at, f"'setup.{field}' is unknown; setup facts: {SETUP_FACTS}."))
                continue
            if ref not in self.experiments:
                raise PlaybookError(self.where.say(at, f"{condition.quoted} names '{ref}', "
                                                       "which is not an experiment node or candidate."))
            if allowed is not None and ref not in allowed:
                raise PlaybookError(self.where.say(at, f"{condition.quoted} reads '{ref}', which does not "
                                                       "always run before this point; read only nodes on every "
                                                       "path from the entry."))
            self.field(ref, field, at, condition.quoted)
        try:
            check_types(condition, self.kinds)
        except ConditionError as exc:
            raise PlaybookError(self.where.say(at, str(exc))) from None

    def kinds(self, ref: str, field: str) -> Kinds:
        """What `ref.field` can hold: its declared type, or none (an experiment that failed measured nothing)."""
        if ref == "setup":
            return kinds_of(SetupFacts.model_fields[field].annotation)
        if field in RUN_FIELDS:
            return Kinds({NUMBER} if field == "seconds" else {STR, NONE} if field == "error" else {STR})
        return kinds_of(self.registry.get(self.experiments[ref]).outcome.model_fields[field].annotation) | {NONE}

    def field(self, ref: str, field: str, at: str, what: str) -> None:
        outcome = self.registry.get(self.experiments[ref]).outcome
        if field == "seconds":
            raise PlaybookError(self.where.say(at, f"{what} reads '{ref}.seconds', the experiment's wall time: a "
                                                   "decision must not depend on how fast the machine is (the same "
                                                   "checkpoint gets the same verdict everywhere). Read what it "
                                                   "measured instead, in steps of the run (steps_run, ...)."))
        if field not in outcome.model_fields and field not in RUN_FIELDS:
            raise PlaybookError(self.where.say(at, f"{what}: '{ref}' runs '{self.experiments[ref]}', whose "
                                                   f"outcome has no field '{field}'. "
                                                   f"Fields: {sorted(outcome.model_fields)}."))

    def params(self, at: str, run: str, with_: dict[str, Any], allowed: set[str]) -> None:
        """Parameters that name another node (`skip_outliers_of: batches`) must name one that ran before."""
        for name, spec in self.registry.get(run).params.model_fields.items():
            extra = spec.json_schema_extra if isinstance(spec.json_schema_extra, dict) else {}
            wanted, ref = extra.get("node_runs"), with_.get(name)
            if wanted is None or ref is None:
                continue
            wanted = [wanted] if isinstance(wanted, str) else list(wanted)
            if self.experiments.get(ref) not in wanted or ref not in allowed:
                raise PlaybookError(self.where.say(at, f"{name}: '{ref}' must be a node that runs "
                                                       f"{' or '.join(map(repr, wanted))} on every path before "
                                                       "this one."))


def _check_references(graph: nx.DiGraph, entry: str, refs: _Refs) -> None:
    """Conditions, parameters, evidence and locations may only name experiments that ran before them."""
    dominators = nx.immediate_dominators(graph, entry)
    ran: dict[str, set[str]] = {entry: set()}  # node -> what runs on every path to it (with candidates)
    for node_id in nx.topological_sort(graph):
        if node_id != entry:
            d = dominators[node_id]
            ran[node_id] = ran[d] | refs.with_candidates({d})

    for node_id, data in graph.nodes(data=True):
        spec = data["spec"]
        before = ran[node_id]
        if isinstance(spec, BRANCHING):
            if isinstance(spec, RunNode):
                refs.params(node_id, spec.run, spec.with_, before)
                before = before | {node_id}
            for _, condition in data["branches"][:-1]:
                refs.check(condition, node_id, allowed=before)
        elif isinstance(spec, DifferentialNode):
            _check_candidates(node_id, spec, data["candidates"], data["measured"], before, refs)
        else:
            _check_leaf(node_id, spec, refs.with_candidates(nx.ancestors(graph, node_id)), refs)


def _check_candidates(node_id: str, spec: DifferentialNode, candidates, measured: dict[str, Condition],
                      before: set[str], refs: _Refs) -> None:
    earlier: set[str] = set()
    for cid, candidate, condition in candidates:
        for check in (condition, measured.get(cid)):
            if check is not None:
                refs.check(check, cid, allowed=before | earlier)
        refs.params(cid, candidate.run, candidate.with_, before | earlier)
        if candidate.then:
            refs.field(cid, spec.works, cid, f"works: {spec.works}")
            refs.field(cid, spec.score, cid, f"score: {spec.score}")
        earlier.add(cid)
    if not any(c.then for _, c, _ in candidates):
        raise PlaybookError(refs.where.say(node_id, "expected at least one candidate with `then:` (a cause it "
                                                    "leads to), found only controls."))


def _check_leaf(node_id: str, spec: LeafNode, ran_before: set[str], refs: _Refs) -> None:
    for ref in spec.evidence + ([spec.proof] if spec.proof else []):
        if ref not in ran_before or ref not in refs.experiments:
            raise PlaybookError(refs.where.say(node_id, f"evidence/proof '{ref}' must be an experiment node or "
                                                        "candidate on a path to this leaf."))
    for text in [*spec.location.values(), *spec.fix_refs()]:
        refs.check(_condition(text, node_id, refs.where), node_id, allowed=ran_before)
