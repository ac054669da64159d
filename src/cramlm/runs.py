"""A run folder, read back: its config class (:class:`PretrainConfig`, what ``cramlm pretrain``
takes and writes as ``config.yaml``) and :func:`load_run` (model, tokenizer, config of a finished run).

A library module: evaluation, export and the pipeline load runs from here, never from the
``cramlm pretrain`` entry point (tests/test_architecture.py). Importing it imports no torch.

Run folder ``<base_dir>/<name>/``: ``model.safetensors``, ``config.yaml`` (fully resolved),
``tokenizer.json``, ``metrics.jsonl``, ``summary.json`` and ``checkpoints/step-*/``.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator, model_validator

from cramlm.config.base import Config, SafeName
from cramlm.config.registry import component
from cramlm.constants import OUTPUTS_DIR
from cramlm.data.prepare import DataConfig
from cramlm.models.base import ModelConfig, build_model
from cramlm.train.config import TrainConfig
from cramlm.train.impl import ImplConfig

if TYPE_CHECKING:
    import torch

_UNITS = {"s": 1 / 3600, "m": 1 / 60, "min": 1 / 60, "h": 1.0}


def parse_hours(value: Any) -> Any:
    """Hours as a number, or a string with a unit: '90s', '2m', '1.5h'."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9.eE+-]+)\s*(s|m|min|h)?\s*", value)
        if match:
            return float(match.group(1)) * _UNITS[match.group(2) or "h"]
    return value


class PretrainConfig(Config):
    name: SafeName = Field("default", description="run folder: <base_dir>/<name> (one folder name: no '/', no '..')")
    base_dir: str = OUTPUTS_DIR
    seed: int = 0
    budget: float | None = Field(
        1 / 60,
        description=(
            "wall-clock hours of training (cramming: budget=24); '90s', '2m' work too. null: no clock, then "
            "train.budget.tokens/flops/steps must be set. With several budgets the first one spent ends the "
            "run."
        ),
    )
    dryrun: bool = Field(
        False, description="full data preparation, then impl.dryrun_steps steps of one microbatch (no clock)"
    )
    resume: str | None = Field(
        None, description='"auto": continue from the newest checkpoint of this run if any; or a checkpoint folder'
    )
    plugins: list[str] = Field([], description="modules to import first (they may register components); "
                               "trusted code: importing a module runs it, like any Python import")
    arch: component(ModelConfig)
    train: TrainConfig = TrainConfig()
    data: DataConfig = DataConfig()
    impl: ImplConfig = ImplConfig()

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

    @model_validator(mode="after")
    def _consistent(self):
        """Checks across groups, so that they fail before any data is prepared."""
        max_len = getattr(self.arch, "max_seq_length", None)
        if max_len is not None and self.data.seq_length > max_len:
            raise ValueError(f"data.seq_length={self.data.seq_length} exceeds arch.max_seq_length={max_len}")
        size = self.train.max_batch_size if self.train.batch_size == "auto" else self.train.batch_size
        if size % self.impl.microbatch_size:
            key = "train.max_batch_size" if self.train.batch_size == "auto" else "train.batch_size"
            raise ValueError(f"{key}={size} must be a multiple of impl.microbatch_size={self.impl.microbatch_size}")
        return self

    @model_validator(mode="after")
    def _tokenizer_for_objective(self):
        self.data.resolve_tokenizer(type(self.arch).objective)  # data.tokenizer.kind=auto: by the model
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.base_dir) / self.name


class CheckpointFileError(ValueError):
    """A checkpoint or run file cannot be used; the message names the file and what is wrong."""


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (OSError, SafetensorError) as e:
        raise CheckpointFileError(f"{path}: not a readable safetensors file, truncated or damaged ({e})") from None


def load_error_reason(e: BaseException) -> str:
    """One short line for a failed torch/safetensors load (torch adds paragraphs of advice)."""
    text = str(e).strip()
    if isinstance(e, pickle.UnpicklingError):  # torch.load(weights_only=True) refused a non-data object
        detail = next((line.strip() for line in text.splitlines() if "nsupported" in line), type(e).__name__)
        return f"refused: it holds more than tensors and plain data, so cramlm did not write it ({detail})"
    first = (text.splitlines() or [""])[0].split(". ")[0]
    return f"{type(e).__name__}: {first}"


def load_run(run_dir: str | Path, device: torch.device | str = "cpu"):
    """(model, tokenizer, config) of a finished run folder."""
    from cramlm.config.loader import load_yaml, validate
    from cramlm.data.tokenizer import load_tokenizer
    from cramlm.train.checkpoint import load_weights

    run_dir = Path(run_dir)
    if not (run_dir / "model.safetensors").is_file():
        raise FileNotFoundError(f"{run_dir}: no model.safetensors (not a finished cramlm run)")
    cfg = validate(PretrainConfig, load_yaml(run_dir / "config.yaml", "run config"))
    tok = load_tokenizer(run_dir)
    model = build_model(cfg.arch, tok.get_vocab_size())
    weights = run_dir / "model.safetensors"
    shapes = safetensors_shapes(weights)  # a truncated or damaged file: one line naming it
    try:
        load_weights(model, weights)
    except RuntimeError as e:  # shapes that do not fit the model its config.yaml (and tokenizer.json) describe
        trained = _trained_vocab(model, shapes, tok.get_vocab_size())
        if trained is not None:
            raise CheckpointFileError(
                f"{run_dir / 'tokenizer.json'}: a vocabulary of {tok.get_vocab_size():,} tokens, but {weights} was trained "
                f"with {trained:,}: the tokenizer is not this run's (replaced, or from another data preparation)") from None
        raise CheckpointFileError(f"{weights}: does not fit the model of {run_dir / 'config.yaml'} ({load_error_reason(e)})") from None
    return model.to(device), tok, cfg


def _trained_vocab(model: torch.nn.Module, shapes: dict[str, tuple[int, ...]], vocab: int) -> int | None:
    """The vocabulary size the weights file was trained with, when that alone is what differs from
    the model built for ``vocab`` tokens (every mismatched tensor differs in a dimension of
    ``vocab``, all by the same other size); else None."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    other: set[int] = set()
    for key, shape in shapes.items():
        want = expected.get(key)
        if want is None or want == shape:
            continue
        if len(want) != len(shape):
            return None
        diff = [(w, g) for w, g in zip(want, shape) if w != g]
        if not all(w == vocab for w, _ in diff):
            return None
        other.update(g for _, g in diff)
    return other.pop() if len(other) == 1 else None


def named_run(path: str | Path) -> Path:
    """``path`` itself, or ``outputs/<path>`` when only that exists: a run name works wherever a run
    folder does (``cramlm report default``, ``cramlm export default ...``)."""
    path = Path(path)
    named = Path(OUTPUTS_DIR) / path
    return named if not path.exists() and named.is_dir() else path
