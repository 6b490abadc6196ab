"""Loading (a floor of DESIGN §6): the user's entry and checkpoint turned into a Session, before any
experiment runs. It may import the foundations (triage/*.py) and the capture floor (triage.flight,
triage.integrations: a capture folder is one of the layouts it reads); nothing above it.

    checkpoint.py        every checkpoint layout read into its parts (plain dict, Lightning .ckpt, HF Trainer
                         folder, capture folder, DCP folder)
    entry.py             finding and calling the user's `setup` from an `--entry` spec
    session.py           entry + checkpoint -> Session: setup() called, checkpoint loaded, snapshot taken
    snapshot.py          the exact in-memory copy of every state, restored before each experiment
    optimizer_fit.py     a saved optimizer state against setup()'s optimizer
    warm_moments.py      an optimizer state the checkpoint did not save, rebuilt by steps at LR 0
    schedule_position.py setup()'s scheduler placed at the checkpoint's step where it saved no scheduler state
    disagreements.py     where setup() and the checkpoint differ (a finding the report names)
    data_guard.py        the user's loss_fn and train_step get a copy of each batch
    history.py           the run's own loss curve (checkpoint or --history), tensorboard.py: its event files
    derive.py            a Setup derived from a LightningModule or a transformers.Trainer
                         (lightning_setup.py, transformers_setup.py)
    ranks.py             which rank this is, triage's own gloo groups; launch.py: torchrun for
                         `--nproc-per-node`; wrappers.py: DDP / FSDP2 / plain
    dcp.py               torch.distributed.checkpoint folders; every_rank.py: the session on every rank

Nothing here is imported by `import triage`; the command line reads only the constant below (without torch).
"""

DEFAULT_RANK_TIMEOUT_S = 180.0  # a rank silent this long inside a collective is taken to have hung
