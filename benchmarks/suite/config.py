"""RunConfig: everything that makes one generated training run, as frozen records.

A fault is a change to a family's healthy RunConfig (`dataclasses.replace`); its fix is another change.
Families read these records to build data, model, loss and optimizer; nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class DataConfig:
    """How the family's data snapshot is made, and which data faults it carries."""

    n_batches: int = 12
    batch_size: int = 32
    train_examples: Optional[int] = None      # a smaller training set (overfitting); None: n_batches x batch_size
    input_scale: float = 1.0                   # inputs in raw units: every input times this (float inputs only)
    raw_offset: float = 0.0                    # ...plus this (raw-unit features around 1e5: scale 5e4, offset 1e5)
    nonfinite_batches: tuple[int, ...] = ()    # batches that carry NaN/Inf values
    nonfinite_rows: int = 0                    # how many examples of each such batch
    nonfinite_value: str = "nan"               # "nan" | "inf"
    nonfinite_part: int = 0                    # the batch item they are in: 0 inputs, 2 loss weights
    impute: bool = False                       # the fix: non-finite values replaced by 0 (the feature mean)
    blank_batches: tuple[int, ...] = ()        # batches with constant ("blank") examples
    blank_rows: int = 0
    bad_batch: Optional[int] = None            # one batch exported in other units
    bad_batch_scale: float = 1.0
    bad_batch_part: int = 0                    # the item in other units: 0 inputs, 2 loss weights
    shuffled_labels: float = 0.0               # fraction of targets moved to another example
    label_noise: float = 0.0                   # fraction of targets replaced at random (noisy-but-fine)
    val_batches: int = 0                       # held-out batches (0: no validation data)
    val_overlap: float = 0.0                   # fraction of each validation batch copied from training


@dataclass(frozen=True)
class ModelConfig:
    """Options of a family's model: trunk -> neck (Linear + activation, `neck_depth` times) -> head."""

    neck_activation: str = "relu"              # "relu" | "sigmoid"
    neck_depth: int = 1
    neck_bias: Optional[float] = None          # custom init of the neck biases (very negative: dead ReLUs)
    skips: bool = True                         # residual connections (resnet, transformer_lm)
    block_activation: str = "relu"             # activation inside residual blocks
    init_std: Optional[float] = None           # custom init: every weight matrix N(0, std)
    detach: Optional[str] = None               # "output": the outputs are detached, then a learnable bias added
    input_norm: bool = False                   # a LayerNorm right after the first layer
    example_norm_eps: Optional[float] = None   # normalise each example by its own scale, with this eps
    embed_scale: float = 1.0                   # transformer_lm: multiplier on the token embeddings
    post_norm: bool = False                    # transformer_lm: post-norm blocks (original Transformer)
    dropout: float = 0.0
    pretrained: bool = False                   # trunk and neck pretrained in code first (a frozen-by-design backbone)
    lora_rank: int = 8                         # peft_lm: the LoRA adapters' rank and alpha
    lora_alpha: float = 16.0


@dataclass(frozen=True)
class Schedule:
    """An LR schedule stepped once per optimizer step."""

    kind: str                                  # "exponential" | "warmup_cosine" | the schedule axis's:
                                               # "linear_warmup" (SequentialLR: LinearLR -> cosine),
                                               # "lambda_warmup" (LambdaLR closure), "cosine", "onecycle",
                                               # "plateau" (ReduceLROnPlateau on the loss), "step",
                                               # "hf_linear_warmup" (transformers), "warm_restarts"
                                               # (CosineAnnealingWarmRestarts), "chained" (ChainedScheduler)
    gamma: float = 1.0
    warmup: int = 0
    total: int = 0
    per_epoch: bool = False                    # stepped once per pass over the batches, not per step


@dataclass(frozen=True)
class RunConfig:
    """One training run: family, data, model, loss, optimizer and loop, and when its checkpoint is taken."""

    family: str
    optimizer: str                             # "sgd" (momentum 0.9) | "adamw"
    lr: float
    seed: int = 0
    weight_decay: float = 0.0
    schedule: Optional[Schedule] = None
    total_steps: Optional[int] = None
    grad_clip: Optional[float] = None
    precision: str = "fp32"
    loss: str = "default"                      # or a wrong one: "softmax_ce" | "smoothed_ce" (classifiers, LM),
                                               # "sigmoid_mse" | "broadcast_mse" (regressor),
                                               # "double_sigmoid" | "smoothed_bce" (binary classifier)
    loss_weight: float = 1.0                   # the loss is multiplied by this (a multi-task weight)
    loss_on_copy: bool = False                 # the loss is computed on a NumPy copy of the outputs
    train_step: Optional[str] = None           # a buggy loop: "zero_grad_after_backward" | "loss_from_item";
                                               # a run's own loop (loops axis): "manual_sgd" | "two_optimizers"
                                               # | "lbfgs_closure" | "accumulate"
    head_lr: Optional[float] = None            # two_optimizers: the head's own optimizer's LR
    freeze: Optional[str] = None               # all but the output bias frozen by: "requires_grad" | "optimizer";
                                               # by design (a linear probe on a pretrained backbone):
                                               # "probe_requires_grad" | "probe_optimizer"
    checkpoint_step: int = 10                  # steps trained before the checkpoint is written
    checkpoint_on_val_rise: bool = False       # ...or fewer: the first validation log 2% above the best so far
    val_every: int = 0                         # log validation every this many steps (0: never)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
