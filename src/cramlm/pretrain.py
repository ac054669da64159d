"""``cramlm pretrain``: prepare data, build the model, train under the budget, save the run.

Run folder ``<base_dir>/<name>/``: ``model.safetensors`` (its digest in ``digests.json``),
``config.yaml`` (fully resolved; ``config-history.jsonl``: each segment's), ``tokenizer.json``, ``metrics.jsonl`` (train / val / event lines), ``summary.json`` and
``checkpoints/step-*/`` (the newest few, the final one always; ``resume=auto`` continues from it).
Multi-process: ``torchrun --nproc_per_node N -m cramlm pretrain ...`` (see docs/training.md).
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cramlm.config.extras import check_extras
from cramlm.config.loader import to_yaml
from cramlm.data.prepare import prepare_data
from cramlm.data.tokenizer import check_special_ids
from cramlm.io import atomic_write, save_safetensors, write_digests, write_json, write_text
from cramlm.models.base import build_model, takes_document_ids
from cramlm.runs import (  # noqa: F401 (PretrainConfig, load_run ...: also imported from here)
    RUN_LOCK,
    CheckpointFileError,
    PretrainConfig,
    console_summary,
    load_run,
    lock_run_dir,
    parse_hours,
    record_segment,
    unlock_run_dir,
)
from cramlm.train.impl import setup_device

if TYPE_CHECKING:
    import torch
# torch and the modules that import it are imported inside the functions below: PretrainConfig
# validates without torch, so `cramlm pretrain` with a typo fails fast (tests/test_cli_imports.py)

# what `cramlm pretrain` with no arguments runs: the tiny model for one minute on the shipped corpus
DEFAULTS: dict[str, Any] = {"arch": "crammed-bert-tiny", "train": "bert-o4-cpu", "data": "default", "impl": "default"}


def arch_banner(arch) -> str:
    """The architecture as the banner names it: 'crammed-bert', 'bert-original (type crammed-bert)'."""
    from cramlm.models.hf import architecture_name

    name = architecture_name(arch)
    return name if name == arch.type else f"{name} (type {arch.type})"


def make_collator(cfg: PretrainConfig, vocab_size: int, seed: int):
    """The batches the run's objective trains on (models/objectives/)."""
    from cramlm.models.objectives.base import build_objective

    return build_objective(cfg).collator(vocab_size, seed)


def run_objective(cfg: PretrainConfig) -> str:
    """What the run trains and its held-out loss measures: mlm, clm, rtd (ELECTRA; its loss is the
    generator's MLM loss, not comparable with an MLM run's), hybrid or a plugin's objective."""
    from cramlm.models.objectives.base import run_objective_name

    return run_objective_name(cfg)


def objective_banner(cfg: PretrainConfig) -> str:
    """The objective as the banner names it: 'rtd (ELECTRA: generator MLM + replaced-token detection)'."""
    from cramlm.config.registry import config_class

    name = run_objective(cfg)
    return f"{name} ({config_class('objective', name).title})"


def validation_set(cfg: PretrainConfig, data, vocab_size: int):
    """val_loss's sequences: the first train.validate_sequences of the held-out set that
    `cramlm eval` scores in full (eval/lm.py defines it); None without validation."""
    from cramlm.eval.lm import run_heldout_set

    heldout = run_heldout_set(cfg, data.val, vocab_size, data.folder / "val.cramtok")
    return heldout.first(cfg.train.validate_sequences) if heldout is not None and cfg.train.validate_sequences else None


def pretrain(cfg: PretrainConfig, replace: bool = False) -> dict:
    """Train the run ``cfg`` describes. A fresh run refuses a folder holding a run (unless
    ``overwrite=true``); ``replace``: the caller owns the folder and retrains in it (`cramlm run`'s
    pretrain stage, whose record says the folder is its recipe's)."""
    from cramlm.train.distributed import init_distributed, shutdown

    check_extras(cfg)  # the CLI checked already (resolve_or_exit); a config built in code is checked here
    setup_start = time.perf_counter()
    dist = init_distributed(cfg.impl)
    created = not cfg.run_dir.exists()
    lock = None
    try:
        lock = lock_run_dir(cfg, dist, replace)
        result = _pretrain(cfg, dist, setup_start)
    except BaseException:
        unlock_run_dir(lock, created)
        shutdown(dist, ok=False)  # no barrier: the other ranks may be waiting in another collective
        raise
    unlock_run_dir(lock, created=False)
    shutdown(dist)
    return result


def load_data(cfg: PretrainConfig, dist):
    """The prepared data (rank 0 prepares or finds it first, the others then load it)."""
    from cramlm.train.distributed import barrier

    if not dist.main:
        barrier(dist)
    data = prepare_data(cfg.data, cfg.impl.data_cache, progress=cfg.impl.progress and dist.main)
    if dist.main:
        barrier(dist)
    if cfg.arch.objective == "mlm":  # causal LMs take any tokenizer, e.g. GPT-2's own (data.tokenizer.path)
        check_special_ids(data.tokenizer, f"{data.folder}/tokenizer.json (masked-LM batches need cramlm's special ids)")
    return data


def run_model(cfg: PretrainConfig, vocab_size: int, device, move: bool = True) -> torch.nn.Module:
    """The run's model, on ``device`` (``move=False``: left on the host, as FSDP2 wants it: it moves
    each block to the device as it shards it, so the whole model never has to fit one device)."""
    from cramlm.models.objectives.base import build_objective

    model = build_objective(cfg).training_model(build_model(cfg.arch, vocab_size))  # e.g. ELECTRA's around the arch
    if move:
        model = model.to(device)
    if cfg.train.document_attention and not takes_document_ids(model):
        raise ValueError(f"train.document_attention=true: arch.type={cfg.arch.type} takes no document_ids "
                         "(its forward has no such argument); set train.document_attention=false")
    return model


def prepare_run_dir(cfg: PretrainConfig, resume_from: Path | None, say) -> None:
    """Rank 0: the run folder, no checkpoints of an earlier run of this name (`cramlm run` retraining
    in its own folder; any other fresh run has claimed an empty one), no interrupted checkpoint writes."""
    from cramlm.train.checkpoint import clear_checkpoints, remove_partial_checkpoints

    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    if resume_from is None:
        clear_checkpoints(run_dir / "checkpoints")
    for partial in remove_partial_checkpoints(run_dir / "checkpoints"):
        say(f"cramlm: removed {partial.name}, an interrupted checkpoint write")


def record_run(cfg: PretrainConfig, data, resume_from: Path | None, changes: dict) -> None:
    """Rank 0, once the run has started or its resume has loaded (a refused resume writes nothing):
    this segment's config (config.yaml; config-history.jsonl keeps every segment's) and the run's tokenizer."""
    from cramlm.train.checkpoint import written_state

    run_dir = cfg.run_dir
    if resume_from is None or changes:
        step = written_state(resume_from)["usage"]["steps"] if resume_from else 0
        record_segment(run_dir, step, changes, cfg.model_dump(mode="json"), fresh=resume_from is None)
    write_text(run_dir / "config.yaml", to_yaml(cfg))
    shutil.copyfile(data.folder / "tokenizer.json", run_dir / "tokenizer.json")


def save_run(cfg: PretrainConfig, dist, summary: dict, say) -> None:
    """Rank 0: the final weights (with their digest) and summary.json."""
    from cramlm.train.distributed import barrier

    from cramlm.models.objectives.base import build_objective

    if dist.main:
        final = Path(summary["final_checkpoint"]) / "model.safetensors"
        names = ["model.safetensors"]
        objective = build_objective(cfg)
        if written := sharded_weights(final.parent, cfg.run_dir, objective):
            names = written
        elif objective.trained_parts:  # the arch under its own names (fine-tuning), and beside it the
            from safetensors.torch import load_file  # parts it lacks (eval, export): ELECTRA's generator and detector

            state = load_file(str(final))
            save_safetensors(objective.encoder_state(state), cfg.run_dir / "model.safetensors", {"format": "pt"})
            save_safetensors(objective.parts_state(state), cfg.run_dir / objective.trained_parts, {"format": "pt"})
            names.append(objective.trained_parts)
        else:
            with atomic_write(cfg.run_dir / "model.safetensors") as tmp:
                shutil.copyfile(final, tmp)
        write_digests(cfg.run_dir, names)
        write_json(cfg.run_dir / "summary.json", summary)
        say(console_summary(summary, cfg.run_dir))
    barrier(dist)


def sharded_weights(folder: Path, run_dir: Path, objective) -> list[str]:
    """A sharded final checkpoint (``folder``): the run's model.safetensors (the arch's weights; an
    objective with trained parts, e.g. ELECTRA: those beside it) assembled from the shards a tensor
    at a time on this process, never the optimizer's; the files written ([] for a full checkpoint)."""
    from cramlm.train.sharded import is_sharded, stream_weights, weight_shapes

    if not is_sharded(folder):
        return []
    if not objective.trained_parts:
        stream_weights(folder, run_dir / "model.safetensors")
        return ["model.safetensors"]
    names = {k: k for k in weight_shapes(folder)}  # the objective's selections applied to names: {new name: name}
    for part, select in (("model.safetensors", objective.encoder_state), (objective.trained_parts, objective.parts_state)):
        renamed = {old: new for new, old in select(names).items()}
        stream_weights(folder, run_dir / part, rename=renamed.get)
    return ["model.safetensors", objective.trained_parts]


def _pretrain(cfg: PretrainConfig, dist, setup_start: float) -> dict:
    import torch

    from cramlm.data.dataset import BlockDataset
    from cramlm.eval.lm import block_start, tokenizer_label
    from cramlm.models.objectives.base import build_objective
    from cramlm.train import checkpoint as ckpt
    from cramlm.train.build import build_trainer, dryrun_config
    from cramlm.train.distributed import barrier, broadcast_object
    from cramlm.train.batches import StepData

    torch.manual_seed(cfg.seed)
    device = setup_device(cfg.impl, dist.local_rank if dist.enabled else None)
    say = print if dist.main else (lambda *a, **k: None)
    data = load_data(cfg, dist)
    vocab_size = data.tokenizer.get_vocab_size()
    # under FSDP2 ranks > 0 build on the meta device: their shards come from rank 0's weights
    # (distributed.wrap_model), and they go on from its RNG state, as if they had drawn the weights
    with torch.device("meta") if dist.sharded and not dist.main else contextlib.nullcontext():
        model = run_model(cfg, vocab_size, device, move=dist.strategy != "fsdp")
    if dist.sharded:
        torch.set_rng_state(broadcast_object(torch.get_rng_state(), dist))
    n_params = sum(p.numel() for p in model.parameters())
    dataset = BlockDataset(data.train, cfg.data.seq_length, block_start(cfg.arch.objective))
    steps = StepData(dataset, make_collator(cfg, vocab_size, cfg.seed), cfg.seed, documents=cfg.train.document_attention)
    # rank 0 finds the checkpoint (and sets damaged ones aside); every rank vets it
    resume_from = broadcast_object(ckpt.find_resume(cfg.resume, cfg.run_dir / "checkpoints") if dist.main else None, dist)
    changes = ckpt.vet_resume(cfg, model, data, resume_from, dist.world, say) if resume_from else {}
    train_cfg = dryrun_config(cfg.train, cfg.impl, dist.world) if cfg.dryrun else cfg.train
    trainer = build_trainer(model, steps, train_cfg, cfg.impl, cfg.run_dir, dist=dist, clock=cfg.clock(), device=device,
                            heldout=validation_set(cfg, data, vocab_size),
                            sample=make_collator(cfg, vocab_size, cfg.seed + 1)(dataset.batch(range(min(8, len(dataset))))),
                            record={"config": cfg.model_dump(mode="json"), "data": data.identity()})
    if resume_from is not None:
        changes = ckpt.check_precision(resume_from, trainer.precision, cfg.allow_change, changes)
    if dist.main:
        prepare_run_dir(cfg, resume_from, say)
    barrier(dist)
    if resume_from is not None:
        ckpt.resume_trainer(trainer, resume_from, changes, say, budgets=ckpt.budget_keys(cfg))
    elif cfg.resume == "auto":
        say("cramlm: resume=auto found no checkpoint; starting fresh")
    if dist.main:
        record_run(cfg, data, resume_from, changes)
    barrier(dist)
    setup_seconds = time.perf_counter() - setup_start
    say(
        f"cramlm pretrain: {arch_banner(cfg.arch)} {n_params / 1e6:.2f}M parameters, objective "
        f"{objective_banner(cfg)}, vocab {vocab_size}, "
        f"{len(dataset)} sequences of {cfg.data.seq_length} tokens ({data.folder}), device {device}"
        + (f" x {dist.world} processes ({dist.strategy})" if dist.enabled else "")
        + f", precision {trainer.precision.precision} ({trainer.precision.reason})"
        + f", budget {trainer.budget.describe()}" + (" [dryrun]" if cfg.dryrun else ""))
    result = trainer.fit()
    summary = {"name": cfg.name, "parameters": n_params, "setup_seconds": round(setup_seconds, 3), **result,
               "data": str(data.folder), "objective": run_objective(cfg), **build_objective(cfg).summary(),
               "tokenizer": tokenizer_label(cfg.data.model_dump(mode="json"), vocab_size)}
    save_run(cfg, dist, summary, say)
    return summary
