"""A Session: the user's setup with the checkpoint loaded, its data snapshot, and the state snapshot."""

from __future__ import annotations

import copy
import dataclasses
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np
import torch

from triage.batches import to_device
from triage.load.checkpoint import Checkpoint, load_model_state, read_checkpoint
from triage.contract import Setup
from triage.load.data_guard import DataGuard
from triage.load.disagreements import differences, settings
from triage.load.dcp import load_distributed
from triage.load.wrappers import unwrap
from triage.load.entry import SetupFactory, call_setup, entry_name, load_entry
from triage.errors import CheckpointError, SetupError, TriageError
from triage.flight.manifest import triaging
from triage.load.history import HistoryPoint, read_history_file
from triage.load.optimizer_fit import Fitted, OptimizerMismatch, fill_flags, fit_state
from triage.load.schedule_position import advance as advance_scheduler
from triage.load.derive import derived_factory
from triage.load.snapshot import Snapshot
from triage.load.warm_moments import warm_moments

log = logging.getLogger(__name__)

MAX_SNAPSHOT_BATCHES = 256  # a DataLoader is read this far at most: the snapshot must fit in memory


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class Session:
    """Everything an experiment may touch. Experiments restore `snapshot` before they start."""

    setup: Setup
    factory: SetupFactory
    entry: str
    seed: int
    batches: list[Any]
    val_batches: list[Any]
    snapshot: Snapshot
    checkpoint: Optional[Checkpoint] = None
    history: list[HistoryPoint] = field(default_factory=list)
    # Figures measured once, by whichever experiment needs them first (`memoised`): the loss levels of
    # the data alone (triage.experiments.levels), the standard loss for the model's outputs.
    memo: dict[str, Any] = field(default_factory=dict)
    # Gives loss_fn / train_step a copy of each batch, so the data snapshot never changes (data_guard.py).
    data_guard: Optional[DataGuard] = None
    # Where setup() and the checkpoint disagree (LR, param groups, the schedule's base): the replays use the
    # checkpoint's values (triage/load/disagreements.py).
    disagreements: list[str] = field(default_factory=list)
    # (finding id, text): what loading had to do to make the checkpoint fit setup() (keys mapped, groups
    # reordered, a step left out), said in the report beside the findings.
    load_notes: list[tuple[str, str]] = field(default_factory=list)

    @property
    def device(self) -> torch.device:
        return torch.device(self.setup.device)

    def memoised(self, key: str, compute: Callable[[], Any]) -> Any:
        """`compute()` the first time `key` is asked for in this session, the same value after."""
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    def restore(self) -> None:
        s = self.setup
        self.snapshot.restore(s.model, s.optimizer, s.scheduler, s.scaler)

    def fresh_setup(self, default_init: bool = False, at_checkpoint: bool = True) -> Setup:
        """A freshly initialised copy of the run: setup() called again, no checkpoint loaded.

        With `default_init`, every module's own `reset_parameters()` replaces whatever init setup()
        applied: PyTorch's default initialisation, the counterfactual for a bad init.

        A restart is compared with the run at the checkpoint, so it trains as the run was training there:
        its optimizer's hyper-parameters (the LR the run had) and its scheduler's position are the
        checkpoint's, only the weights and the optimizer's moments are fresh. A warmup replayed from step 0
        would train at a tiny LR and "work" where the run's own LR does not. `at_checkpoint=False` keeps
        setup()'s own step 0 (the LR trace follows the schedule from there).
        """
        # The run's optimizer state is idle while a fresh copy trains, and the engine's next restore puts
        # it back from the snapshot: freed here, a restart never holds two sets of moments at once.
        self.setup.optimizer.state.clear()
        seed_everything(self.seed)
        fresh = call_setup(self.factory, self.entry)
        if default_init:
            for module in fresh.model.modules():
                if hasattr(module, "reset_parameters"):
                    module.reset_parameters()
        fresh.model.to(self.device)
        if at_checkpoint and self.checkpoint is not None:
            self._continue_schedule(fresh)
        return self.data_guard.protect(fresh) if self.data_guard is not None else fresh

    def _continue_schedule(self, fresh: Setup) -> None:
        """The fresh optimizer's param-group hyper-parameters and the fresh scheduler's state as the
        snapshot holds them (restored just before: the checkpoint's), where the groups line up."""
        groups, saved = fresh.optimizer.param_groups, self.setup.optimizer.param_groups
        if len(groups) != len(saved):
            log.info("a restart keeps setup()'s own LR: it builds %d param groups, the checkpoint has %d",
                     len(groups), len(saved))
            return
        for group, run_group in zip(groups, saved):
            group.update({k: v for k, v in run_group.items() if k != "params"})
        if fresh.scheduler is not None and self.snapshot.scheduler is not None:
            try:
                fresh.scheduler.load_state_dict(copy.deepcopy(self.snapshot.scheduler))
            except (KeyError, ValueError, TypeError, RuntimeError) as exc:
                log.info("a restart's scheduler starts from setup()'s: the checkpoint's state does not load (%s)",
                         exc)


def open_session(entry: Union[str, SetupFactory], checkpoint_path: Optional[Path], seed: int = 0,
                 history_path: Optional[Path] = None, trust_checkpoint: bool = False,
                 history_keys: tuple[Optional[str], Optional[str]] = (None, None),
                 snapshot_dir: Optional[Path] = None) -> Session:
    """The session for `--entry` (a spec, or the setup function itself) and `--checkpoint`:
    setup() called, checkpoint loaded, snapshot taken (in memory, or spilled to `snapshot_dir`)."""
    factory, name = (entry, entry_name(entry)) if callable(entry) else (load_entry(entry), entry)
    history = read_history_file(history_path, *history_keys) if history_path else None
    # Read inline: session_from_factory holds the only reference, so it can free the loaded tensors.
    return session_from_factory(factory, name,
                                read_checkpoint(Path(checkpoint_path), trust_checkpoint) if checkpoint_path else None,
                                Path(checkpoint_path or "."), seed, history, snapshot_dir=snapshot_dir)


def session_from_factory(factory: SetupFactory, entry: str = "<setup>", checkpoint: Optional[Checkpoint] = None,
                         checkpoint_path: Path = Path("."), seed: int = 0,
                         history: Optional[list[HistoryPoint]] = None,
                         snapshot_dir: Optional[Path] = None) -> Session:
    """A session from a setup function in memory (what tests and the Python API use).

    `factory` may also be a LightningModule class or a function returning a LightningModule or a
    transformers.Trainer: the Setup is then derived from it (triage/load/derive.py).

    Memory: the checkpoint's tensors are loaded into the model and optimizer and then dropped (the
    optimizer keeps the loaded moments themselves); the snapshot is the one other copy of the state."""
    light = checkpoint.without_tensors() if checkpoint is not None else None
    # setup() may call triage.load_batches() without a path: the capture being triaged, if any
    triaging(checkpoint.capture_dir if checkpoint is not None else None)
    factory = derived_factory(factory, light)
    seed_everything(seed)
    setup = call_setup(factory, entry)
    _move_to_device(setup)
    built = settings(setup.optimizer, setup.scheduler)
    load_notes, no_optimizer_state = _load_checkpoint(setup, checkpoint, checkpoint_path) \
        if checkpoint is not None else ([], False)
    disagree = differences(built, settings(setup.optimizer, setup.scheduler)) if checkpoint is not None else []
    checkpoint = _with_epoch_step(light, setup) if light is not None else None  # the model state is in the model now
    load_notes += list(checkpoint.notes if checkpoint else ())
    batches = _materialise(setup.batches, "batches", setup.device)
    if not batches:
        raise SetupError(
            "Expected Setup.batches to hold at least one batch, found none. "
            "Pass a list of batches (or a DataLoader) from the failing run's data."
        )
    val_batches = _materialise(setup.val_batches, "val_batches", setup.device)
    if history is None:
        history = checkpoint.history if checkpoint else []
    guard = DataGuard(batches, val_batches)
    setup = guard.protect(setup)
    if no_optimizer_state:
        rebuilt = warm_moments(setup, batches, checkpoint.step if checkpoint is not None else None)
        if rebuilt is None:
            log.warning("checkpoint %s has no optimizer state: replays start with fresh moments", checkpoint_path)
        else:
            load_notes.append(rebuilt)
    seed_everything(seed)
    session = Session(
        setup=setup, factory=factory, entry=entry, seed=seed, batches=batches,
        val_batches=val_batches, checkpoint=checkpoint, history=history,
        snapshot=Snapshot.take(setup.model, setup.optimizer, setup.scheduler, setup.scaler, spill_dir=snapshot_dir),
        data_guard=guard, disagreements=disagree, load_notes=load_notes,
    )
    _check_loss_fn(session)
    return session


def _check_loss_fn(session: Session) -> None:
    """One forward of the first batch: a loss_fn that returns no scalar is bad input.

    One that raises is left to the experiments: it may be the fault itself (a label out of range
    makes cross_entropy raise), and the report shows where it raised.
    """
    setup = session.setup
    try:
        with torch.no_grad():
            loss = setup.loss_fn(setup.model, session.batches[0])
    except TriageError:  # loss terms that do not match Setup.auxiliary_terms: bad input, said as such
        raise
    except Exception as exc:
        log.warning("loss_fn raised on snapshot batch 0 (%s: %s); the experiments will say more",
                    type(exc).__name__, exc)
        return
    finally:
        session.restore()  # the forward may have moved BatchNorm statistics or drawn random numbers
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        found = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise SetupError(
            f"Expected loss_fn(model, batch) to return a scalar tensor, found {found}. "
            "Return the mean loss over the batch (e.g. F.cross_entropy(model(x), y)), or a dict of named scalar "
            "terms whose sum is the loss."
        )


def _move_to_device(setup: Setup) -> None:
    try:
        setup.model.to(setup.device)
    except (RuntimeError, AssertionError) as exc:  # torch asserts when it was built without CUDA
        raise SetupError(
            f"Expected Setup.device '{setup.device}' to be usable here, found it is not ({exc}). "
            "Pass device='cpu' on a machine without that accelerator, or run triage where it is."
        ) from exc


def _load_checkpoint(setup: Setup, checkpoint: Checkpoint, path: Path) -> tuple[list[tuple[str, str]], bool]:
    """Load every part; returns (finding id, text) for what had to be mapped to make it fit, and whether the
    optimizer was left without the run's state (none saved)."""
    notes: list[tuple[str, str]] = []
    loaded = load_distributed(setup, checkpoint, path)  # a DCP folder, or into an FSDP2 model's shards
    if checkpoint.scheduler_state is None:
        placed = advance_scheduler(setup, _with_epoch_step(checkpoint, setup).step, checkpoint.optimizer_state)
        if placed is not None:
            notes.append(placed)
    optimizer_state = None if "optimizer" in loaded else checkpoint.optimizer_state
    # Fitted before the model loads: the fit steps a copy of the optimizer on stand-ins, and whatever a
    # user's optimizer might reach beyond them is overwritten by the load that follows.
    fitted = _fit_optimizer(setup.optimizer, optimizer_state) \
        if setup.optimizer is not None and optimizer_state is not None else []
    if "model" not in loaded:
        for note in load_model_state(unwrap(setup.model), checkpoint.model_state, path):  # DDP: its .module
            log.warning("%s", note)
            notes.append(("checkpoint_keys_mapped", note[0].upper() + note[1:] + "."))
    for what, optimizer, state in fitted:
        _load_optimizer(optimizer, state, what, notes)
    for name, target, state in [("scheduler", setup.scheduler, checkpoint.scheduler_state),
                                ("scaler", setup.scaler, checkpoint.scaler_state)]:
        if target is None or state is None:
            continue
        try:
            target.load_state_dict(state)
        except Exception as exc:
            raise CheckpointError(
                f"Expected the checkpoint's {name} state to fit the {name} setup() built "
                f"({type(target).__name__}), found a mismatch: {exc}. Build the same {name} "
                "(type and parameter groups) the run saved."
            ) from exc
    return notes, checkpoint.optimizer_state is None and "optimizer" not in loaded and not setup.manual_update


def _with_epoch_step(checkpoint: Checkpoint, setup: Setup) -> Checkpoint:
    """A checkpoint that saved only its epoch: its step, where setup() says how many steps an epoch has."""
    per_epoch = getattr(setup, "steps_per_epoch", None)
    if checkpoint.step is not None or checkpoint.epoch is None or not isinstance(per_epoch, int) or per_epoch < 1:
        return checkpoint
    return dataclasses.replace(checkpoint, step=checkpoint.epoch * per_epoch,
                               step_source=f"{checkpoint.step_source.split(' (')[0]} {checkpoint.epoch} x "
                                           f"Setup.steps_per_epoch {per_epoch}")


def _fit_optimizer(optimizer: torch.optim.Optimizer, state: Any) -> list[tuple[str, torch.optim.Optimizer, Any]]:
    """(what, optimizer, its state made to fit) for each optimizer to load: the saved state compared with
    setup()'s optimizer by structure and shapes (triage/load/optimizer_fit.py), its groups in setup()'s order.
    Several optimizers (an object with an `optimizers` dict, as Setup(optimizers=...) builds) saved by
    name: each its own; saved as one state over all their groups: loaded as it is."""
    members = getattr(optimizer, "optimizers", None)
    if isinstance(members, dict):
        if isinstance(state, dict) and set(state) == set(members):
            return [fitted for name, member in members.items()
                    for fitted in _fit_optimizer_one(member, state[name], f"optimizer '{name}'")]
        return [("optimizer", optimizer, Fitted(state))]
    return _fit_optimizer_one(optimizer, state, "optimizer")


def _fit_optimizer_one(optimizer: torch.optim.Optimizer, state: Any, what: str):
    try:
        return [(what, optimizer, fit_state(optimizer, state))]
    except OptimizerMismatch as exc:
        raise CheckpointError(
            f"Expected the checkpoint's {what} state to fit the optimizer setup() built "
            f"({type(optimizer).__name__}), found that {exc}. Build the optimizer the run used (its type and "
            "parameter groups, in the run's order), or save the checkpoint without its optimizer state to "
            "replay with fresh moments."
        ) from None


def _load_optimizer(optimizer: torch.optim.Optimizer, fitted: Fitted, what: str,
                    notes: list[tuple[str, str]]) -> None:
    try:
        optimizer.load_state_dict(fitted.state)
        members = getattr(optimizer, "optimizers", None)
        for member in [*(members.values() if isinstance(members, dict) else ()), optimizer]:
            fill_flags(member)
    except Exception as exc:
        raise CheckpointError(
            f"Expected the checkpoint's {what} state to fit the optimizer setup() built ({type(optimizer).__name__}), "
            f"found a mismatch: {_first_line(exc)}. Build the same optimizer (type and parameter groups) the run saved."
        ) from exc
    for note in fitted.notes:
        log.warning("%s: %s", what, note)
        notes.append(("optimizer_groups_reordered", f"{what[0].upper()}{what[1:]}: {note}."))


def _materialise(batches: Any, name: str, device: str) -> list[Any]:
    """Read the data snapshot once into a list, on the setup's device."""
    if batches is None:
        return []
    out: list[Any] = []
    iterator = iter(batches)
    while len(out) <= MAX_SNAPSHOT_BATCHES:
        try:
            batch = next(iterator)
        except StopIteration:
            break
        except Exception as exc:
            raise SetupError(
                f"Expected Setup.{name} to yield batches, found that reading batch {len(out)} raised "
                f"{type(exc).__name__}: {_first_line(exc)}. Fix the dataset or DataLoader (try "
                f"`list(setup().{name})` in Python), or pass the batches that load."
            ) from exc
        if len(out) == MAX_SNAPSHOT_BATCHES:
            log.warning("%s: using the first %d batches as the snapshot", name, MAX_SNAPSHOT_BATCHES)
            break
        try:
            out.append(to_device(batch, device))
        except Exception as exc:
            raise SetupError(f"Expected batch {len(out)} of Setup.{name} to move to '{device}', found it cannot "
                             f"({type(exc).__name__}: {_first_line(exc)}). Check what the batch holds.") from exc
    return out


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else type(exc).__name__
