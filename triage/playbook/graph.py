"""Loading a playbook: YAML → pydantic → a validated networkx DiGraph, before anything runs.

Errors name the file, the node and its line: unknown experiments or parameters, dangling gotos,
cycles, unreachable nodes, leaves without a diagnosis, conditions on unknown fields or on nodes
that may not have run yet.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import networkx as nx
import pydantic
import yaml

from triage.causes import ROOT_CAUSES
from triage.errors import PlaybookError
from triage.experiments import Registry, default_registry
from triage.playbook.conditions import Condition, ConditionError, parse_condition
from triage.playbook.schema import Finding, LeafNode, PlaybookFile, RunNode
from triage.records import SetupFacts

SETUP_FACTS = tuple(SetupFacts.model_fields)
RUN_FIELDS = ("status", "seconds")  # every ExperimentRun has these besides its outcome's fields
LOCATION_KEYS = ("module", "op", "source", "batch", "parameters")


@dataclass(frozen=True)
class Playbook:
    name: str
    path: str
    sha256: str
    entry: str
    graph: nx.DiGraph  # node attrs "spec" and, on run nodes, "branches"; edge attr "labels"
    registry: Registry
    findings: tuple[tuple[Finding, Condition], ...]
    params: dict[str, Any]  # node id → validated Params of its experiment

    def spec(self, node: str) -> Union[RunNode, LeafNode]:
        return self.graph.nodes[node]["spec"]

    def branches(self, node: str) -> list[tuple[str, Optional[Condition]]]:
        """(target, condition) in the order written; the last is `otherwise` (condition None)."""
        return self.graph.nodes[node]["branches"]


def default_playbook_path() -> Path:
    from triage.shipped import shipped_path

    return shipped_path("playbooks") / "default.yaml"


def load_playbook(path: Optional[Path] = None, registry: Optional[Registry] = None) -> Playbook:
    path = Path(path) if path else default_playbook_path()
    if not path.is_file():
        raise PlaybookError(f"Expected a playbook YAML file at '{path}', found none. Check --playbook.")
    text = path.read_text()
    lines = _node_lines(text, path)
    raw = _parse_yaml(text, path)
    where = _Where(path, lines)
    try:
        book = PlaybookFile.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise PlaybookError(where.say(None, _pydantic_message(exc))) from None
    registry = (registry or default_registry()).copy()
    _import_experiments(book, registry, where)
    graph, params = _build_graph(book, registry, where)
    _check_structure(graph, book.entry, where)
    _check_references(graph, book.entry, registry, where)
    findings = tuple((f, _condition(f.when, "findings", where)) for f in book.findings)
    for finding, condition in findings:
        _check_refs_exist(condition, graph, registry, where, f"finding '{finding.id}'")
    return Playbook(name=book.name, path=str(path), sha256=hashlib.sha256(text.encode()).hexdigest(),
                    entry=book.entry, graph=graph, registry=registry, findings=findings, params=params)


class _Where:
    """Formats errors as `file:line: node 'x': message`."""

    def __init__(self, path: Path, lines: dict[str, int]) -> None:
        self.path, self.lines = path, lines

    def say(self, node: Optional[str], message: str) -> str:
        line = f":{self.lines[node]}" if node in self.lines else ""
        at = f" node '{node}':" if node else ""
        return f"Playbook {self.path}{line}:{at} {message}"


def _parse_yaml(text: str, path: Path) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise PlaybookError(f"Playbook {path}{line}: expected valid YAML, found a syntax error "
                            f"({getattr(exc, 'problem', exc)}). Fix the YAML there.") from None


def _node_lines(text: str, path: Path) -> dict[str, int]:
    """Line number of each node id under `nodes:` (1-based), for error messages."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    if not isinstance(root, yaml.MappingNode):
        return {}
    for key, value in root.value:
        if key.value == "nodes" and isinstance(value, yaml.MappingNode):
            return {k.value: k.start_mark.line + 1 for k, _ in value.value}
    return {}


def _pydantic_message(exc: pydantic.ValidationError) -> str:
    parts = []
    for error in exc.errors():
        loc = ".".join(str(p) for p in error["loc"])
        parts.append(f"{loc}: {error['msg']}" if loc else error["msg"])
    return "expected a valid playbook, found: " + "; ".join(parts)


def _import_experiments(book: PlaybookFile, registry: Registry, where: _Where) -> None:
    # Like --entry: a team's modules live beside the playbook or in the folder triage runs from.
    for folder in (str(where.path.resolve().parent), str(Path.cwd())):
        if book.imports and folder not in sys.path:
            sys.path.insert(0, folder)
    for module_name in book.imports:
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            raise PlaybookError(where.say(None, f"imports: could not import '{module_name}' "
                                                f"({type(exc).__name__}: {exc}). Make it importable.")) from None
        experiments = getattr(module, "EXPERIMENTS", None)
        if experiments is None:
            raise PlaybookError(where.say(None, f"imports: expected '{module_name}' to define EXPERIMENTS "
                                                "(a list of triage Experiment), found none."))
        for experiment in experiments:
            try:
                registry.register(experiment)
            except ValueError as exc:
                raise PlaybookError(where.say(None, f"imports: {exc}")) from None


def _build_graph(book: PlaybookFile, registry: Registry, where: _Where):
    graph, params = nx.DiGraph(), {}
    if book.entry not in book.nodes:
        raise PlaybookError(where.say(None, f"expected entry '{book.entry}' to be a node, found nodes "
                                            f"{sorted(book.nodes)}."))
    for node_id, raw in book.nodes.items():
        spec = _node_spec(node_id, raw, where)
        graph.add_node(node_id, spec=spec)
        if isinstance(spec, RunNode):
            params[node_id] = _node_params(node_id, spec, registry, where)
    for node_id in list(graph.nodes):
        spec = graph.nodes[node_id]["spec"]
        if isinstance(spec, LeafNode):
            continue
        targets = [(b.goto, _condition(b.when, node_id, where)) for b in spec.branches]
        targets.append((spec.otherwise, None))
        for target, condition in targets:
            if target not in graph:
                raise PlaybookError(where.say(node_id, f"goes to '{target}', which is not a node. "
                                                       f"Known nodes: {sorted(graph.nodes)}."))
            labels = graph.edges[node_id, target]["labels"] if graph.has_edge(node_id, target) else []
            graph.add_edge(node_id, target, labels=labels + [condition.text if condition else "otherwise"])
        graph.nodes[node_id]["branches"] = targets
    return graph, params


def _node_spec(node_id: str, raw: Any, where: _Where) -> Union[RunNode, LeafNode]:
    if not isinstance(raw, dict) or ("run" in raw) == ("diagnosis" in raw):
        raise PlaybookError(where.say(node_id, "expected either `run:` (an experiment) or `diagnosis:` "
                                               "(a leaf), found " + (
                                                   "both" if isinstance(raw, dict) and "run" in raw
                                                   else "neither") + "."))
    model = RunNode if "run" in raw else LeafNode
    try:
        spec = model.model_validate(raw)
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


def _node_params(node_id: str, spec: RunNode, registry: Registry, where: _Where):
    experiment = registry.get(spec.run)
    if experiment is None:
        raise PlaybookError(where.say(node_id, f"runs '{spec.run}', which is not a registered experiment. "
                                               f"Known: {registry.names()}."))
    try:
        return experiment.params.model_validate(spec.with_)
    except pydantic.ValidationError as exc:
        bad = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        known = ", ".join(experiment.params.model_fields)
        raise PlaybookError(where.say(node_id, f"parameters of '{spec.run}' are wrong ({bad}). "
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


def _check_references(graph: nx.DiGraph, entry: str, registry: Registry, where: _Where) -> None:
    """Conditions, evidence and locations may only name experiments that ran before them."""
    dominators = nx.immediate_dominators(graph, entry)

    def must_have_run(node_id: str) -> set[str]:
        ran, current = set(), node_id
        while current != entry:
            current = dominators[current]
            ran.add(current)
        return ran

    for node_id, data in graph.nodes(data=True):
        spec = data["spec"]
        before = must_have_run(node_id)
        if isinstance(spec, RunNode):
            _check_node_params(node_id, spec, graph, registry, before, where)
            for _, condition in data["branches"][:-1]:
                _check_refs_exist(condition, graph, registry, where, node_id, allowed=before | {node_id})
            continue
        ancestors = nx.ancestors(graph, node_id)
        for ref in spec.evidence + ([spec.proof] if spec.proof else []):
            if ref not in ancestors or not isinstance(graph.nodes[ref]["spec"], RunNode):
                raise PlaybookError(where.say(node_id, f"evidence/proof '{ref}' must be an experiment node "
                                                       "on a path to this leaf."))
        for key, text in spec.location.items():
            condition = _condition(text, node_id, where)
            _check_refs_exist(condition, graph, registry, where, node_id, allowed=ancestors)


def _check_node_params(node_id: str, spec: RunNode, graph: nx.DiGraph, registry: Registry,
                       before: set[str], where: _Where) -> None:
    """Parameters that name another node (`skip_outliers_of: batches`) must name one that ran before."""
    for name, field in registry.get(spec.run).params.model_fields.items():
        wanted = (field.json_schema_extra or {}).get("node_runs") if isinstance(field.json_schema_extra, dict) else None
        ref = spec.with_.get(name)
        if wanted is None or ref is None:
            continue
        runs = graph.nodes[ref]["spec"].run if ref in graph and isinstance(graph.nodes[ref]["spec"], RunNode) else None
        if runs != wanted or ref not in before:
            raise PlaybookError(where.say(node_id, f"{name}: '{ref}' must be a node that runs '{wanted}' on every "
                                                   "path before this one."))


def _check_refs_exist(condition: Condition, graph: nx.DiGraph, registry: Registry, where: _Where,
                      node_id: str, allowed: Optional[set[str]] = None) -> None:
    for ref_node, field in condition.refs:
        if ref_node == "setup":
            if field not in SETUP_FACTS:
                raise PlaybookError(where.say(node_id, f"'setup.{field}' is unknown; setup facts: {SETUP_FACTS}."))
            continue
        if ref_node not in graph or not isinstance(graph.nodes[ref_node]["spec"], RunNode):
            raise PlaybookError(where.say(node_id, f"'{condition.text}' names '{ref_node}', "
                                                   "which is not an experiment node."))
        if allowed is not None and ref_node not in allowed:
            raise PlaybookError(where.say(node_id, f"'{condition.text}' reads '{ref_node}', which does not "
                                                   "always run before this point; read only nodes on every "
                                                   "path from the entry."))
        outcome = registry.get(graph.nodes[ref_node]["spec"].run).outcome
        if field not in outcome.model_fields and field not in RUN_FIELDS:
            raise PlaybookError(where.say(node_id, f"'{condition.text}': '{ref_node}' runs "
                                                   f"'{graph.nodes[ref_node]['spec'].run}', whose outcome has no "
                                                   f"field '{field}'. Fields: {sorted(outcome.model_fields)}."))
