"""Finding and calling the user's `setup` function from an `--entry` spec."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import sys
import traceback
from pathlib import Path
from typing import Callable

import pydantic

from triage.contract import Setup
from triage.errors import EntryError, SetupError, TriageError
from triage.load.loss_terms import with_terms

SetupFactory = Callable[[], Setup]


def load_entry(spec: str) -> SetupFactory:
    """`pkg.module:function` (importable from the current directory) or `path/file.py:function`."""
    module_part, sep, function_name = spec.rpartition(":")
    if not sep or not module_part or not function_name:
        raise EntryError(
            f"Expected --entry as 'module:function' or 'path/to/file.py:function', found '{spec}'. "
            "Example: --entry mymod:setup"
        )
    module = _import(module_part, spec)
    factory = getattr(module, function_name, None)
    if not callable(factory):
        found = "nothing" if factory is None else f"a {type(factory).__name__}"
        near = near_names(function_name, module)
        advice = (f"Did you mean {' or '.join(near)}? (--entry {module_part}:{near[0]})" if near else
                  f"Define `def {function_name}() -> triage.Setup:` there, or point --entry at it.")
        raise EntryError(f"Expected a function '{function_name}' in '{module_part}', found {found}. {advice}")
    return factory


def near_names(name: str, module) -> list[str]:
    """Functions in the module, and classes defined there, whose names are close to a mistyped one,
    closest first."""
    defined = [n for n, value in vars(module).items() if not n.startswith("_") and (
        inspect.isfunction(value) or (inspect.isclass(value) and value.__module__ == module.__name__))]
    return difflib.get_close_matches(name, defined, n=3, cutoff=0.6)


def entry_name(factory: SetupFactory) -> str:
    """How a setup function given in memory is named in messages and the report: module:qualname."""
    module = getattr(factory, "__module__", None) or "<memory>"
    return f"{module}:{getattr(factory, '__qualname__', type(factory).__name__)}"


def call_setup(factory: SetupFactory, spec: str) -> Setup:
    """Call the user's setup(), turning its failures into errors that say what to fix."""
    try:
        result = factory()
    except pydantic.ValidationError as exc:
        raise SetupError(
            f"Expected '{spec}' to build a valid triage.Setup, found these fields wrong:\n"
            f"{_field_errors(exc)}\nFix them in setup(); the Setup reference (docs/reference/setup.md) describes "
            "every field."
        ) from exc
    except TriageError:  # already says what to do (a derived setup, load_batches, ...)
        raise
    except SystemExit as exc:  # would end triage without a word
        raise EntryError(f"Expected '{spec}' to return a triage.Setup, found it called sys.exit({exc.code!r}). "
                         "Remove the sys.exit() from setup() (or what it calls).") from None
    except Exception as exc:
        launch = _launch_advice(exc)  # a setup() for torch.distributed, started the wrong way
        if launch:
            raise EntryError(launch) from exc
        raise EntryError(
            f"Expected '{spec}' to return a triage.Setup, but it raised {type(exc).__name__}: {exc}\n"
            f"{_user_frame(exc)}Fix setup() so it runs on its own (try calling it in Python)."
        ) from exc
    if not isinstance(result, Setup):
        raise SetupError(
            f"Expected '{spec}' to return a triage.Setup, found {type(result).__name__}. "
            "Return triage.Setup(model=..., optimizer=..., loss_fn=..., batches=...), or name a "
            "LightningModule class or a function returning one or a transformers.Trainer."
        )
    return with_terms(result)  # a dict of loss terms read as the run's loss (triage/load/loss_terms.py)


def _launch_advice(exc: BaseException) -> str | None:
    from triage.load.launch import needs_process_group, started_twice
    from triage.load.ranks import current

    return needs_process_group(exc, current()) or started_twice(exc)


def _import(module_part: str, spec: str):
    if module_part.endswith(".py") or "/" in module_part:
        path = Path(module_part)
        if not path.is_file():
            raise EntryError(
                f"Expected the file '{path}' named in --entry '{spec}', found no such file. "
                "Check the path (it is relative to the current directory)."
            )
        name = f"triage_entry_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        sys.path.insert(0, str(path.resolve().parent))  # so the file can import its neighbours
        try:
            module_spec.loader.exec_module(module)
        except SystemExit as exc:
            raise EntryError(_exited(module_part, exc)) from None
        except Exception as exc:
            raise EntryError(_import_failed(module_part, exc)) from exc
        return module
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return importlib.import_module(module_part)
    except ModuleNotFoundError as exc:
        if exc.name and module_part.startswith(exc.name):
            raise EntryError(
                f"Expected a module '{module_part}' importable from {Path.cwd()}, found none. "
                "Run triage from the folder that holds it, or pass a file path: --entry path/to/mymod.py:setup"
            ) from exc
        raise EntryError(_import_failed(module_part, exc)) from exc
    except SystemExit as exc:
        raise EntryError(_exited(module_part, exc)) from None
    except Exception as exc:
        raise EntryError(_import_failed(module_part, exc)) from exc


def _exited(module_part: str, exc: SystemExit) -> str:
    return (f"Expected '{module_part}' to import cleanly, found it called sys.exit({exc.code!r}) while being "
            "imported (a script's entry point?). Move that code under `if __name__ == \"__main__\":`.")


def _import_failed(module_part: str, exc: BaseException) -> str:
    return (
        f"Expected '{module_part}' to import cleanly, but importing it raised "
        f"{type(exc).__name__}: {exc}\n{_user_frame(exc)}Fix the module so `import` works on its own."
    )


def _user_frame(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError) and exc.filename:  # its traceback ends inside importlib
        return f"  at {exc.filename}:{exc.lineno}\n"
    frames = traceback.extract_tb(exc.__traceback__)
    frame = frames[-1] if frames else None
    return f"  at {frame.filename}:{frame.lineno} in {frame.name}\n" if frame else ""


def _field_errors(exc: pydantic.ValidationError) -> str:
    lines = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "Setup"
        lines.append(f"  - {where}: {error['msg']}")
    return "\n".join(lines)
