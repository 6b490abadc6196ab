"""The shape every program in benchmarks/programs/ has, and the stock-PyTorch check that certifies its runs.

Nothing here imports triage, and a program's training and certification never call it: a program is a user's
training script plus the `setup_<run>()` entries its owner would write from triage's README (which import
triage for `triage.Setup` alone).

A program module defines:

    PROGRAM = Program(name=..., kind=..., original=..., runs={"healthy": Run(...), "<fault>": Run(...)})

    def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
        # The program's own loop for that run, as its original is written (its scheduler, its checkpoint
        # format, its data layout). `variant` names a fix to apply (one of the run's `fix` / `competing`);
        # None trains the run as its owner did. Writes the checkpoint its owner would triage into out_dir.

    def symptom(run: str, trained: Trained) -> str | None:
        # What is wrong with this run, measured on `trained` (a sentence with the figures), or None where the
        # run shows no symptom. For "healthy", a non-None answer means the healthy run failed to train.

    def setup_<run>() -> triage.Setup:    # one per run: the entry `--entry <file>.py:setup_<run>`

Certification (`certify`): every run under seeds 0, 1 and 2. A fault's symptom shows under every seed, its
fix removes it under every seed, and each competing fix leaves it under every seed. The healthy run shows no
symptom under any seed.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

HEALTHY = "healthy"
SEEDS = (0, 1, 2)
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Run:
    cause: str                      # the root-cause id a right diagnosis names ("healthy" for the healthy run)
    story: str                      # what happened, as the run's owner would tell it afterwards
    fix: str | None = None          # the variant that applies the named fix (None for the healthy run)
    competing: tuple[str, ...] = ()  # variants applying competing fixes: each must leave the symptom


@dataclass(frozen=True)
class Program:
    name: str                       # the module's file name without .py
    kind: str                       # the kind of program, for the per-kind figures (e.g. "graph", "ranking")
    original: str                   # the public original it is written after (project and file)
    runs: dict[str, Run]


@dataclass
class Trained:
    checkpoint: Path                # what `triage run --checkpoint` gets: a file or a folder
    train_losses: list[float]       # the run's logged training loss, one per logged step
    val_losses: list[float] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)  # anything else the symptom reads
    history: Path | None = None     # what `--history` gets, where the run logs outside its checkpoint


def load(name: str) -> ModuleType:
    """Import program `name` (a file in this folder) the way triage imports an entry by path."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    spec = importlib.util.spec_from_file_location(f"program_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickle look a module up by name while it runs
    spec.loader.exec_module(module)
    return module


def names() -> list[str]:
    """Every program in this folder, by file name."""
    return sorted(p.stem for p in HERE.glob("*.py") if not p.stem.startswith("_"))


@dataclass
class Check:
    run: str
    seed: int
    variant: str | None
    symptom: str | None
    expected: bool                  # whether a symptom was expected here
    seconds: float

    @property
    def ok(self) -> bool:
        return (self.symptom is not None) == self.expected


def certify(module: ModuleType, run: str, seeds: tuple[int, ...] = SEEDS) -> list[Check]:
    """The stock-PyTorch certificate of one run: every check it makes, in order."""
    spec = module.PROGRAM.runs[run]
    variants: list[tuple[str | None, bool]] = [(None, run != HEALTHY)]
    if run != HEALTHY:
        variants += [(spec.fix, False)] + [(c, True) for c in spec.competing]
    checks = []
    for seed in seeds:
        for variant, expected in variants:
            with tempfile.TemporaryDirectory() as out:
                started = time.perf_counter()
                trained = module.train(run, Path(out), seed=seed, variant=variant)
                seconds = time.perf_counter() - started
                said = module.symptom(run, trained)
            checks.append(Check(run, seed, variant, said, expected, round(seconds, 2)))
    return checks


def main(argv: list[str]) -> None:
    """python _program.py NAME [RUN ...]: certify a program's runs and print every check."""
    import torch

    torch.set_num_threads(1)
    module = load(argv[0])
    runs = argv[1:] or list(module.PROGRAM.runs)
    verdicts = {}
    for run in runs:
        checks = certify(module, run)
        for c in checks:
            print(f"{'ok ' if c.ok else 'BAD'} {run:<28} seed {c.seed} {str(c.variant):<22} {c.seconds:5.1f} s  "
                  f"{c.symptom or 'no symptom'}")
        verdicts[run] = all(c.ok for c in checks)
    print(json.dumps({"program": module.PROGRAM.name, "certified": verdicts}))


if __name__ == "__main__":
    main(sys.argv[1:])
