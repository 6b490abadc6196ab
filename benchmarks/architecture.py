"""The shape of the package, measured: issue 24's before/after table for whatever tree it runs on.

    python benchmarks/architecture.py [--root triage] [--list] [--example lr_too_high]

What each row counts:

- rooms: the package's modules (every .py file, `__init__.py` included).
- floors: the layers of DESIGN §6, lowest first, as FLOORS below assigns them: the layering issue 24 asks
  for, applied alike to the tree before and after the move (an arrow up is an import that breaks it). A module's floor is the
  floor of the longest entry of FLOORS that is its dotted name or a package above it (`triage.report.plots`
  takes `triage.report`'s floor unless it has an entry of its own). FLOORS names the modules of both the
  flat layout (before issue 24) and the layout by layer, so the same script measures either tree.
  A module that no entry covers is printed as `unassigned` and counted as one.
- folders across floors: the package's folders (below triage/) whose own modules sit on more than one floor
  (`distributed/` held launch, checkpoint, replay and report code); and the modules flat in triage/ that
  are not foundations (`__main__.py` must stay there for `python -m triage`).
- arrows up: imports (at any depth of the file: lazy imports inside functions count; `if TYPE_CHECKING:`
  blocks do not) from a module on a lower floor to one on a higher floor. `--list` names each.
- circles: strongly connected components of more than one module in the graph of those imports
  (networkx). Only the imports written in the files are edges, not the implicit import of a package's
  `__init__` that Python performs before a submodule.
- checkpoint path: the triage source files in which a function runs (sys.setprofile; the code of a
  module body that a lazy import runs is not counted) while the session loader turns a zoo example's
  checkpoint into a loaded Session: setup() called, checkpoint read and loaded, snapshot taken. The
  example's checkpoint is written first (the zoo's `demo_checkpoint`) and every module imported before the
  trace starts. `calls up a floor` counts the calls, during that load, from a function in one triage file
  into one on a higher floor.
- outcome reads by string: a heuristic, AST only, that cannot see every case. It counts
  (a) `X.get("<literal>")` and `X["<literal>"]` where X is an outcome: an expression whose source mentions
      `outcome`, or a variable named out, ref, reference or proof (the report's names for an outcome dict);
  (b) `getattr(X, F)` where X is such an outcome, F a literal or a name held in data (the condition
      language's reads, a node's field in a replay).
  Only modules above the load floor are read (no outcome exists below). It does not count reads through
  a variable of another name (`getattr(facts, name)`, a reduction's `getattr(o, name)`), the view
  declarations (`Curve(field="losses")`: checked against the Outcome when an experiment registers), the
  templates, tests, nor text parsed with regular expressions. It prints the sites and the functions
  holding them (the `places`).
- longest function: the def with the most lines (AST, decorators excluded).
- lines: all lines of the package's .py files, and the code lines among them (not blank, not only a comment).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import sys
from collections import Counter
from pathlib import Path
from typing import Iterator, Optional

import networkx as nx

# The floors of DESIGN §6, lowest first. A module may import from its own floor and those below it.
FLOOR_ORDER = ("foundation", "judge", "capture", "load", "experiments", "walk", "report", "cli")

FLOORS = {
    # foundation: the vocabulary every floor shares (no torch training, no reading of files)
    "triage": "foundation", "triage.errors": "foundation", "triage.contract": "foundation",
    "triage.optimizer_set": "foundation", "triage.atomic": "foundation", "triage.batches": "foundation",
    "triage.causes": "foundation", "triage.records": "foundation", "triage.views": "foundation",
    "triage.shipped": "foundation", "triage.user_cache": "foundation", "triage.ties": "foundation",
    "triage.speedups": "foundation", "triage.outcomes": "foundation",  # what each experiment measures, declared
    # capture: what runs inside the user's training process and writes a capture folder
    "triage.capture": "capture", "triage.flight": "capture", "triage.integrations": "capture",
    # load: entry + checkpoint -> Session; every checkpoint layout and framework route; the ranks it opens on
    "triage.load": "load", "triage.checkpoint": "load", "triage.entry": "load", "triage.session": "load",
    "triage.snapshot": "load", "triage.optimizer_fit": "load", "triage.history": "load",
    "triage.data_guard": "load", "triage.disagreements": "load",
    "triage.integrations.derive": "load", "triage.integrations.lightning_setup": "load",
    "triage.integrations.transformers_setup": "load", "triage.integrations.tensorboard": "load",
    "triage.distributed": "load",
    # experiments: the only code that runs training; each returns an Outcome
    "triage.experiments": "experiments", "triage.distributed.fingerprint": "experiments",
    # judge: pure functions of figures already measured (what "the fix works" means, the differential's winner,
    # the extension rule, the levels a loss is judged against): every floor that decides may ask it
    "triage.judge": "judge",
    # walk: the playbook, its graph and conditions, the engine that walks it
    "triage.walk": "walk", "triage.engine": "walk", "triage.forked": "walk", "triage.playbook": "walk",
    "triage.distributed.settle": "walk", "triage.distributed.reduce": "walk",
    # report: schema, build, rendering
    "triage.report": "report", "triage.distributed.describe": "report",
    # cli: the front doors (the command line, triage.run, the terminal's view, watch, bench, the zoo)
    "triage.cli": "cli", "triage.__main__": "cli", "triage.api": "cli", "triage.bench": "cli",
    "triage.zoo": "cli", "triage.progress": "cli", "triage.verdict": "cli", "triage.watch": "cli",
}

OUTCOME_NAMES = {"out", "ref", "reference", "proof"}


def floor_of(module: str) -> str:
    name = module
    while name:
        if name in FLOORS:
            return FLOORS[name]
        name = name.rpartition(".")[0]
    return "unassigned"


def rank(floor: str) -> int:
    return FLOOR_ORDER.index(floor) if floor in FLOOR_ORDER else -1


def modules(root: Path) -> dict[str, Path]:
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _nodes_outside_type_checking(tree: ast.AST) -> Iterator[ast.AST]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for n in node.orelse for n in [n, *_nodes_outside_type_checking(n)])
            continue
        yield node
        yield from _nodes_outside_type_checking(node)


def imports(mods: dict[str, Path]) -> nx.DiGraph:
    """module -> module it imports (its own package's modules only)."""

    def known(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph = nx.DiGraph()
    graph.add_nodes_from(mods)
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _nodes_outside_type_checking(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [known(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else known(base) for a in node.names]
            for target in targets:
                if target and target != name and target in mods:
                    graph.add_edge(name, target)
    return graph


def arrows_up(graph: nx.DiGraph) -> list[tuple[str, str]]:
    return sorted((a, b) for a, b in graph.edges if rank(floor_of(a)) < rank(floor_of(b)))


def circles(graph: nx.DiGraph) -> list[list[str]]:
    return sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)


def _is_outcome(expr: ast.AST) -> bool:
    return "outcome" in ast.unparse(expr) or (isinstance(expr, ast.Name) and expr.id in OUTCOME_NAMES)


def _literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def string_reads(mods: dict[str, Path], root: Path) -> list[tuple[str, str, int, str]]:
    """(file, function, line, source) of each read of an outcome by string (see the module docstring)."""
    sites = []
    for name, path in mods.items():
        if rank(floor_of(name)) <= rank("load"):  # no outcome exists below the experiments
            continue
        tree = ast.parse(path.read_text())
        owners = {}
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(fn):
                    owners[id(inner)] = fn.name  # ast.walk is breadth-first: the innermost def wins
        for node in ast.walk(tree):
            hit = False
            if isinstance(node, ast.Call):
                f = node.func
                if (isinstance(f, ast.Attribute) and f.attr == "get" and node.args and _literal(node.args[0])
                        and _is_outcome(f.value)):
                    hit = True
                elif isinstance(f, ast.Name) and f.id == "getattr" and len(node.args) >= 2:
                    hit = _is_outcome(node.args[0])
            elif isinstance(node, ast.Subscript) and _literal(node.slice) and _is_outcome(node.value):
                hit = True
            if hit:
                rel = str(path.relative_to(root.parent))
                sites.append((rel, owners.get(id(node), "<module>"), node.lineno, ast.unparse(node)[:90]))
    return sorted(sites)


def longest_function(mods: dict[str, Path], root: Path) -> tuple[int, str]:
    best = (0, "")
    for path in mods.values():
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = fn.end_lineno - fn.lineno + 1
                best = max(best, (lines, f"{path.relative_to(root.parent)}:{fn.name}"))
    return best


def lines(mods: dict[str, Path]) -> tuple[int, int]:
    total = code = 0
    for path in mods.values():
        for line in path.read_text().splitlines():
            total += 1
            code += bool(line.strip()) and not line.strip().startswith("#")
    return total, code


def _session_loader():
    """The function that turns entry + checkpoint into a Session, wherever this tree keeps it."""
    for name in ("triage.load.session", "triage.session"):
        try:
            return importlib.import_module(name).open_session
        except ModuleNotFoundError:
            continue
    raise SystemExit("Expected triage.load.session or triage.session with open_session, found neither.")


def _zoo():
    for name in ("triage.cli.zoo", "triage.zoo"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    raise SystemExit("Expected triage.cli.zoo or triage.zoo, found neither.")


def checkpoint_path(mods: dict[str, Path], root: Path, example: str) -> tuple[list[str], Counter]:
    """The triage files where a function ran while the example's checkpoint was loaded, and the calls up a floor."""
    module_of = {str(p.resolve()): m for m, p in mods.items()}
    for name in mods:  # every module's body runs before the trace: only the load's own calls are counted
        if name not in ("triage.__main__",):
            try:
                importlib.import_module(name)
            except ImportError:  # an optional extra that is not installed
                pass
    zoo = _zoo()
    open_session = _session_loader()
    checkpoint, entry = zoo.demo_checkpoint(example), f"{zoo.example_path(example)}:setup"
    seen: Counter = Counter()
    up: Counter = Counter()

    def profile(frame, event, arg):
        if event != "call" or frame.f_code.co_name == "<module>":
            return
        callee = module_of.get(frame.f_code.co_filename)
        if callee is None:
            return
        seen[callee] += 1
        caller = module_of.get(frame.f_back.f_code.co_filename) if frame.f_back else None
        if caller is not None and rank(floor_of(caller)) < rank(floor_of(callee)):
            up[caller, callee] += 1

    sys.setprofile(profile)
    try:
        open_session(entry, checkpoint)
    finally:
        sys.setprofile(None)
    return sorted(seen), up


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent / "triage",
                        help="the package folder to measure (default: this checkout's triage/)")
    parser.add_argument("--list", action="store_true", help="name every arrow up, circle, file and site")
    parser.add_argument("--example", default="lr_too_high", help="the zoo example whose checkpoint is loaded")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    sys.path.insert(0, str(root.parent))  # the tree measured is the one imported
    mods = modules(root)
    graph = imports(mods)
    floors = Counter(floor_of(m) for m in mods)
    flat = [m for m, p in mods.items() if p.parent == root and m != "triage"]
    flat_above = [m for m in flat if floor_of(m) != "foundation"]
    by_folder: dict[str, set[str]] = {}
    for m, p in mods.items():
        if p.parent != root:  # a module in a folder below triage/: its folder is the one that holds it
            folder = str(p.parent.relative_to(root.parent))
            by_folder.setdefault(folder, set()).add(floor_of(m))
    spanning = sorted((f, fl) for f, fl in by_folder.items() if len(fl) > 1)
    up = arrows_up(graph)
    loops = circles(graph)
    files, calls_up = checkpoint_path(mods, root, args.example)
    reads = string_reads(mods, root)
    places = sorted({(f, fn) for f, fn, _, _ in reads})
    longest = longest_function(mods, root)
    total, code = lines(mods)

    rows = [
        ("rooms (modules)", f"{len(mods)}"),
        ("floors", f"{len([f for f in FLOOR_ORDER if floors[f]])} used of {len(FLOOR_ORDER)}: "
                   + ", ".join(f"{f} {floors[f]}" for f in (*FLOOR_ORDER, "unassigned") if floors[f])),
        ("modules flat in triage/", f"{len(flat)}, {len(flat_above)} of them above the foundation"
                                     + (f" ({', '.join(flat_above)})" if flat_above else "")),
        ("folders across floors", f"{len(spanning)}" + (": " + "; ".join(
            f"{folder} ({', '.join(sorted(fl, key=rank))})" for folder, fl in spanning) if spanning else "")),
        ("arrows up (imports)", f"{len(up)}"),
        ("circles (import SCCs)", f"{len(loops)}" + (": " + "; ".join(" <-> ".join(c) for c in loops) if loops else "")),
        (f"checkpoint -> Session ({args.example})", f"{len(files)} files, {sum(calls_up.values())} calls up a floor"),
        ("outcome reads by string", f"{len(reads)} sites in {len(places)} places (functions)"),
        ("longest function", f"{longest[0]} lines ({longest[1]})"),
        ("lines in triage/", f"{total} ({code} code)"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"triage at {root}")
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")
    if args.list:
        print("\narrows up:")
        print("\n".join(f"  {a} ({floor_of(a)}) -> {b} ({floor_of(b)})" for a, b in up) or "  none")
        print("\ncheckpoint -> Session, files with a function run:")
        print("\n".join(f"  {m} ({floor_of(m)})" for m in files))
        print("calls up a floor during the load:")
        print("\n".join(f"  {a} -> {b}: {n}" for (a, b), n in sorted(calls_up.items())) or "  none")
        print("\noutcome reads by string:")
        print("\n".join(f"  {f}:{line} {fn}: {src}" for f, fn, line, src in reads))
        unassigned = [m for m in mods if floor_of(m) == "unassigned"]
        if unassigned:
            print("\nunassigned:", ", ".join(unassigned))


if __name__ == "__main__":
    main()
