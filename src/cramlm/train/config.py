"""The configs of the ``train`` group: the optimizers and ``TrainConfig``.

They live here, without torch, so that validating a config (``cramlm pretrain`` with a typo,
``cramlm config show``) imports no torch; optim.py registers the builders of the optimizers
declared here."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from cramlm.config.base import (
    KEYLESS_DEFAULT,
    RESUME_FREE,
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
from cramlm.io import did_you_mean
from cramlm.models.objectives.config import HybridConfig, RTDConfig
from cramlm.train.budget import BudgetConfig
from cramlm.train.schedules import BudgetTriangleConfig, ScheduleConfig

Beta = Annotated[float, Field(ge=0, lt=1)]  # a moving-average coefficient


class OptimizerConfig(ComponentConfig):
    kind: ClassVar[str] = "optimizer"
    type: str = Field(description="the optimizer: adamw, adam, sgd, adafactor, lion (torch.optim), or a plugin's "
                      "registered name")
    lr: PositiveFloat = Field(1e-3, description="peak learning rate; the schedule multiplies it by a factor in [0, 1]")
    weight_decay: NonNegativeFloat = Field(
        0.01, description="weight decay coefficient (decoupled for adamw, lion and adafactor; L2 for adam and sgd); never "
        "applied to biases and norm weights")
    decay_embeddings: bool = Field(True, description="apply weight decay to the embedding matrices too (token "
                                   "embeddings and learned position tables)")

class AdamWConfig(OptimizerConfig):
    type: Literal["adamw"] = "adamw"
    betas: tuple[Beta, Beta] = Field(
        (0.9, 0.98), description="moving-average coefficients of the gradient and its square (cramming: 0.9, 0.98)")
    eps: PositiveFloat = Field(1e-12, description="added to the root of the second moment (cramming: 1e-12)")
    fused: bool | None = Field(
        None, description="None: the fused kernel where torch has one (CPU, CUDA; not for FSDP-sharded parameters)"
    )

class AdamConfig(AdamWConfig):
    """Adam with L2 weight decay (bert-original used Adam; set weight_decay=0 for plain Adam); the
    fields are AdamW's, with BERT's defaults."""

    type: Literal["adam"] = "adam"
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    eps: PositiveFloat = 1e-6

class SGDConfig(OptimizerConfig):
    type: Literal["sgd"] = "sgd"
    momentum: Beta = Field(0.9, description="momentum coefficient (0: plain SGD)")
    nesterov: bool = Field(False, description="Nesterov momentum")

class AdafactorConfig(OptimizerConfig):
    """torch.optim.Adafactor (factored second moments: memory O(rows + cols) per matrix)."""

    type: Literal["adafactor"] = "adafactor"
    beta2_decay: Annotated[float, Field(le=0)] = Field(-0.8, description="torch requires <= 0")
    eps: tuple[NonNegativeFloat | None, NonNegativeFloat] = Field(
        (None, 1e-3), description="torch's (eps1, eps2): added to the squared gradient (None: the dtype's eps) and the "
        "floor of the parameter scale of the update")

class LionConfig(OptimizerConfig):
    type: Literal["lion"] = "lion"
    lr: PositiveFloat = 1e-4
    betas: tuple[Beta, Beta] = Field(
        (0.9, 0.99), description="Lion's (beta1, beta2): interpolation for the update's sign, and the momentum decay")
    weight_decay: NonNegativeFloat = 0.1


class MuonConfig(OptimizerConfig):
    """torch.optim.Muon (torch >= 2.9) on the hidden matrices (attention qkv/out, FFN, the MLM head's
    dense), AdamW on the rest (embeddings, the output head, norms, biases, position tables) with its
    own lr. ``lr`` and ``weight_decay`` are Muon's; with ``adjust_lr_fn=match_rms_adamw`` (Moonshot's
    update-RMS match, the default) an AdamW lr is a sensible start for both. ``train.optim.type=muon``
    on the command line, like any component type change, starts from these defaults (keeping only
    keys set earlier on the same command line): the lr, weight decay 0.1 (Moonshot's) and the betas
    and eps below, which equal bert-o4's."""

    type: Literal["muon"] = "muon"
    lr: PositiveFloat = Field(1e-3, description="Muon's peak lr (the hidden matrices)")
    weight_decay: NonNegativeFloat = Field(0.1, description="decoupled weight decay (lr x wd) of Muon's matrices "
                                           "and of AdamW's matrices (embeddings unless decay_embeddings=false)")
    momentum: Beta = Field(0.95, description="Muon's momentum")
    nesterov: bool = Field(True, description="Nesterov momentum in Muon")
    ns_steps: Annotated[int, Field(ge=1, lt=100)] = Field(5, description="Newton-Schulz iterations per matrix per step")
    adjust_lr_fn: Literal["match_rms_adamw", "original"] = Field(
        "match_rms_adamw", description="match_rms_adamw: lr x 0.2 sqrt(max(A, B)), the update RMS of AdamW "
        "(Moonshot); original: lr x sqrt(max(1, A/B)) (Keller Jordan's)")
    adamw_lr: PositiveFloat | None = Field(None, description="peak lr of the AdamW parameters (null: = lr)")
    split_fused: bool = Field(False, description="orthogonalise each block of a fused weight as a matrix of its own "
                              "(attention's q, k and v; a gated FFN's gate and value), as modded-nanogpt does; false: "
                              "the fused matrix as one (torch's Muon as it is)")
    ns_dtype: Literal["bfloat16", "float32", "auto"] = Field(
        "bfloat16", json_schema_extra=KEYLESS_DEFAULT, description="the dtype of the Newton-Schulz iteration: bfloat16 "
        "(torch's and Keller Jordan's Muon), float32, or auto: float32 where the run computes in fp32 "
        "(impl.precision), else bfloat16. A CPU without bf16 matmuls (AVX2 only) emulates bfloat16's: float32 "
        "runs the iteration ~10x faster there")
    # named as AdamW's own: they go to the AdamW part (a preset's block can set them under the same names)
    betas: tuple[Beta, Beta] = Field((0.9, 0.98), description="AdamW's betas (the parameters Muon does not train)")
    eps: PositiveFloat = Field(1e-12, description="AdamW's eps (the parameters Muon does not train)")


for _name, _config in {"adamw": AdamWConfig, "adam": AdamConfig, "sgd": SGDConfig, "adafactor": AdafactorConfig,
                       "lion": LionConfig, "muon": MuonConfig}.items():
    declare("optimizer", _name, _config)


class TrainConfig(Config):
    optim: component(OptimizerConfig) = Field(AdamWConfig(), description="the optimizer (a component: its type picks the class)")
    schedule: component(ScheduleConfig) = Field(
        BudgetTriangleConfig(), description="the lr schedule as a function of the budget fraction t (a component)")
    budget: BudgetConfig = Field(BudgetConfig(), description="token, FLOP and step budgets (the hours and what counts against them: the root keys budget, "
                                "count_compile, count_eval)")
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
    mlm_probability: Probability = Field(
        0.25, description="masked LMs: fraction of tokens selected for prediction, then 80% [MASK] / 10% random / "
        "10% kept (cramming: 0.25, BERT: 0.15); causal LMs ignore it")
    objective: str = Field(
        "mlm", description="the pretraining objective (a component: models/objectives/). Masked LMs: mlm (predict "
        "the masked tokens), rtd (ELECTRA: a small generator trained with MLM fills the masked positions with samples "
        "and the model, the discriminator, predicts which tokens were replaced at every position; train.rtd sizes "
        "it) or hybrid (GPT-BERT: masked next-token prediction mixed with causal LM sequences; train.hybrid). Causal "
        "LMs: clm (mlm, the default, means clm there). Or a plugin's registered name")
    rtd: RTDConfig = Field(RTDConfig(), description="train.objective=rtd: the generator's size and the loss weight")
    hybrid: HybridConfig = Field(
        HybridConfig(), description="train.objective=hybrid: the share of causal sequences (written to a run's "
        "config only when the objective is hybrid)")
    objective_options: dict[str, Any] = Field(
        {}, description="a plugin objective's options, checked by its config class (e.g. "
        "train.objective_options.aux_weight=1.0); the built-in objectives take theirs in their own block "
        "(train.rtd, train.hybrid). Written to a run's config only when set")
    log_every: PositiveInt = Field(10, description="optimizer steps between metric lines", json_schema_extra=RESUME_FREE)
    validate_every: UnitFloat = Field(
        0.25, description="validation loss (val_loss) every this fraction of t, and at the end (0: only at the end)", json_schema_extra=RESUME_FREE
    )
    validate_sequences: NonNegativeInt = Field(
        512, description="val_loss scores the first this many sequences of the held-out set (data/heldout.py), "
        "token-weighted; a quick check of the run, not `cramlm eval`'s held-out loss (0: no validation)", json_schema_extra=RESUME_FREE
    )
    checkpoint_every: NonNegativeInt = Field(0, description="optimizer steps between checkpoints (0: by time only)", json_schema_extra=RESUME_FREE)
    checkpoint_minutes: PositiveFloat | None = Field(
        30.0, description="wall-clock minutes between checkpoints (null: by steps only)", json_schema_extra=RESUME_FREE
    )
    keep_checkpoints: NonNegativeInt = Field(2, description="newest checkpoints kept (0: every one kept, none deleted); the final one is always written", json_schema_extra=RESUME_FREE)
    checkpoint_at: list[Annotated[float, Field(gt=0, lt=1)]] = Field(
        [], description="also a checkpoint at the first step at or past each of these fractions of the budget (t), "
        "kept beside the newest train.keep_checkpoints (never deleted): to evaluate a run along its compute "
        "(cramlm eval checkpoint=<run>/checkpoints/step-N) or branch a cooldown from it; e.g. [0.125,0.25,0.5]",
        json_schema_extra={**RESUME_FREE, **KEYLESS_DEFAULT})
    on_nonfinite: Literal["skip", "rollback", "raise"] = Field(
        "skip", description="NaN/inf loss: drop the step, reload the last checkpoint, or stop", json_schema_extra=RESUME_FREE
    )
    max_nonfinite: NonNegativeInt = Field(20, description="consecutive non-finite steps before the run gives up", json_schema_extra=RESUME_FREE)
    document_attention: bool = Field(
        False, description="tokens attend only within their own document of a packed block (document_ids per "
        "token, positions reset at each document); off: across the whole block, as cramming does"
    )

    @field_validator("checkpoint_at")
    @classmethod
    def _ascending(cls, value: list[float]) -> list[float]:
        return sorted(set(value))

    @field_validator("objective")
    @classmethod
    def _registered(cls, value: str) -> str:
        from cramlm.config.registry import config_class

        config_class("objective", value)  # an unknown name: RegistryError naming the registered ones
        return value

    @model_validator(mode="after")
    def _options_only_when_chosen(self):
        """train.rtd / train.hybrid changed from their defaults under another objective would be ignored: refused."""
        for name, default in (("rtd", RTDConfig()), ("hybrid", HybridConfig())):
            if self.objective != name and name in self.model_fields_set and getattr(self, name) != default:
                raise ValueError(f"train.{name} is set but train.objective={self.objective}: it applies to train.objective={name}")
        return self

    @model_validator(mode="after")
    def _objective_options_fit(self):
        """train.objective_options: the plugin objective's own fields, checked here (a typo names the key)."""
        if not self.objective_options:
            return self
        from pydantic import ValidationError

        from cramlm.config.registry import config_class

        if self.objective in type(self).model_fields:  # a built-in objective with its own block
            raise ValueError(f"train.objective_options is for a plugin's objective; train.objective={self.objective} "
                             f"takes its options in train.{self.objective}")
        options = config_class("objective", self.objective)
        try:
            options.model_validate(self.objective_options)
        except ValidationError as e:
            err = e.errors()[0]
            key = ".".join(str(x) for x in err["loc"])
            msg = err["msg"]
            if err["type"] == "extra_forbidden":  # as the loader says it of any other key
                known = sorted(options.model_fields)
                msg = ("unknown key." + did_you_mean(key, known, "train.objective_options.")
                       + (f" Known keys here: {', '.join(known)}" if known else f" {self.objective} takes no options"))
            raise ValueError(f"train.objective_options.{key}: {msg} (train.objective={self.objective})") from None
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict:
        """The fields, train.hybrid only when the objective is hybrid and train.objective_options only when
        set (other runs' configs stay as they were)."""
        out = handler(self)
        if self.objective != "hybrid":
            out.pop("hybrid", None)
        if not self.objective_options:
            out.pop("objective_options", None)
        return out

    def full_batch(self) -> int:
        """Sequences per optimizer step at the end of the ramp (``max_batch_size`` under ``auto``)."""
        return self.max_batch_size if self.batch_size == "auto" else self.batch_size

    def check_microbatches(self, micro: int, world: int = 1) -> None:
        """The full batch must be a whole number of microbatches on every process (ValueError naming the key)."""
        if self.full_batch() % (micro * world):
            key = "train.max_batch_size" if self.batch_size == "auto" else "train.batch_size"
            processes = f" x {world} processes" if world > 1 else ""
            raise ValueError(f"{key}={self.full_batch()} must be a multiple of impl.microbatch_size={micro}{processes}")
