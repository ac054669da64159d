"""``cramlm pretrain``: prepare data, build the model, train under the budget, save the run.

Run folder ``<base_dir>/<name>/``: ``model.safetensors`` (its digest in ``digests.json``),
``config.yaml`` (fully resolved; ``config-history.jsonl``: each segment's), ``tokenizer.json``, ``metrics.jsonl`` (train / val / event lines), ``summary.json`` and
``checkpoints/step-*/`` (the newest few, the final one always; ``resume=auto`` continues from it).
Multi-process: ``torchrun --nproc_per_node N -m cramlm pretrain ...`` (see docs/training.md).
"""


from __future__ import annotations

import contextlib
import time
from typing import Any

from cramlm.config.extras import check_extras
from cramlm.run.build import load_data, make_collator, run_model, validation_set
from cramlm.run.config import PretrainConfig
from cramlm.run.console import arch_banner, objective_banner
from cramlm.run.folder import lock_run_dir, logged_steps, prepare_run_dir, record_run, save_run, unlock_run_dir
from cramlm.train.impl import setup_device

# torch and the modules that import it are imported inside the functions below: PretrainConfig
# validates without torch, so `cramlm pretrain` with a typo fails fast (tests/test_cli_imports.py)

# what `cramlm pretrain` with no arguments runs: the tiny model for one minute on the shipped corpus
DEFAULTS: dict[str, Any] = {"arch": "crammed-bert-tiny", "train": "bert-o4-cpu", "data": "default", "impl": "default"}


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


def _pretrain(cfg: PretrainConfig, dist, setup_start: float) -> dict:
    import torch

    from cramlm.data.dataset import BlockDataset
    from cramlm.data.heldout import block_start
    from cramlm.data.tokenizer import tokenizer_label
    from cramlm.models.objectives.base import build_objective, run_objective_name
    from cramlm.train import checkpoint as ckpt
    from cramlm.train.batches import StepData
    from cramlm.train.build import build_trainer, dryrun_config
    from cramlm.train.distributed import barrier, broadcast_object, buffers_recomputable, on_main
    from cramlm.train.optim import resolve_optimizer
    from cramlm.train.sharded import is_sharded

    torch.manual_seed(cfg.seed)
    device = setup_device(cfg.impl, dist.local_rank if dist.enabled else None)
    say = print if dist.main else (lambda *a, **k: None)
    # rank 0 finds the checkpoint (and sets damaged ones aside); every rank vets it
    resume_from = on_main(lambda: ckpt.find_resume(cfg.resume, cfg.run_dir / "checkpoints"), dist)
    if resume_from is None and cfg.resume == "auto" and on_main(lambda: (cfg.run_dir / "summary.json").is_file(), dist):
        raise ValueError(f"{cfg.run_dir} holds a finished run (summary.json) and no checkpoint to continue it from "
                         "(its checkpoints were removed): resume=auto would train it again from step 0; start it afresh "
                         "with overwrite=true, or give the run another name=")
    data = load_data(cfg, dist, resuming=resume_from is not None)
    vocab_size = data.tokenizer.get_vocab_size()
    # under FSDP2 ranks > 0 build on the meta device: their shards come from rank 0's weights
    # (distributed.wrap_model), and they go on from its RNG state, as if they had drawn the weights;
    # resumed from a sharded checkpoint, rank 0 too: no process holds the whole model
    from_shards = dist.sharded and resume_from is not None and is_sharded(resume_from)
    with torch.device("meta") if dist.sharded and (from_shards or not dist.main) else contextlib.nullcontext():
        model = run_model(cfg, vocab_size, device, move=dist.strategy != "fsdp")
    if from_shards and not buffers_recomputable(model):  # a module without reset_buffers(): rank 0's are broadcast
        from_shards = False
        if dist.main:
            model = run_model(cfg, vocab_size, device, move=False)
    if dist.sharded:
        torch.set_rng_state(broadcast_object(torch.get_rng_state(), dist))
    if from_shards:
        say(f"cramlm: every process builds its model on the meta device; its shards come from {resume_from.name}")
    n_params = sum(p.numel() for p in model.parameters())
    try:
        dataset = BlockDataset(data.train, cfg.data.seq_length, block_start(cfg.arch.objective))
    except ValueError as e:  # too little training text: say what preparation left out (train_subset, filters, ...)
        skipped = (data.manifest.get("skipped") or {}) if isinstance(data.manifest, dict) else {}
        if not skipped:
            raise
        left_out = ", ".join(f"{n:,} as {reason}" for reason, n in skipped.items())
        raise ValueError(f"{e}; preparation left out {left_out} of {data.manifest['documents']['read']:,} documents read "
                         f"({data.folder / 'manifest.json'}: skipped)") from None
    steps = StepData(dataset, make_collator(cfg, vocab_size, cfg.seed), cfg.seed, documents=cfg.train.document_attention)
    changes = ckpt.vet_resume(cfg, model, data, resume_from, dist.world, say, device) if resume_from else {}
    train_cfg = dryrun_config(cfg.train, cfg.impl, dist.world) if cfg.dryrun else cfg.train
    heldout = validation_set(cfg, data, vocab_size)
    if heldout is None and cfg.train.validate_sequences:
        why = "has no validation split" if data.val is None else \
            f"has a validation split shorter than one sequence of {cfg.data.seq_length} tokens"
        say(f"cramlm: warning: {data.folder} {why}: this run reports no validation loss")
    trainer = build_trainer(model, steps, train_cfg, cfg.impl, cfg.run_dir, dist=dist, clock=cfg.clock(), device=device,
                            heldout=heldout,
                            sample=make_collator(cfg, vocab_size, cfg.seed + 1)(dataset.batch(range(min(8, len(dataset))))),
                            record={"config": cfg.model_dump(mode="json"), "data": data.identity()})
    if resume_from is not None:
        changes = ckpt.check_precision(resume_from, trainer.precision, cfg.allow_change, changes)
        changes = ckpt.check_newton_schulz(resume_from, cfg.train.optim, trainer.precision, cfg.allow_change, changes)
    if dist.main:
        prepare_run_dir(cfg, resume_from, say)
    barrier(dist)
    if resume_from is not None:
        ckpt.resume_trainer(trainer, resume_from, changes, say, budgets=ckpt.budget_keys(cfg))
    elif cfg.resume == "auto":
        earlier = logged_steps(cfg.run_dir) if dist.main else None
        trainer.restarted = earlier is not None  # an earlier start wrote no checkpoint: its lines stay, this one appends
        say("cramlm: resume=auto found no checkpoint; " + (
            f"starting again from step 0 (metrics.jsonl keeps the earlier start's lines, to step {earlier}, "
            "and the segments table counts them as trained again)" if trainer.restarted else "starting fresh"))
    if dist.main:
        record_run(cfg, data, resume_from, changes, restarted=trainer.restarted)
    barrier(dist)
    setup_seconds = time.perf_counter() - setup_start
    say(
        f"cramlm pretrain: {arch_banner(cfg.arch)} {n_params / 1e6:.2f}M parameters, objective "
        f"{objective_banner(cfg)}, vocab {vocab_size}, "
        f"{len(dataset)} sequences of {cfg.data.seq_length} tokens ({data.folder}), device {device}"
        + (f" x {dist.world} processes ({dist.strategy})" if dist.enabled else "")
        + f", precision {trainer.precision.precision} ({trainer.precision.reason})"
        + (f", Muon's Newton-Schulz iteration in {resolve_optimizer(cfg.train.optim, trainer.precision.precision).ns_dtype}"
           " (train.optim.ns_dtype=auto)" if getattr(cfg.train.optim, "ns_dtype", None) == "auto" else "")
        + f", budget {trainer.budget.describe()}" + (" [dryrun]" if cfg.dryrun else ""))
    result = trainer.fit()
    summary = {"name": cfg.name, "parameters": n_params, "setup_seconds": round(setup_seconds, 3), **result,
               "data": str(data.folder), **({"data_warnings": w} if isinstance(data.manifest, dict) and (w := data.manifest.get("warnings")) else {}),
               "objective": run_objective_name(cfg), **build_objective(cfg).summary(),
               "tokenizer": tokenizer_label(cfg.data.model_dump(mode="json"), vocab_size)}
    save_run(cfg, dist, summary, say)
    return summary
