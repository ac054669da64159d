"""The configs of the ``eval`` group: fine-tuning hyperparameters and ``EvalConfig``.

They live here, without torch, so that validating a config imports no torch; finetune.py
re-exports them."""

from __future__ import annotations

from typing import Literal

from cramlm.config.base import Config
from cramlm.eval.tasks import TaskSpec


class Hparams(Config):
    """Fine-tuning hyperparameters; every one can be set per task via ``eval.overrides.<task>``."""

    lr: float = 4e-5
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    weight_decay: float = 0.0  # never applied to biases and norms (as cramming)
    batch_size: int = 16
    epochs: int = 5
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    warmup: float = 0.1  # linear warm-up: a fraction of all steps (< 1) or a number of steps (>= 1)
    max_seq_length: int = 128  # capped at the positions the encoder has
    dropout: float = 0.1  # classifier dropout
    pooling: Literal["first", "mean"] = "first"  # sentence vector: first token ([CLS]) or mean over tokens
    grad_clip: float | None = None
    max_train_examples: int | None = None  # random subset of the training split (None: all)
    max_dev_examples: int | None = None  # first N of each dev split (None: all)
    eval_batch_size: int = 128


def _partial(cls: type[Config]) -> type[Config]:
    """The same fields, all optional (None = not overridden): the type of one per-task override."""
    from pydantic import create_model

    fields = {name: (f.annotation | None, None) for name, f in cls.model_fields.items()}
    return create_model(f"{cls.__name__}Override", __base__=Config, **fields)


HparamsOverride = _partial(Hparams)


class EvalConfig(Hparams):
    """The ``eval`` group: tasks, the protocol (hyperparameters), seeds, per-task overrides."""

    protocol: str = "custom"  # a name for the tables
    tasks: list[str | TaskSpec] = ["pkg://tasks/rotten_tomatoes_small"]  # see eval/tasks.py, eval/glue.py
    glue_dir: str | None = None  # folder in the GLUE layout for glue:<task> tasks; "hf" = datasets
    seeds: int = 1  # fine-tune each task with seeds seed, seed+1, ...; the median is reported
    seed: int = 0
    overrides: dict[str, HparamsOverride] = {}  # task name -> hyperparameters, e.g. {rte: {lr: 2e-5}}
    lm_eval: bool = True  # held-out MLM/CLM loss and bits per byte on the run's validation file (eval/lm.py, heldout-v1)
    lm_data: str | None = None  # a .cramtok file instead of the run's own val.cramtok (same procedure)

    def for_task(self, name: str) -> Hparams:
        """This task's hyperparameters: the protocol's, with ``overrides.<name>`` on top."""
        base = {k: getattr(self, k) for k in Hparams.model_fields}
        override = self.overrides.get(name)
        return Hparams(**{**base, **(override.model_dump(exclude_none=True) if override else {})})
