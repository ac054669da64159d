"""A run folder, read back: its config class (:class:`PretrainConfig`, what ``cramlm pretrain``
takes and writes as ``config.yaml``) and :func:`load_run` (model, tokenizer, config of a finished run).

A library module: evaluation, export and the pipeline load runs from here, never from the
``cramlm pretrain`` entry point (tests/test_architecture.py). Importing it imports no torch.

Run folder ``<base_dir>/<name>/``: ``model.safetensors``, ``config.yaml`` (fully resolved),
``tokenizer.json``, ``metrics.jsonl``, ``summary.json`` and ``checkpoints/step-*/``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator, model_validator

from cramlm.config.base import RESUME_FREE, RESUME_GROW, Config, SafeName
from cramlm.config.registry import component
from cramlm.constants import OUTPUTS_DIR
from cramlm.locks import FolderLock, LockHeld
from cramlm.io import CheckpointFileError, load_error_reason, safetensors_shapes
from cramlm.data.prepare import DataConfig
from cramlm.models.base import ModelConfig, build_model
from cramlm.train.budget import Clock
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

    @model_validator(mode="before")
    @classmethod
    def _validate_batches(cls, data: Any) -> Any:
        """Run folders written before train.validate_sequences hold train.validate_batches
        (microbatches): read as the same number of sequences, so that they still load."""
        train = data.get("train") if isinstance(data, dict) else None
        if isinstance(train, dict) and "validate_batches" in train and "validate_sequences" not in train:
            micro = (data.get("impl") or {}).get("microbatch_size", ImplConfig().microbatch_size)
            train = dict(train)
            batches = train.pop("validate_batches")
            train["validate_sequences"] = batches * micro if isinstance(batches, int) and isinstance(micro, int) else batches
            data = {**data, "train": train}
        return data

    @model_validator(mode="after")
    def _consistent(self):
        """Checks across groups, so that they fail before any data is prepared."""
        max_len = getattr(self.arch, "max_seq_length", None)
        if max_len is not None and self.data.seq_length > max_len:
            raise ValueError(f"data.seq_length={self.data.seq_length} exceeds arch.max_seq_length={max_len}")
        self.train.check_microbatches(self.impl.microbatch_size)
        if self.overwrite and self.resume is not None:
            raise ValueError(f"overwrite=true starts the run afresh, resume={self.resume} continues it: choose one")
        self._check_objective()
        return self

    def _check_objective(self) -> None:
        """train.objective must train this kind of arch (a masked or a causal LM)."""
        from cramlm.config.registry import config_class
        from cramlm.models.objectives.base import run_objective_name

        name = run_objective_name(self)
        objective, arch = config_class("objective", name), type(self.arch).objective
        if objective.arch_kind != arch:
            needs, has = ("a masked LM", "causal") if objective.arch_kind == "mlm" else ("a causal LM", "a masked LM")
            raise ValueError(f"train.objective={name} ({objective.title}) needs {needs}; arch.type={self.arch.type} is {has}")

    @model_validator(mode="after")
    def _tokenizer_for_objective(self):
        self.data.resolve_tokenizer(type(self.arch).objective)  # data.tokenizer.kind=auto: by the model
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.base_dir) / self.name


def load_run(run_dir: str | Path, device: torch.device | str = "cpu"):
    """(model, tokenizer, config) of a finished run folder."""
    from cramlm.config.loader import load_yaml, validate
    from cramlm.data.tokenizer import load_tokenizer
    from cramlm.train.checkpoint import load_weights, verified_weights

    run_dir = Path(run_dir)
    if not (run_dir / "model.safetensors").is_file():
        raise FileNotFoundError(f"{run_dir}: no model.safetensors (not a finished cramlm run)")
    cfg = validate(PretrainConfig, load_yaml(run_dir / "config.yaml", "run config"))
    tok = load_tokenizer(run_dir)
    model = build_model(cfg.arch, tok.get_vocab_size())
    weights = run_dir / "model.safetensors"
    shapes = safetensors_shapes(weights)  # a truncated or damaged file: one line naming it
    verified_weights(weights)  # then a changed one (against the run's digests.json, if any)
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


def _si(x: float) -> str:
    """12,345 -> '12.3k', 4.2e9 -> '4.2G' (console figures)."""
    for size, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= size:
            return f"{x / size:.3g}{suffix}"
    return f"{x:.3g}"


def _objective_label(summary: dict, which: str) -> str:
    """The objective's name (config: ``train_loss`` / ``val_loss``) of a loss in summary.json, its
    ``{key}``s filled from the summary, else from the objective's defaults."""
    from cramlm.config.registry import RegistryError, config_class

    try:
        config = config_class("objective", summary.get("objective") or "mlm")
    except RegistryError:  # a plugin's objective whose plugin is not loaded
        config = config_class("objective", "mlm")
    return getattr(config, which).format(**{**config().model_dump(), **summary})


def train_loss_label(summary: dict) -> str:
    """What the train loss is (an ELECTRA run's adds the weighted detector loss to the generator's)."""
    return _objective_label(summary, "train_loss")


def val_loss_label(summary: dict) -> str:
    return _objective_label(summary, "val_loss")


def console_summary(summary: dict, run_dir: Path) -> str:
    """What the console shows at the end of pretraining (summary.json holds everything)."""
    def loss(x):
        return "-" if x is None else f"{x:.3f}"

    speed = summary.get("tokens_per_second")
    mfu = summary.get("mfu")
    lines = [
        f"cramlm pretrain: done: {summary['steps']:,} steps, {_si(summary['tokens'])} tokens in "
        f"{summary['train_seconds']:.1f} s (+{summary['setup_seconds']:.1f} s setup)"
        + (f", {speed:,.0f} tokens/s" if speed else "") + (f", MFU {100 * mfu:.1f}%" if mfu is not None else ""),
        f"  loss {loss(summary.get('first_loss'))} -> {loss(summary.get('last_loss'))} ({train_loss_label(summary)}), "
        f"validation {loss(summary.get('val_loss'))} ({val_loss_label(summary)}part of the held-out set; "
        "`cramlm eval` scores it all)",
        f"  run folder {run_dir}: model.safetensors, summary.json, metrics.jsonl; "
        f"checkpoint {Path(summary['final_checkpoint']).name}",
    ]
    return "\n".join(lines)


RUN_LOCK = ".cramlm.lock"  # in the run folder; its owner file says which process holds it


RUN_FILES = ("config.yaml", "model.safetensors", "summary.json", "metrics.jsonl", "checkpoints", "pipeline.json",
             "eval.json", "report.html")  # what a folder holding a run holds (any one of them)


class RunFolderTaken(ValueError):
    """A fresh run was pointed at a folder that holds a run; the message names it and the ways out."""


def held_run(run_dir: Path) -> list[str]:
    """The files of a run that ``run_dir`` holds (an empty ``checkpoints/`` does not count)."""
    return [name for name in RUN_FILES if (run_dir / name).is_file()
            or ((run_dir / name).is_dir() and any((run_dir / name).iterdir()))]


def empty_run_dir(run_dir: Path) -> None:
    """Delete everything in ``run_dir`` but its lock (which the caller holds)."""
    import shutil

    for entry in run_dir.iterdir():
        if entry.name in (RUN_LOCK, RUN_LOCK + ".owner"):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def claim_run_dir(run_dir: Path, overwrite: bool, command: str, whose: str = "a run") -> None:
    """A fresh run takes a folder that holds no run; ``overwrite``: it deletes the one there whole
    first; otherwise the folder is refused (HF Trainer's ``overwrite_output_dir``, the other way round)."""
    held = held_run(run_dir)
    if not held:
        return
    if overwrite:
        empty_run_dir(run_dir)
        return
    raise RunFolderTaken(
        f"{run_dir} holds {whose} already ({', '.join(held)}); {command} never starts over it. Continue it with "
        f"--resume auto, pick another name=..., or delete that run and start afresh with overwrite=true")


def lock_run_dir(cfg: PretrainConfig, dist, replace: bool = False) -> FolderLock | None:
    """Rank 0 takes the run folder's lock (a second run of the same name refuses, naming the
    holder) and, for a fresh run, the folder (``claim_run_dir``; ``replace``: the caller owns it,
    as `cramlm run` does its stage's folder); every rank learns the outcome, so none waits for a
    rank that gave up."""
    from cramlm.train.distributed import broadcast_object

    lock, error = None, None
    if dist.main:
        try:
            lock = FolderLock(cfg.run_dir / RUN_LOCK, f"run folder {cfg.run_dir}").acquire()
            if cfg.resume is None and not replace:
                claim_run_dir(cfg.run_dir, cfg.overwrite, "a fresh `cramlm pretrain`")
        except (LockHeld, RunFolderTaken) as e:
            error = (type(e).__name__, str(e))
    error = broadcast_object(error, dist)
    if error is not None:
        if lock is not None:
            lock.release()
        raise (LockHeld if error[0] == "LockHeld" else RunFolderTaken)(error[1])
    return lock


def unlock_run_dir(lock: FolderLock | None, created: bool) -> None:
    """Release; a run folder this run created and left empty (it failed early) is removed again."""
    if lock is None:
        return
    lock.release()
    if created and [p.name for p in lock.path.parent.iterdir()] == [RUN_LOCK]:
        lock.path.unlink(missing_ok=True)
        try:
            lock.path.parent.rmdir()
        except OSError:  # something appeared meanwhile: leave it
            pass


HISTORY = "config-history.jsonl"  # one line per segment of a run: the step it began at, its changes, its config


def record_segment(run_dir: Path, step: int, changes: dict, config: dict, fresh: bool) -> None:
    """A run's config history: a fresh run starts it (step 0), a resume with changes adds a line."""
    from cramlm.io import write_text

    line = json.dumps({"step": step, "changes": changes, "config": config})
    path = run_dir / HISTORY
    previous = path.read_text(encoding="utf-8") if not fresh and path.is_file() else ""
    write_text(path, previous + line + "\n")
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
