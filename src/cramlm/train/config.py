"""The configs of the ``train`` group: the optimizers and ``TrainConfig``.

They live here, without torch, so that validating a config (``cramlm pretrain`` with a typo,
``cramlm config show``) imports no torch; optim.py registers the builders of the optimizers
declared here and re-exports these names, trainer.py re-exports ``TrainConfig``."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from cramlm.config.base import (
    ComponentConfig,
    Config,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Probability,
    UnitFloat,
)
from cramlm.config.registry import component, declare
from cramlm.train.budget import BudgetConfig
from cramlm.train.schedules import BudgetTriangleConfig, ScheduleConfig

Beta = Annotated[float, Field(ge=0, lt=1)]  # a moving-average coefficient


class OptimizerConfig(ComponentConfig):
    kind: ClassVar[str] = "optimizer"
    lr: PositiveFloat = 1e-3
    weight_decay: NonNegativeFloat = 0.01
    decay_embeddings: bool = Field(True, description="apply weight decay to embedding matrices too")

class AdamWConfig(OptimizerConfig):
    type: Literal["adamw"] = "adamw"
    betas: tuple[Beta, Beta] = (0.9, 0.98)
    eps: PositiveFloat = 1e-12
    fused: bool | None = Field(
        None, description="None: the fused kernel where torch has one (CPU, CUDA; not for FSDP-sharded parameters)"
    )

class AdamConfig(OptimizerConfig):
    """Adam with L2 weight decay (bert-original used Adam; set weight_decay=0 for plain Adam)."""

    type: Literal["adam"] = "adam"
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    eps: PositiveFloat = 1e-6
    fused: bool | None = None

class SGDConfig(OptimizerConfig):
    type: Literal["sgd"] = "sgd"
    momentum: Beta = 0.9
    nesterov: bool = False

class AdafactorConfig(OptimizerConfig):
    """torch.optim.Adafactor (factored second moments: memory O(rows + cols) per matrix)."""

    type: Literal["adafactor"] = "adafactor"
    beta2_decay: Annotated[float, Field(le=0)] = Field(-0.8, description="torch requires <= 0")
    eps: tuple[NonNegativeFloat | None, NonNegativeFloat] = (None, 1e-3)

class LionConfig(OptimizerConfig):
    type: Literal["lion"] = "lion"
    lr: PositiveFloat = 1e-4
    betas: tuple[Beta, Beta] = (0.9, 0.99)
    weight_decay: NonNegativeFloat = 0.1


for _name, _config in {"adamw": AdamWConfig, "adam": AdamConfig, "sgd": SGDConfig, "adafactor": AdafactorConfig,
                       "lion": LionConfig}.items():
    declare("optimizer", _name, _config)


class TrainConfig(Config):
    optim: component(OptimizerConfig) = AdamWConfig()
    schedule: component(ScheduleConfig) = BudgetTriangleConfig()
    budget: BudgetConfig = Field(BudgetConfig(), description="tokens / FLOPs / steps (hours: the root key `budget`)")
    batch_size: PositiveInt | Literal["auto"] = Field(
        8192, description="sequences per optimizer step, all processes together"
    )
    max_batch_size: PositiveInt = Field(8192, description="what batch_size=auto aims for (then capped by min_updates)")
    batch_ramp: UnitFloat = Field(
        0.6, description="grow the batch from one microbatch to batch_size over this fraction of t (0: off)"
    )
    min_updates: NonNegativeInt = Field(
        100, description="cap the batch so the budget allows at least this many optimizer steps (0: off)"
    )
    grad_clip: PositiveFloat | None = Field(0.5, description="max gradient norm (null: no clipping)")
    mlm_probability: Probability = 0.25
    log_every: PositiveInt = Field(10, description="optimizer steps between metric lines")
    validate_every: UnitFloat = Field(
        0.25, description="validation loss (val_loss) every this fraction of t, and at the end (0: only at the end)"
    )
    validate_sequences: NonNegativeInt = Field(
        512, description="val_loss scores the first this many sequences of the held-out set (eval/lm.py), "
        "token-weighted; a quick check of the run, not `cramlm eval`'s held-out loss (0: no validation)"
    )
    checkpoint_every: NonNegativeInt = Field(0, description="optimizer steps between checkpoints (0: by time only)")
    checkpoint_minutes: PositiveFloat | None = Field(
        30.0, description="wall-clock minutes between checkpoints (null: by steps only)"
    )
    keep_checkpoints: NonNegativeInt = Field(2, description="newest checkpoints kept; the final one is always written")
    on_nonfinite: Literal["skip", "rollback", "raise"] = Field(
        "skip", description="NaN/inf loss: drop the step, reload the last checkpoint, or stop"
    )
    max_nonfinite: NonNegativeInt = Field(20, description="consecutive non-finite steps before the run gives up")
    document_attention: bool = Field(
        False, description="tokens attend only within their own document of a packed block (document_ids per "
        "token, positions reset at each document); off: across the whole block, as cramming does"
    )
