"""A triage.Setup derived from a LightningModule (and its LightningDataModule, if any).

What comes from where:
- model: the module itself (its state_dict is what a Lightning .ckpt holds);
- optimizer and scheduler: `configure_optimizers()`, in any of its return forms (the first optimizer;
  a scheduler Lightning steps per epoch, or every `frequency` steps, is stepped at that pace);
- loss: `training_step(batch, 0)` under automatic optimization; under manual optimization the step
  itself becomes `train_step` (with `self.optimizers()`, `manual_backward`, ... served without a Trainer),
  and the loss is what it passes to `manual_backward`;
- batches: a capture's own batches when the checkpoint is a capture, else `train_dataloader()`;
  validation batches: `val_dataloader()` when the module or datamodule defines it;
- precision, gradient clipping, total steps: the capture manifest (TriageCallback records the Trainer's
  settings), else the checkpoint's hyper-parameters (`precision`, `gradient_clip_val`,
  `gradient_clip_algorithm`, `max_steps`) when the module saved them.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import warnings
from collections.abc import Mapping
from typing import Any, Iterator, Optional

import torch

from triage.contract import Setup
from triage.errors import SetupError
from triage.flight.manifest import CaptureManifest, load_batches
from triage.integrations.runinfo import triage_clip, triage_precision
from triage.load.checkpoint import Checkpoint

log = logging.getLogger(__name__)


def build_module(cls: type, checkpoint: Optional[Checkpoint]) -> Any:
    """`cls(**hparams)` as Lightning's load_from_checkpoint does: the checkpoint's saved hyper-parameters
    that the constructor accepts."""
    hparams = checkpoint.hyper_parameters if checkpoint else {}
    params = inspect.signature(cls.__init__).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        hparams = {k: v for k, v in hparams.items() if k in params}
    return cls(**hparams)


def lightning_setup(module: Any, datamodule: Any, checkpoint: Optional[Checkpoint]) -> Setup:
    from lightning.pytorch.utilities.model_helpers import is_overridden

    manifest = _manifest(checkpoint)
    hparams = checkpoint.hyper_parameters if checkpoint else {}
    data = datamodule if datamodule is not None else module
    module.trainer = None  # a module that was fitted in this process would log into its old Trainer
    if datamodule is not None:
        datamodule.prepare_data()
        datamodule.setup("fit")
    if is_overridden("setup", module):
        module.setup("fit")
    train_loader = None if _has_batches(checkpoint, manifest) else _loader(data, "train_dataloader", is_overridden)
    if train_loader is None and not _has_batches(checkpoint, manifest):
        raise SetupError(f"Expected {type(data).__name__} to define train_dataloader() (or --checkpoint to be "
                         "a capture folder with batches), found neither. Define it, or triage a capture.")
    val_loader = _loader(data, "val_dataloader", is_overridden)
    with _quiet():
        optimizer, scheduler, every = _optimizers(module.configure_optimizers())
    if every > 1 or every == -1:
        per_epoch = _steps_per_epoch(train_loader, manifest)
        scheduler = StepEvery(scheduler, per_epoch if every == -1 else every) if per_epoch or every > 1 else scheduler
    settings = manifest.run_settings if manifest else {}
    precision = manifest.precision if manifest else triage_precision(hparams.get("precision"))
    clip = manifest.grad_clip if manifest else triage_clip(hparams.get("gradient_clip_val"),
                                                          hparams.get("gradient_clip_algorithm", "norm"))
    total = manifest.total_steps if manifest else _positive_int(hparams.get("max_steps"))
    batches = load_batches(checkpoint.capture_dir) if _has_batches(checkpoint, manifest) else train_loader
    automatic = bool(getattr(module, "automatic_optimization", True))
    log.info("derived a Setup from %s (%s optimization; settings %s)", type(module).__name__,
             "automatic" if automatic else "manual", settings)
    return Setup(
        model=module, optimizer=optimizer, scheduler=scheduler,
        loss_fn=training_step_loss if automatic else ManualLoss(optimizer, scheduler),
        train_step=None if automatic else ManualStep(scheduler),
        batches=batches, val_batches=val_loader, precision=precision or "fp32", grad_clip=clip,
        total_steps=total, device=_device(manifest),
    )


# --- the loss and the step ----------------------------------------------------------------------------

def training_step_loss(model: Any, batch: Any) -> torch.Tensor:
    """Automatic optimization: the loss is what training_step returns (a tensor, or a dict's 'loss')."""
    with _quiet():
        out = model.training_step(batch, 0)
    return _loss_of(out, "training_step")


class _OptimizerProxy:
    """What `self.optimizers()` hands a manual training_step outside a Trainer. `dry` records instead of
    stepping (for the loss alone)."""

    def __init__(self, optimizer: torch.optim.Optimizer, dry: bool):
        self.optimizer, self.dry = optimizer, dry

    def step(self, closure: Any = None, **kwargs: Any) -> Any:
        if self.dry:
            return closure() if closure is not None else None
        return self.optimizer.step(closure) if closure is not None else self.optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        if not self.dry:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


class _SchedulerProxy:
    """`self.lr_schedulers()` while triage only wants the loss: stepping it does nothing."""

    def __init__(self, scheduler: Any):
        self.scheduler = scheduler

    def step(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.scheduler, name)


@contextlib.contextmanager
def _served(module: Any, optimizer: Any, scheduler: Any, backward: Any) -> Iterator[None]:
    """Serve the Trainer-backed methods a manual training_step calls, on this instance, for one call."""
    methods = {
        "optimizers": lambda use_pl_optimizer=True: optimizer,
        "lr_schedulers": lambda: scheduler,
        "manual_backward": backward,
        "clip_gradients": lambda opt, gradient_clip_val=None, gradient_clip_algorithm=None: (
            torch.nn.utils.clip_grad_norm_(module.parameters(), gradient_clip_val) if gradient_clip_val else None),
        "toggle_optimizer": lambda *a, **k: None,
        "untoggle_optimizer": lambda *a, **k: None,
        "toggled_optimizer": lambda *a, **k: contextlib.nullcontext(),
    }
    for name, method in methods.items():
        object.__setattr__(module, name, method)
    try:
        with _quiet():
            yield
    finally:
        for name in methods:
            module.__dict__.pop(name, None)


class ManualStep:
    """Manual optimization: the module's own training_step is the run's step (train_step)."""

    def __init__(self, scheduler: Any):
        self.scheduler = scheduler

    def __call__(self, model: Any, optimizer: torch.optim.Optimizer, batch: Any) -> Any:
        seen: list[torch.Tensor] = []

        def backward(loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            seen.append(loss.detach())
            loss.backward(*args, **kwargs)

        # The run's own step steps the scheduler when it does (triage's user-loop replay leaves it to it).
        with _served(model, _OptimizerProxy(optimizer, dry=False), self.scheduler, backward):
            out = model.training_step(batch, 0)
        return seen[0] if seen else _loss_of(out, "training_step")


class ManualLoss:
    """Manual optimization's loss for triage's own experiments: the first loss training_step passes to
    manual_backward, with its graph; nothing is stepped."""

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler: Any):
        self.optimizer, self.scheduler = optimizer, scheduler

    def __call__(self, model: Any, batch: Any) -> torch.Tensor:
        seen: list[torch.Tensor] = []
        scheduler = _SchedulerProxy(self.scheduler) if self.scheduler is not None else None
        with _served(model, _OptimizerProxy(self.optimizer, dry=True), scheduler,
                     lambda loss, *a, **k: seen.append(loss)):
            out = model.training_step(batch, 0)
        return seen[0] if seen else _loss_of(out, "training_step")


def _loss_of(out: Any, where: str) -> torch.Tensor:
    if isinstance(out, Mapping) and "loss" in out:
        return out["loss"]
    if isinstance(out, torch.Tensor):
        return out
    raise SetupError(f"Expected {where} to return the loss (a tensor or a dict with 'loss'), found "
                     f"{type(out).__name__}. Return the loss from {where}.")


# --- configure_optimizers -----------------------------------------------------------------------------

def _optimizers(conf: Any) -> tuple[torch.optim.Optimizer, Any, int]:
    """The first optimizer, its scheduler and how often Lightning steps it (1: every step; n: every n
    steps; -1: every epoch), from any form configure_optimizers may return."""
    optimizers, schedulers = [], []
    if isinstance(conf, torch.optim.Optimizer):
        optimizers = [conf]
    elif isinstance(conf, Mapping):
        optimizers, schedulers = [conf["optimizer"]], [conf["lr_scheduler"]] if conf.get("lr_scheduler") else []
    elif isinstance(conf, (list, tuple)) and len(conf) == 2 and isinstance(conf[0], (list, tuple)):
        optimizers, schedulers = list(conf[0]), list(conf[1]) if isinstance(conf[1], (list, tuple)) else [conf[1]]
    elif isinstance(conf, (list, tuple)) and conf and all(isinstance(c, Mapping) for c in conf):
        optimizers = [c["optimizer"] for c in conf]
        schedulers = [c["lr_scheduler"] for c in conf if c.get("lr_scheduler")]
    elif isinstance(conf, (list, tuple)) and conf and all(isinstance(c, torch.optim.Optimizer) for c in conf):
        optimizers = list(conf)
    if not optimizers or not isinstance(optimizers[0], torch.optim.Optimizer):
        raise SetupError(f"Expected configure_optimizers() to return an optimizer (alone, in a list, or in a "
                         f"dict under 'optimizer'), found {type(conf).__name__}. triage needs one to replay.")
    if len(optimizers) > 1:
        log.warning("configure_optimizers returned %d optimizers: triage replays with the first", len(optimizers))
    optimizer = optimizers[0]
    for entry in schedulers:
        config = entry if isinstance(entry, Mapping) else {"scheduler": entry}
        scheduler = config.get("scheduler")
        if getattr(scheduler, "optimizer", None) is not optimizer:
            continue
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            log.warning("ReduceLROnPlateau steps on a monitored metric: triage replays at the current LR")
            return optimizer, None, 1
        frequency = int(config.get("frequency", 1))
        return optimizer, scheduler, -1 if config.get("interval", "epoch") == "epoch" else frequency
    return optimizer, None, 1


class StepEvery:
    """A scheduler stepped once every `every` optimizer steps (Lightning's interval='epoch' or frequency),
    presented to triage as one it steps every step."""

    def __init__(self, scheduler: Any, every: int):
        self.scheduler, self.every, self.calls = scheduler, max(1, int(every)), 0

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.scheduler.optimizer

    @property
    def last_epoch(self) -> int:
        return self.calls

    def step(self) -> None:
        self.calls += 1
        if self.calls % self.every == 0:
            self.scheduler.step()

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler.state_dict(), "calls": self.calls, "every": self.every}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "calls" in state and "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])
            self.calls = int(state["calls"])
        else:  # a Lightning checkpoint holds the scheduler's own state: its epochs so far
            self.scheduler.load_state_dict(state)
            self.calls = int(state.get("last_epoch", 0)) * self.every


def _steps_per_epoch(loader: Any, manifest: Optional[CaptureManifest]) -> int:
    if manifest and manifest.run_settings.get("steps_per_epoch"):
        return int(manifest.run_settings["steps_per_epoch"])
    try:
        return len(loader)
    except TypeError:
        log.warning("the scheduler steps per epoch, but the epoch length is unknown: triage steps it every step")
        return 0


# --- the rest -----------------------------------------------------------------------------------------

def _manifest(checkpoint: Optional[Checkpoint]) -> Optional[CaptureManifest]:
    return checkpoint.manifest if checkpoint else None


def _has_batches(checkpoint: Optional[Checkpoint], manifest: Optional[CaptureManifest]) -> bool:
    return bool(manifest and manifest.batch_steps)


def _loader(owner: Any, name: str, is_overridden: Any) -> Any:
    if not is_overridden(name, owner):
        return None
    with _quiet():
        loader = getattr(owner, name)()
    if isinstance(loader, (list, tuple)) and loader and not isinstance(loader[0], torch.Tensor):
        loader = loader[0]  # several validation loaders: the first
    return loader


def _device(manifest: Optional[CaptureManifest]) -> str:
    if manifest and manifest.device.startswith("cuda") and torch.cuda.is_available():
        return manifest.device
    return "cpu"


def _positive_int(value: Any) -> Optional[int]:
    try:
        value = int(value)
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """training_step's self.log(...) warns that no Trainer is attached: expected here, not news."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*self.log.*")
        warnings.filterwarnings("ignore", message=".*not attached to a `Trainer`.*")
        yield
