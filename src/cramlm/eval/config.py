"""The configs of the ``eval`` group: fine-tuning hyperparameters and ``EvalConfig``.

They live here, without torch, so that validating a config imports no torch; finetune.py
fine-tunes with them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from cramlm.config.base import KEYLESS_DEFAULT, Config
from cramlm.eval.pairs import PairsConfig
from cramlm.eval.tasks import TaskSpec


class Hparams(Config):
    """Fine-tuning hyperparameters; every one can be set per task via ``eval.overrides.<task>``."""

    lr: float = Field(4e-5, description="peak learning rate of the fine-tuning AdamW (GLUE-sane: 4e-5; hidden-128 models need ~1e-3)")
    betas: tuple[float, float] = Field((0.9, 0.98), description="AdamW's moving-average coefficients")
    eps: float = Field(1e-6, description="AdamW's epsilon, added to the root of the second moment")
    weight_decay: float = Field(0.0, description="decoupled weight decay; never applied to biases and norms (as cramming)")
    batch_size: int = Field(16, description="training examples per optimizer step")
    epochs: int = Field(5, description="passes over the (capped) training split; every dev split is scored after each")
    schedule: Literal["cosine", "linear", "constant"] = Field(
        "cosine", description="lr after the warm-up, over all fine-tuning steps: cosine or linear decay to 0, or constant")
    warmup: float = Field(
        0.1, description="linear warm-up: a fraction of all steps (< 1) or a number of steps (>= 1)")
    max_seq_length: int = Field(
        128, description="tokens per example (sentence pairs together), truncated; capped at the encoder's positions")
    dropout: float = Field(0.1, description="dropout probability before the classifier layer, during training")
    pooling: Literal["first", "mean"] = Field(
        "first", description="the sentence vector fed to the pooler (dense + tanh) and classifier: the first token "
        "([CLS]) or the mean over non-padding tokens")
    grad_clip: float | None = Field(None, description="max gradient norm (null: no clipping)")
    freeze_encoder: bool = Field(
        False, description="train only the pooler and classifier on the encoder's pretrained states (a probe of what "
        "pretraining put in them: the encoder's weights and dropout stay as pretrained); false: fine-tune everything")
    max_train_examples: int | None = Field(
        None, description="fine-tune on a sample of this many training examples, drawn with a fixed seed (the same rows for every model and every eval.seeds), kept in file order; null: all")
    max_dev_examples: int | None = Field(None, description="score a sample of this many examples of each dev split, drawn with a fixed seed (the same rows for every model and seed), kept in file order; null: all")
    eval_batch_size: int = Field(128, description="examples per forward pass when scoring dev splits (no effect on scores)")


def _partial(cls: type[Config]) -> type[Config]:
    """The same fields, all optional (None = not overridden): the type of one per-task override."""
    from pydantic import create_model

    fields = {name: (f.annotation | None, Field(None, description=f"{f.description} (null: the protocol's)"))
              for name, f in cls.model_fields.items()}
    return create_model(f"{cls.__name__}Override", __base__=Config, **fields)


HparamsOverride = _partial(Hparams)


class SelectConfig(Config):
    """Hyperparameters chosen per task and model on a part of the training split, never on dev."""

    lr: list[Annotated[float, Field(gt=0)]] = Field(
        [], description="learning rates to choose from (empty: the protocol's lr, not chosen)")
    epochs: list[Annotated[int, Field(ge=1)]] = Field(
        [], description="epoch counts to choose from (empty: the protocol's epochs, not chosen)")
    fraction: float = Field(
        0.2, gt=0, lt=1, description="share of the (capped) training split held out to choose on; each grid "
        "configuration trains once (the first seed) on the rest, and the one scoring best on the held-out share "
        "(the task's headline metric, last epoch; the first in grid order on a tie) is then trained on the whole "
        "split with every seed and scored on dev")
    seed: int = Field(1234, description="seed of the held-out share's draw (the same rows for every model)")

    @field_validator("lr", "epochs")
    @classmethod
    def _no_repeats(cls, values: list) -> list:
        # a repeated value would be one grid configuration twice: its second run a copy of the first
        if repeated := sorted({v for v in values if values.count(v) > 1}):
            raise ValueError(f"{', '.join(f'{v:g}' for v in repeated)} given twice; each value once")
        return values

    @property
    def active(self) -> bool:
        return bool(self.lr or self.epochs)

    @property
    def trials(self) -> int:
        """Grid fine-tunings per task (0 when nothing is chosen)."""
        return max(len(self.lr), 1) * max(len(self.epochs), 1) if self.active else 0


class EvalConfig(Hparams):
    """The ``eval`` group: tasks, the protocol (hyperparameters), seeds, per-task overrides."""

    protocol: str = Field("custom", description="the protocol's name, shown in the result tables (glue-sane, cpu-quick, ...)")
    tasks: list[str | TaskSpec] = Field(
        ["pkg://tasks/rotten_tomatoes_small"],
        description="tasks to fine-tune on: task folders (TSV/CSV/JSONL + task.json), glue:<task>, pkg://tasks/<name>, "
        "or inline specs (eval/tasks.py, eval/glue.py)")
    glue_dir: str | None = Field(
        None, description='folder in the GLUE layout that glue:<task> tasks read; "hf": Hugging Face datasets (online)')
    seeds: int = Field(1, description="fine-tune each task with seeds seed, seed+1, ...; the median over them is reported")
    seed: int = Field(0, description="the first fine-tuning seed (head init, data order), and the untrained twin's weights; "
                      "the max_train/dev_examples samples are fixed draws, the same for every seed and model")
    overrides: dict[str, HparamsOverride] = Field(
        {}, description="per-task hyperparameters on top of the protocol's: task name -> keys, e.g. {rte: {lr: 2e-5}}")
    lm_eval: bool = Field(
        True, description="also report the held-out MLM/CLM loss and bits per byte on the run's validation file "
        "(data/heldout.py, definition heldout-v1: the same for every recipe, microbatch, precision and process count)")
    lm_data: str | None = Field(
        None, description="a .cramtok file to score instead of the run's own val.cramtok (same procedure); null: the run's")
    select: SelectConfig = Field(
        SelectConfig(), description="choose lr and epochs per task on a share of the training split (never dev): "
        "e.g. select.lr=[3e-4,1e-3,3e-3] select.epochs=[3,10]; the choice is in eval.json's rows (selected)",
        json_schema_extra=KEYLESS_DEFAULT)
    minimal_pairs: PairsConfig = Field(
        PairsConfig(), description="zero-shot minimal pairs (BLiMP-style JSONL), scored by the pretrained heads without "
        "fine-tuning: accuracy per paradigm, per phenomenon, macro average (eval/pairs.py)")

    @model_validator(mode="after")
    def _select_or_override(self):
        """A task's own lr or epochs (eval.overrides.<task>) under a select grid on the same key would be
        replaced by the grid's choice unsaid: refused, naming both keys."""
        for task, override in self.overrides.items():
            for key in ("lr", "epochs"):
                if getattr(self.select, key) and getattr(override, key) is not None:
                    raise ValueError(f"eval.overrides.{task}.{key} and eval.select.{key} both set {task}'s {key}: the "
                                     f"selection would replace the override; drop one")
        return self

    @property
    def fine_tunings(self) -> int:
        """Fine-tunings in the whole evaluation: every task's seeds and its selection grid."""
        return len(self.tasks) * (self.seeds + self.select.trials)

    def for_task(self, name: str) -> Hparams:
        """This task's hyperparameters: the protocol's, with ``overrides.<name>`` on top."""
        base = {k: getattr(self, k) for k in Hparams.model_fields}
        override = self.overrides.get(name)
        return Hparams(**{**base, **(override.model_dump(exclude_none=True) if override else {})})
