"""The run's config: :class:`PretrainConfig`, what ``cramlm pretrain`` takes and writes as the run
folder's ``config.yaml`` (the groups arch, train, data, impl and the run's own keys), and the
hours a budget is written in. Importing it imports no torch: a typo fails before torch loads."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from cramlm.config.base import RESUME_FREE, RESUME_GROW, Config, SafeName
from cramlm.config.registry import component
from cramlm.constants import OUTPUTS_DIR
from cramlm.data.prepare import DataConfig
from cramlm.models.base import ModelConfig
from cramlm.train.budget import Clock
from cramlm.train.config import TrainConfig
from cramlm.train.impl import ImplConfig

_UNITS = {"s": 1 / 3600, "m": 1 / 60, "min": 1 / 60, "h": 1.0}


def parse_hours(value: Any) -> Any:
    """Hours as a number, or a string with a unit: '90s', '2m', '1.5h'."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9.eE+-]+)\s*(s|m|min|h)?\s*", value)
        if match:
            return float(match.group(1)) * _UNITS[match.group(2) or "h"]
    return value


def format_hours(hours: float) -> str:
    """Hours in the unit a person would write: 24h, 1.5h, 5m, 90s (what ``budget=`` accepts, so it parses back)."""
    seconds = round(hours * 3600, 6)
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and (seconds / size * 100).is_integer():  # at most two decimals
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def readable_budget(tree: dict) -> dict:
    """A dumped config whose top-level ``budget`` reads '1m', not 0.016666666666666666 (for showing)."""
    if isinstance(tree.get("budget"), float):
        tree["budget"] = format_hours(tree["budget"])
    return tree



class PretrainConfig(Config):
    name: SafeName = Field("default", description="run folder: <base_dir>/<name> (one folder name: no '/', no '..')", json_schema_extra=RESUME_FREE)
    base_dir: str = Field(OUTPUTS_DIR, description="folder holding the run folders (relative to the working directory)", json_schema_extra=RESUME_FREE)
    seed: int = Field(0, description="seeds model init, masking and data order; the same seed and config train the same run")
    budget: float | None = Field(
        1 / 60,
        description=(
            "wall-clock hours of training (cramming: budget=24); '90s', '2m' work too. null: no clock, then "
            "train.budget.tokens/flops/steps must be set. With several budgets the first one spent ends the "
            "run."
        ),
        json_schema_extra={**RESUME_GROW, "shown_default": "1m"},
    )
    count_compile: bool = Field(
        True, description="the first step (where torch.compile and warm-up happen) counts against the hours, as in "
        "cramming; false: its time is left off the clock (always recorded as first_step_seconds)", json_schema_extra=RESUME_FREE)
    count_eval: bool = Field(
        False, description="held-out validation time counts against the hours; false: left off the clock (recorded "
        "as eval_seconds)", json_schema_extra=RESUME_FREE)
    dryrun: bool = Field(
        False, description="full data preparation, then impl.dryrun_steps steps of one microbatch (no clock)"
    )
    resume: str | None = Field(
        None, description='"auto": continue from the newest checkpoint of this run if any; or a checkpoint folder', json_schema_extra=RESUME_FREE
    )
    overwrite: bool = Field(
        False, description="a fresh run in a folder that holds a run already deletes that run whole first (its "
        "checkpoints, weights, metrics, evaluations, report); false: such a folder is refused, naming the ways out "
        "(another name=, --resume auto, overwrite=true)", json_schema_extra=RESUME_FREE)
    allow_change: list[str] = Field(
        [], description="config keys (or key prefixes) a resume may change although they change the maths, e.g. "
        "[train.optim.lr]; each change is recorded (docs/training.md)", json_schema_extra=RESUME_FREE
    )
    plugins: list[str] = Field([], description="modules to import first (they may register components); "
                               "trusted code: importing a module runs it, like any Python import", json_schema_extra=RESUME_FREE)
    arch: component(ModelConfig) = Field(description="the model (the arch group: a component, its type picks the class)")
    train: TrainConfig = Field(TrainConfig(), description="optimizer, schedule, batch, budgets and checkpoints (the train group)")
    data: DataConfig = Field(DataConfig(), description="corpus, tokenizer and packing (the data group)")
    impl: ImplConfig = Field(ImplConfig(), description="device, precision, speed and logging; no effect on the maths (the impl group)", json_schema_extra=RESUME_FREE)

    @field_validator("budget", mode="before")
    @classmethod
    def _hours(cls, value: Any) -> Any:
        return parse_hours(value)

    @field_validator("budget")
    @classmethod
    def _positive(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError("must be positive")
        return value

    def clock(self) -> Clock:
        """The wall clock the run is held to: the hours and what counts against them; a dry run
        has none and stops after impl.dryrun_steps."""
        if self.dryrun:
            return Clock(None, self.count_compile, self.count_eval, step_limit=self.impl.dryrun_steps)
        return Clock(self.budget, self.count_compile, self.count_eval)

    @model_validator(mode="after")
    def _consistent(self):
        """Checks across groups, so that they fail before any data is prepared."""
        max_len = getattr(self.arch, "max_seq_length", None)
        if max_len is not None and self.data.seq_length > max_len:
            raise ValueError(f"data.seq_length={self.data.seq_length} exceeds arch.max_seq_length={max_len}")
        self.train.check_microbatches(self.impl.microbatch_size)
        if self.impl.distributed == "fsdp" and self.train.optim.type == "adafactor":
            raise ValueError("train.optim.type=adafactor does not run under impl.distributed=fsdp (torch's Adafactor "
                             "updates its factored moments in place, which FSDP2's sharded parameters refuse): use "
                             "adamw, muon or sgd, or impl.distributed=ddp")
        if self.overwrite and self.resume is not None:
            raise ValueError(f"overwrite=true starts the run afresh, resume={self.resume} continues it: choose one")
        self._check_objective()
        return self

    def _check_objective(self) -> None:
        """train.objective must train this kind of arch (a masked or a causal LM)."""
        from cramlm.config.registry import config_class, names
        from cramlm.models.objectives.base import run_objective_name

        name = run_objective_name(self)
        objective, arch = config_class("objective", name), type(self.arch).objective

        def types(o) -> tuple[str, ...] | None:  # (a plugin's "crammed-bert" for ("crammed-bert",))
            return (o.arch_types,) if isinstance(o.arch_types, str) else o.arch_types

        def trains(o) -> bool:
            return o.arch_kind == arch and (types(o) is None or self.arch.type in types(o))

        if not trains(objective):
            if objective.arch_kind != arch:
                needs, has = ("a masked LM", "causal") if objective.arch_kind == "mlm" else ("a causal LM", "a masked LM")
            else:
                needs, has = " or ".join(f"arch.type={t}" for t in types(objective)), "not"
            fits = [n for n in names("objective") if trains(config_class("objective", n))]
            raise ValueError(f"train.objective={name} ({objective.title}) needs {needs}; arch.type={self.arch.type} is {has} "
                             f"(its objectives: {', '.join(f'train.objective={n}' for n in fits)})")

    @model_validator(mode="after")
    def _tokenizer_for_objective(self):
        self.data.resolve_tokenizer(type(self.arch).objective)  # data.tokenizer.kind=auto: by the model
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.base_dir) / self.name
