"""mkdocs hook: reference tables generated at build time from the code, never pasted.

A page asks for one with a marker on a line of its own, `<!-- generated: NAME -->`; the hook puts the
table in its place. An unknown NAME, or a source that cannot be read, fails the build (so `mkdocs build
--strict` in CI catches a page that asks for a table nobody makes). What each NAME reads:

    root-causes        triage/causes.py's ROOT_CAUSES, and the default playbook's leaves that reach each
    playbook-nodes     playbooks/default.yaml, loaded and validated as `triage run` loads it
    experiments        the experiment registry: each experiment's name, summary and parameters
    named-rules        triage/judge/named.py: the symptom rules a playbook calls by name
    suite-results      docs/data/suite/*.json, as `python benchmarks/suite.py --json FILE` writes them
    programs-results   docs/data/programs/*.json, as `python benchmarks/programs.py --json FILE` writes them
    programs-kinds     those files' tune split, per kind of program
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Callable

from mkdocs.exceptions import PluginError

DOCS = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


def on_page_markdown(markdown: str, page, config, files) -> str:
    def replace(match: re.Match) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise PluginError(f"{page.file.src_path}: no generator '{name}' (known: {', '.join(sorted(GENERATORS))})")
        return GENERATORS[name]()
    return MARKER.sub(replace, markdown)


def _cell(text: object) -> str:
    """Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(head: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _playbook():
    from triage.walk.playbook.graph import load_playbook

    return load_playbook()


def root_causes() -> str:
    from triage.causes import ROOT_CAUSES
    from triage.walk.playbook.schema import LeafNode

    book = _playbook()
    leaves: dict[str, list[str]] = {}
    for node in book.graph.nodes:
        spec = book.spec(node)
        if isinstance(spec, LeafNode):
            leaves.setdefault(spec.diagnosis, []).append(f"`{node}`")
    rows = [[f"`{cause}`", title, ", ".join(leaves.get(cause, [])) or "—"] for cause, title in ROOT_CAUSES.items()]
    return _table(["id (`root_cause`)", "title", "leaves of the default playbook that reach it"], rows)


def playbook_nodes() -> str:
    from triage.walk.playbook.schema import DecisionNode, DifferentialNode, LeafNode, RunNode

    book = _playbook()
    rows = []
    for node in book.graph.nodes:
        spec = book.spec(node)
        if isinstance(spec, LeafNode):
            rows.append([f"`{node}`", f"leaf: `{spec.diagnosis}` ({spec.confidence} at most)", spec.fix, "—"])
            continue
        if isinstance(spec, DifferentialNode):
            tried = [f"`{cid}` ({c.run}, tier {c.tier}" + (f" → `{c.then}`)" if c.then else ", control)")
                     for cid, c in spec.differential.items()]
            kind, asks, goes = "differential", spec.title or "", "; ".join(tried) + f"; none works → `{spec.otherwise}`"
        else:
            kind = f"run `{spec.run}`" if isinstance(spec, RunNode) else "decide"
            asks = spec.title or ""
            goes = "; ".join(f"`{b.when}` → `{b.goto}`" for b in spec.branches) + f"; otherwise → `{spec.otherwise}`"
        rows.append([f"`{node}`", kind, asks, goes])
    head = f"`{Path(book.path).name}`: {book.graph.number_of_nodes()} nodes, entry `{book.entry}`.\n\n"
    return head + _table(["node", "kind", "asks (or fix, for a leaf)", "goes to"], rows)


def experiments() -> str:
    from triage.experiments import default_registry

    rows = []
    for experiment in sorted(default_registry(), key=lambda e: e.name):
        params = ", ".join(f"`{name}`" for name in experiment.params.model_fields) or "—"
        rows.append([f"`{experiment.name}`", experiment.summary, params])
    return _table(["experiment", "what it measures", "parameters (`with:`)"], rows)


def named_rules() -> str:
    from triage.judge.named import NAMED

    rows = [[f"`{name}({', '.join(rule.nodes)})`", rule.says] for name, rule in NAMED.items()]
    return _table(["rule", "holds when"], rows)


def suite_results() -> str:
    folder = DOCS / "data" / "suite"
    found = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not found:
        return ("*No results are committed yet.* `python benchmarks/suite.py --split heldout --json "
                "docs/data/suite/heldout.json` writes them, and the next build tables them here.\n")
    rows = []
    for path in found:
        try:
            cases = json.loads(path.read_text())
        except ValueError as exc:
            raise PluginError(f"{path}: not the JSON benchmarks/suite.py --json writes ({exc})") from None
        rows.append(_suite_row(path.stem, cases))
    return _table(["results file", "valid runs", "top-1", "healthy called faulty", "faults called healthy",
                   "high: right", "medium: right", "s per run (median)"], rows)


def _suite_row(name: str, cases: list[dict]) -> list[object]:
    valid = [c for c in cases if c.get("valid") and c.get("predicted") is not None]
    right = [c for c in valid if c["predicted"] == c["expected"]]
    healthy = [c for c in valid if c["expected"] == "healthy"]
    faults = [c for c in valid if c["expected"] != "healthy"]

    def share(part: list, whole: list) -> str:
        return f"{100 * len(part) / len(whole):.1f}% of {len(whole)}" if whole else "—"

    def at(level: str) -> str:
        chosen = [c for c in valid if c.get("confidence") == level]
        return share([c for c in chosen if c["predicted"] == c["expected"]], chosen)

    seconds = [c["seconds"] for c in valid if c.get("seconds") is not None]
    return [f"`{name}.json`", len(valid), share(right, valid),
            f"{sum(c['predicted'] != 'healthy' for c in healthy)} / {len(healthy)}",
            f"{sum(c['predicted'] == 'healthy' for c in faults)} / {len(faults)}",
            at("high"), at("medium"), f"{statistics.median(seconds):.1f}" if seconds else "—"]


def _programs_files() -> list[tuple[str, dict]]:
    folder = DOCS / "data" / "programs"
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            found.append((path.stem, json.loads(path.read_text())))
        except ValueError as exc:
            raise PluginError(f"{path}: not the JSON benchmarks/programs.py --json writes ({exc})") from None
    if not found:
        raise PluginError(f"{folder}: no results of benchmarks/programs.py --json to table")
    return found


def _share(part: dict) -> str:
    return f"{part['right']}/{part['of']} = {100 * part['right'] / part['of']:.1f}%" if part["of"] else "—"


def programs_results() -> str:
    rows = []
    for name, body in _programs_files():
        # Each split the file holds runs of (a tuned figure of the tune split alone has no held-back part), and
        # all of them together where it holds more than one.
        splits = [s for s, f in body["summary"].items() if s != "every program" and f["runs"]]
        for split in splits + (["every program"] if len(splits) > 1 else []):
            f = body["summary"][split]
            rows.append([f"`{name}.json`", split, f"{f['runs']} ({f['programs']})", _share(f["top1"]),
                         _share(f["high"]), _share(f["medium"]), _share(f["low"]),
                         f"{f['healthy_called_faulty']} / {f['healthy_runs']} ({f['healthy_called_faulty_high']} high)",
                         f"{f['faulty_called_healthy']} / {f['faulty_runs']}"])
    return _table(["results file", "split", "runs (programs)", "top-1", "high: right", "medium: right",
                   "low: right", "healthy called faulty", "faulty called healthy"], rows)


def programs_kinds() -> str:
    files = [(name, body) for name, body in _programs_files() if body["summary"]["tune"]["runs"]]
    kinds = sorted({kind for _, body in files for kind in body["summary"]["tune"]["by_kind"]})
    rows = [[kind] + [_share(body["summary"]["tune"]["by_kind"].get(kind, {"right": 0, "of": 0}))
                      for _, body in files] for kind in kinds]
    return ("The tune split per kind of program (the held-back third is not broken down):\n\n"
            + _table(["kind of program"] + [f"`{name}.json`" for name, _ in files], rows))


GENERATORS: dict[str, Callable[[], str]] = {
    "root-causes": root_causes,
    "playbook-nodes": playbook_nodes,
    "experiments": experiments,
    "named-rules": named_rules,
    "suite-results": suite_results,
    "programs-results": programs_results,
    "programs-kinds": programs_kinds,
}
