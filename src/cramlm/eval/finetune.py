"""Fine-tune a pretrained encoder on one task and score every dev split after every epoch.

Defaults follow cramming's GLUE-sane protocol: AdamW lr 4e-5, betas (0.9, 0.98), eps 1e-6, no
weight decay, batch 16, 5 epochs, cosine decay after 10% warm-up, max length 128, first-token
pooler + dense + tanh. Batches are padded per batch (dynamic padding) and grouped by length.
"""

from __future__ import annotations

import copy
import time
from typing import Literal

import numpy as np
import torch

from cramlm.config.base import Config
from cramlm.eval.metrics import score_all
from cramlm.eval.tasks import Task, TaskSpec
from cramlm.models.heads import SequenceClassifier
from cramlm.progress import progress_bar
from cramlm.train.runtime import ImplConfig, autocast, autocast_dtype


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
    grad_clip: float | None = None
    max_train_examples: int | None = None  # random subset of the training split (None: all)
    max_dev_examples: int | None = None  # first N of each dev split (None: all)
    eval_batch_size: int = 128


def lr_factor(schedule: str, warmup_steps: float, step: int, total: int) -> float:
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1.0, total - warmup_steps))
    return 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + np.cos(np.pi * progress))


def pad_batch(ids: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Dynamic padding: to the longest sequence of this batch only."""
    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
    return {"input_ids": input_ids, "attention_mask": mask}


def length_grouped_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator, pool: int = 50) -> list[np.ndarray]:
    """Shuffled batches of similar lengths: shuffle, sort within pools of ``pool`` batches, cut,
    shuffle the batches. Less padding than random batches, still a random order."""
    order = rng.permutation(len(lengths))
    batches = []
    for start in range(0, len(order), batch_size * pool):
        chunk = order[start : start + batch_size * pool]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


@torch.inference_mode()
def predict(model, ids: list[list[int]], regression: bool, batch_size: int, pad_id: int, device, amp) -> np.ndarray:
    model.eval()
    order = np.argsort([len(x) for x in ids], kind="stable")  # sorted by length: least padding
    out = np.zeros(len(ids), dtype=np.float64)
    for start in range(0, len(ids), batch_size):
        idx = order[start : start + batch_size]
        batch = pad_batch([ids[i] for i in idx], pad_id)
        with autocast(device, amp):
            logits = model(**{k: v.to(device) for k, v in batch.items()})["logits"].float()  # (B, C)
        out[idx] = (logits.squeeze(-1) if regression else logits.argmax(-1)).cpu().numpy()
    return out


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """No weight decay on biases and norm weights (1-D tensors)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def finetune(checkpoint, task: Task, hp: Hparams, seed: int, impl: ImplConfig, device: torch.device) -> dict:
    """Fine-tune a copy of ``checkpoint.encoder`` on ``task`` with ``seed``.

    Returns ``{"seed", "epochs": [{split: {metric: value}}], "train_examples", "seconds"}``."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    train = task.train
    if hp.max_train_examples and len(train) > hp.max_train_examples:
        train = [train[i] for i in sorted(rng.choice(len(train), hp.max_train_examples, replace=False))]
    dev = {split: exs[: hp.max_dev_examples] if hp.max_dev_examples else exs for split, exs in task.dev.items()}
    max_len = min(hp.max_seq_length, checkpoint.max_length)
    tok, pad_id = checkpoint.tokenizer, checkpoint.tokenizer.pad_id
    train_ids = tok.encode(train, max_len)
    dev_ids = {split: tok.encode(exs, max_len) for split, exs in dev.items()}
    label_dtype = torch.float32 if task.is_regression else torch.long
    train_y = torch.tensor([e.label for e in train], dtype=label_dtype)
    dev_y = {split: np.asarray([e.label for e in exs]) for split, exs in dev.items()}

    model = SequenceClassifier(copy.deepcopy(checkpoint.encoder), task.num_outputs, hp.dropout).to(device)
    optimizer = torch.optim.AdamW(param_groups(model, hp.weight_decay), lr=hp.lr, betas=hp.betas, eps=hp.eps)
    amp = autocast_dtype(impl, device, model.encoder)  # auto: the probe at the encoder's widths, as in pretraining
    lengths = np.asarray([len(x) for x in train_ids])
    steps_per_epoch = (len(train) + hp.batch_size - 1) // hp.batch_size
    total = steps_per_epoch * hp.epochs
    warmup = hp.warmup * total if hp.warmup < 1 else hp.warmup
    step, start, epochs = 0, time.perf_counter(), []
    bar = progress_bar(total=total, desc=f"{task.name} seed {seed}", enabled=impl.progress, leave=False)
    for _ in range(hp.epochs):
        model.train()
        for idx in length_grouped_batches(lengths, hp.batch_size, rng):
            batch = pad_batch([train_ids[i] for i in idx], pad_id)
            batch["labels"] = train_y[idx]
            for group in optimizer.param_groups:
                group["lr"] = hp.lr * lr_factor(hp.schedule, warmup, step, total)
            with autocast(device, amp):
                loss = model(**{k: v.to(device) for k, v in batch.items()})["loss"]
            loss.backward()
            if hp.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), hp.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)  # update() redraws, at its own pace
            bar.update(1)
        epochs.append(
            {
                split: score_all(task.metrics, predict(model, ids, task.is_regression, hp.eval_batch_size, pad_id, device, amp), dev_y[split])
                for split, ids in dev_ids.items()
            }
        )
    bar.close()
    return {
        "seed": seed,
        "epochs": epochs,
        "train_examples": len(train),
        "dev_examples": {split: len(exs) for split, exs in dev.items()},
        "seconds": round(time.perf_counter() - start, 2),
    }


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
    lm_eval: bool = True  # held-out MLM loss / CLM perplexity on the run's packed validation set
    lm_max_sequences: int = 512
    lm_data: str | None = None  # a .cramtok file instead of the run's own val.cramtok

    def for_task(self, name: str) -> Hparams:
        """This task's hyperparameters: the protocol's, with ``overrides.<name>`` on top."""
        base = {k: getattr(self, k) for k in Hparams.model_fields}
        override = self.overrides.get(name)
        return Hparams(**{**base, **(override.model_dump(exclude_none=True) if override else {})})
