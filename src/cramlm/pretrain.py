"""``cramlm pretrain``: prepare data, build the model, train under the budget, save the run.

Run folder ``<base_dir>/<name>/``: ``model.safetensors``, ``config.yaml`` (fully resolved),
``tokenizer.json``, ``metrics.jsonl`` (train / val / event lines), ``summary.json`` and
``checkpoints/step-*/`` (the newest few, the final one always; ``resume=auto`` continues from it).
Multi-process: ``torchrun --nproc_per_node N -m cramlm pretrain ...`` (see docs/training.md).
"""

from __future__ import annotations

import pickle
import shutil
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cramlm.config.extras import check_extras
from cramlm.config.loader import to_yaml
from cramlm.data.prepare import prepare_data
from cramlm.data.tokenizer import MASK_ID, SPECIAL_TOKENS, check_special_ids
from cramlm.io import atomic_write, write_json, write_text
from cramlm.locks import FolderLock, LockHeld
from cramlm.models.base import build_model
from cramlm.runs import (  # noqa: F401 (PretrainConfig, load_run ...: also imported from here)
    CheckpointFileError,
    PretrainConfig,
    load_error_reason,
    load_run,
    parse_hours,
    safetensors_shapes,
)
from cramlm.train.config import TrainConfig
from cramlm.train.impl import resolve_precision, setup_device

if TYPE_CHECKING:
    import torch

    from cramlm.train.trainer import Trainer
# torch and the modules that import it are imported inside the functions below: PretrainConfig
# validates without torch, so `cramlm pretrain` with a typo fails fast (tests/test_cli_imports.py)

# what `cramlm pretrain` with no arguments runs: the tiny model for one minute on the shipped corpus
DEFAULTS: dict[str, Any] = {
    "arch": "crammed-bert-tiny",
    "train": "bert-o4-cpu",
    "data": "default",
    "impl": "default",
}

RUN_LOCK = ".cramlm.lock"  # in the run folder; its owner file says which process holds it


def causal_batch(batch) -> dict[str, torch.Tensor]:
    """CLM batches: labels = input_ids (the model shifts). ``batch``: int64 (B, T) ids, or a dict
    with ``input_ids`` and the blocks' document boundaries (train.document_attention), passed through."""
    out = dict(batch) if isinstance(batch, dict) else {"input_ids": batch}
    out["labels"] = out["input_ids"]
    return out


def takes_document_ids(model: torch.nn.Module) -> bool:
    """Whether the model's forward accepts ``document_ids`` (cramlm's models do; a plugin may not)."""
    import inspect

    params = inspect.signature(model.forward).parameters.values()
    return any(p.name == "document_ids" or p.kind is p.VAR_KEYWORD for p in params)


def make_collator(cfg: PretrainConfig, vocab_size: int, seed: int):
    from cramlm.data.collate import MLMCollator

    if cfg.arch.objective == "clm":
        return causal_batch
    return MLMCollator(vocab_size, MASK_ID, len(SPECIAL_TOKENS), cfg.train.mlm_probability, seed)


def validation_batches(cfg: PretrainConfig, data, vocab_size: int) -> list[dict[str, torch.Tensor]]:
    """The held-out microbatches: the same set `cramlm eval` scores (eval/lm.py defines it)."""
    from cramlm.eval.lm import run_held_out_batches

    return run_held_out_batches(cfg, data.val, vocab_size)


def dryrun_plan(cfg: PretrainConfig, world: int) -> tuple[TrainConfig, None]:
    """dryrun=true: impl.dryrun_steps steps of one microbatch per process, validated once at the
    end, under a step budget instead of the clock (a dry run shows that everything runs; it takes
    seconds, whatever the budget)."""
    steps_only = cfg.train.budget.model_copy(update={"tokens": None, "flops": None, "steps": cfg.impl.dryrun_steps})
    train = cfg.train.model_copy(update={
        "budget": steps_only, "batch_size": cfg.impl.microbatch_size * world, "batch_ramp": 0.0, "min_updates": 0,
        "validate_every": 0.0, "checkpoint_every": 0, "checkpoint_minutes": None,
    })
    return train, None


def _si(x: float) -> str:
    """12,345 -> '12.3k', 4.2e9 -> '4.2G' (console figures)."""
    for size, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= size:
            return f"{x / size:.3g}{suffix}"
    return f"{x:.3g}"


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
        f"  loss {loss(summary.get('first_loss'))} -> {loss(summary.get('last_loss'))} (train), "
        f"held-out {loss(summary.get('val_loss'))} (validation set; `cramlm eval` scores the same)",
        f"  run folder {run_dir}: model.safetensors, summary.json, metrics.jsonl; "
        f"checkpoint {Path(summary['final_checkpoint']).name}",
    ]
    return "\n".join(lines)


def find_resume(cfg: PretrainConfig) -> Path | None:
    from cramlm.train.checkpoint import checkpoint_problem, resumable_checkpoint

    if cfg.resume is None:
        return None
    if cfg.resume == "auto":  # the newest checkpoint that verifies (damaged newer ones: set aside, warned)
        return resumable_checkpoint(cfg.run_dir / "checkpoints")
    folder = Path(cfg.resume)
    if not (folder / "state.json").is_file():
        raise FileNotFoundError(f"resume={cfg.resume}: not a checkpoint folder (no state.json)")
    if problem := checkpoint_problem(folder):
        raise ValueError(f"resume={cfg.resume}: damaged checkpoint ({problem})")
    return folder


def lock_run_dir(cfg: PretrainConfig, dist) -> FolderLock | None:
    """Rank 0 takes the run folder's lock (a second run of the same name refuses, naming the
    holder); every rank learns the outcome, so none waits for a rank that gave up."""
    from cramlm.train.distributed import broadcast_object

    lock, error = None, None
    if dist.main:
        try:
            lock = FolderLock(cfg.run_dir / RUN_LOCK, f"run folder {cfg.run_dir}").acquire()
        except LockHeld as e:
            error = str(e)
    error = broadcast_object(error, dist)
    if error is not None:
        raise LockHeld(error)
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


def pretrain(cfg: PretrainConfig) -> dict:
    from cramlm.train.distributed import init_distributed, shutdown

    check_extras(cfg)  # the CLI checked already (resolve_or_exit); a config built in code is checked here
    setup_start = time.perf_counter()
    dist = init_distributed(cfg.impl)
    created = not cfg.run_dir.exists()
    lock = None
    try:
        lock = lock_run_dir(cfg, dist)
        result = _pretrain(cfg, dist, setup_start)
    except BaseException:
        unlock_run_dir(lock, created)
        shutdown(dist, ok=False)  # no barrier: the other ranks may be waiting in another collective
        raise
    unlock_run_dir(lock, created=False)
    shutdown(dist)
    return result


def clear_checkpoints(root: Path) -> list[Path]:
    """Remove the checkpoints an earlier run of this name left: only cramlm's own ``step-<n>``
    folders, never the folder itself or anything else in it."""
    from cramlm.train.checkpoint import checkpoint_dirs

    found = checkpoint_dirs(root)
    for folder in found:
        shutil.rmtree(folder)
    return found


def check_resumable(folder: Path, model: torch.nn.Module, vocab_size: int) -> None:
    """Refuse, before any work, a checkpoint this run cannot continue from: unreadable files, or
    weights of another shape (a different vocabulary or arch), saying which file and what differs."""
    from cramlm.models.base import tied_aliases

    shapes = safetensors_shapes(folder / "model.safetensors")
    aliases = tied_aliases(model)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if k not in aliases}
    problems = [f"{k} is {list(shapes[k])} there, {list(v)} here" for k, v in expected.items() if k in shapes and shapes[k] != v]
    problems += [f"{k} missing there" for k in expected if k not in shapes]
    problems += [f"{k} not in this model" for k in shapes if k not in expected]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise CheckpointFileError(
            f"resume from {folder}: its model.safetensors does not fit this run's model: {'; '.join(problems[:3])}{more}. "
            f"This run's vocabulary has {vocab_size} tokens; the data (tokenizer) or arch config differs from the run "
            "that wrote the checkpoint: resume with the same config, or start a fresh run"
        )
    training = folder / "training.pt"
    try:
        zipfile.ZipFile(training).close()  # its central directory: a truncated file fails here, cheaply
    except (OSError, zipfile.BadZipFile) as e:
        raise CheckpointFileError(f"{training}: not a readable torch checkpoint, truncated or damaged ({e})") from None


def resume_trainer(trainer: Trainer, folder: Path) -> None:
    """``trainer.resume`` with its failures as one clear line naming the checkpoint."""
    from cramlm.train.batches import DataFormatError

    try:
        trainer.resume(folder)
    except DataFormatError as e:
        raise CheckpointFileError(f"resume from {folder}: {e}") from None
    except pickle.UnpicklingError as e:  # training.pt is the checkpoint's only pickle
        raise CheckpointFileError(f"{folder / 'training.pt'}: {load_error_reason(e)}") from None
    except (RuntimeError, KeyError, ValueError) as e:
        raise CheckpointFileError(
            f"resume from {folder}: cannot load it into this run ({load_error_reason(e)}); "
            "was train.optim or the arch changed since it was written?"
        ) from None


def adopt_checkpoint_threads(impl, folder: Path, world: int, say) -> None:
    """impl.threads=auto: resume with the thread count the checkpoint was written with (bitwise
    resume; train/hardware.py ``resume_threads``)."""
    import json

    import torch

    from cramlm.train.hardware import auto_threads, resume_threads

    try:
        written = json.loads((folder / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # check_resumable has vetted it; an older layout simply keeps auto's count
    threads = resume_threads(impl.threads, written if isinstance(written, dict) else {}, torch.get_num_threads(), world,
                             auto_threads(free=None))
    if threads:
        say(f"cramlm: impl.threads=auto: {torch.get_num_threads()} -> {threads} threads, as {folder.name} was written "
            "(a resumed run stays bitwise on course)")
        torch.set_num_threads(threads)


def _pretrain(cfg: PretrainConfig, dist, setup_start: float) -> dict:
    import torch

    from cramlm.data.dataset import BlockDataset
    from cramlm.eval.lm import block_start
    from cramlm.train.budget import Budget, Meter, measure_costs
    from cramlm.train.checkpoint import remove_partial_checkpoints
    from cramlm.train.distributed import barrier, broadcast_object
    from cramlm.train.parallelize import parallelize
    from cramlm.train.trainer import StepData, Trainer

    torch.manual_seed(cfg.seed)
    device = setup_device(cfg.impl, dist.local_rank if dist.enabled else None)
    say = print if dist.main else (lambda *a, **k: None)
    if not dist.main:
        barrier(dist)  # rank 0 prepares (or finds) the data first
    data = prepare_data(cfg.data, cfg.impl.data_cache, progress=cfg.impl.progress and dist.main)
    if dist.main:
        barrier(dist)
    if cfg.arch.objective == "mlm":  # causal LMs take any tokenizer, e.g. GPT-2's own (data.tokenizer.path)
        check_special_ids(data.tokenizer, f"{data.folder}/tokenizer.json (masked-LM batches need cramlm's special ids)")
    vocab_size = data.tokenizer.get_vocab_size()
    model = build_model(cfg.arch, vocab_size).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    if cfg.train.document_attention and not takes_document_ids(model):
        raise ValueError(f"train.document_attention=true: arch.type={cfg.arch.type} takes no document_ids "
                         "(its forward has no such argument); set train.document_attention=false")
    dataset = BlockDataset(data.train, cfg.data.seq_length, block_start(cfg.arch.objective))
    steps = StepData(dataset, make_collator(cfg, vocab_size, cfg.seed), cfg.seed, documents=cfg.train.document_attention)

    run_dir = cfg.run_dir
    resume_from = broadcast_object(find_resume(cfg) if dist.main else None, dist)  # rank 0 checks (and sets aside)
    if resume_from is not None:
        check_resumable(resume_from, model, vocab_size)
        if device.type == "cpu":  # before anything is measured with the thread count
            adopt_checkpoint_threads(cfg.impl, resume_from, dist.world, say)
    if dist.main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if resume_from is None:  # a fresh run replaces the checkpoints an earlier run of this name left
            clear_checkpoints(run_dir / "checkpoints")
        for partial in remove_partial_checkpoints(run_dir / "checkpoints"):
            say(f"cramlm: removed {partial.name}, an interrupted checkpoint write")
        write_text(run_dir / "config.yaml", to_yaml(cfg))
        shutil.copyfile(data.folder / "tokenizer.json", run_dir / "tokenizer.json")
    barrier(dist)
    train_cfg, budget_hours = dryrun_plan(cfg, dist.world) if cfg.dryrun else (cfg.train, cfg.budget)
    val_batches = validation_batches(cfg, data, vocab_size)
    precision = resolve_precision(cfg.impl, device, model)  # MFU against the peak of the precision in use
    costs = measure_costs(model, cfg.data.seq_length, val_batches[0] if val_batches else None, device, precision.dtype)
    meter = Meter(Budget(train_cfg.budget, budget_hours, costs.flops_per_token), costs, dist.world,
                  max_steps=cfg.impl.dryrun_steps if cfg.dryrun else None)
    trainer = Trainer(parallelize(model, cfg.impl, dist, device), steps, train_cfg, cfg.impl, meter, run_dir,
                      val_batches=val_batches, config=cfg.model_dump(mode="json"))
    if resume_from is not None:
        resume_trainer(trainer, resume_from)
        say(f"cramlm: resumed from {resume_from} (step {trainer.used.steps})")
        if not trainer.data.keyed:
            say("cramlm: its data state is format 1 (written before masks were keyed by stream position): the run "
                "continues on that path, bit for bit: every process draws and masks the whole global batch")
    elif cfg.resume == "auto":
        say("cramlm: resume=auto found no checkpoint; starting fresh")
    setup_seconds = time.perf_counter() - setup_start
    say(
        f"cramlm pretrain: {cfg.arch.type} {n_params / 1e6:.2f}M parameters, vocab {vocab_size}, "
        f"{len(dataset)} sequences of {cfg.data.seq_length} tokens ({data.folder}), device {device}"
        + (f" x {dist.world} processes ({dist.strategy})" if dist.enabled else "")
        + f", budget {trainer.budget.describe()}" + (" [dryrun]" if cfg.dryrun else "")
    )
    result = trainer.fit()
    summary = {"name": cfg.name, "parameters": n_params, "setup_seconds": round(setup_seconds, 3), **result,
               "data": str(data.folder)}
    if dist.main:
        with atomic_write(run_dir / "model.safetensors") as tmp:
            shutil.copyfile(Path(result["final_checkpoint"]) / "model.safetensors", tmp)
        write_json(run_dir / "summary.json", summary)
        say(console_summary(summary, run_dir))
    barrier(dist)
    return summary
