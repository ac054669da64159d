"""Fine-tune a pretrained encoder on one task and score every dev split after every epoch.

Defaults follow cramming's GLUE-sane protocol: AdamW lr 4e-5, betas (0.9, 0.98), eps 1e-6, no
weight decay, batch 16, 5 epochs, cosine decay after 10% warm-up, max length 128, first-token
pooler + dense + tanh. Batches are padded per batch (dynamic padding) and grouped by length.

The training step is pretraining's: parameter groups (no decay on biases and norms, tied weights
once) and the optimizer from train/optim.py, the lr schedule from train/schedules.py (at step s of
S, t = s / S: the same factors as Hugging Face's schedules with warm-up, which cramming uses), and
train/step.py's OptimizerStep (autocast, GradScaler for fp16, clipping, the step).
"""

from __future__ import annotations

import copy
import time

import numpy as np
import torch

# the configs live torch-free in eval/config.py (validating a config imports no torch)
from cramlm.eval.config import Hparams
from cramlm.eval.metrics import score_all
from cramlm.eval.tasks import Task, sample
from cramlm.models.heads import SequenceClassifier
from cramlm.progress import progress_bar
from cramlm.train.config import AdamWConfig
from cramlm.train.optim import build_optimizer
from cramlm.train.impl import ImplConfig, autocast, autocast_dtype
from cramlm.train.schedules import ConstantConfig, CosineConfig, PolynomialConfig, Schedule, build_schedule
from cramlm.train.step import OptimizerStep


def schedule_for(hp: Hparams, total: int) -> Schedule:
    """The lr factor as a function of t = step / total: linear warm-up over ``hp.warmup`` (a
    fraction of the steps, or a number of steps when >= 1), then ``hp.schedule``."""
    warmup = hp.warmup if hp.warmup < 1 else hp.warmup / max(1, total)
    cfg = {"cosine": CosineConfig(warmup=warmup), "linear": PolynomialConfig(warmup=warmup, power=1.0),
           "constant": ConstantConfig(warmup=warmup)}[hp.schedule]
    return build_schedule(cfg)


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


class Abandoned(Exception):
    """A stop signal arrived during a fine-tuning: it was given up after the current step."""


def pooling_for(encoder, how: str) -> str:
    """``eval.pooling`` for this encoder: a causal model's first token has seen only itself, so its
    ``first`` is the last real token, the one state that has seen the whole input (a causal cramlm
    run and its export alike: both carry ``causal``)."""
    return "last" if how == "first" and getattr(encoder, "causal", False) else how


def finetune(checkpoint, task: Task, hp: Hparams, seed: int, impl: ImplConfig, device: torch.device, stop=None) -> dict:
    """Fine-tune a copy of ``checkpoint.encoder`` on ``task`` with ``seed``. ``stop`` (a
    train/preemption.py ``StopRequest``) is looked at after every step: once it holds a signal,
    the fine-tuning is abandoned (``Abandoned``): it is redone whole when evaluation continues.

    Returns ``{"seed", "epochs": [{split: {metric: value}}], "train_examples", "seconds"}``."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    train = sample(task.train, hp.max_train_examples)  # the same rows for every model and seed
    dev = {split: sample(exs, hp.max_dev_examples) for split, exs in task.dev.items()}
    max_len = min(hp.max_seq_length, checkpoint.max_length)
    tok, pad_id = checkpoint.tokenizer, checkpoint.tokenizer.pad_id
    train_ids = tok.encode(train, max_len)
    dev_ids = {split: tok.encode(exs, max_len) for split, exs in dev.items()}
    label_dtype = torch.float32 if task.is_regression else torch.long
    train_y = torch.tensor([e.label for e in train], dtype=label_dtype)
    dev_y = {split: np.asarray([e.label for e in exs]) for split, exs in dev.items()}

    model = SequenceClassifier(copy.deepcopy(checkpoint.encoder), task.num_outputs, hp.dropout,
                               pooling=pooling_for(checkpoint.encoder, hp.pooling)).to(device)
    if hp.freeze_encoder:  # a probe: the optimizer gets the pooler and classifier only
        model.encoder.requires_grad_(False)
    optimizer = build_optimizer(AdamWConfig(lr=hp.lr, betas=hp.betas, eps=hp.eps, weight_decay=hp.weight_decay), model)
    amp = autocast_dtype(impl, device, model.encoder)  # auto: the probe at the encoder's widths, as in pretraining
    update = OptimizerStep(optimizer, model, device, amp, hp.grad_clip)
    lengths = np.asarray([len(x) for x in train_ids])
    steps_per_epoch = (len(train) + hp.batch_size - 1) // hp.batch_size
    total = steps_per_epoch * hp.epochs
    schedule = schedule_for(hp, total)
    step, start, epochs = 0, time.perf_counter(), []
    bar = progress_bar(total=total, desc=f"{task.name} seed {seed}", enabled=impl.progress, leave=False)
    for _ in range(hp.epochs):
        model.train()
        if hp.freeze_encoder:
            model.encoder.eval()  # the pretrained states, without the encoder's dropout
        for idx in length_grouped_batches(lengths, hp.batch_size, rng):
            if stop is not None and stop.signal:
                bar.close()
                raise Abandoned(f"{task.name} seed {seed}: abandoned at step {step} of {total}")
            batch = pad_batch([train_ids[i] for i in idx], pad_id)
            batch["labels"] = train_y[idx]
            for group in optimizer.param_groups:
                group["lr"] = hp.lr * schedule(step / total)
            with update.autocast():
                loss = model(**{k: v.to(device) for k, v in batch.items()})["loss"]
            update.backward(loss)
            update()
            step += 1
            if step % 10 == 1:  # reading the loss waits for the device: not every step
                bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)  # update() redraws, at its own pace
            bar.update(1)
        epochs.append({split: score_all(task.metrics, predict(model, ids, task.is_regression, hp.eval_batch_size, pad_id,
                                                           device, amp), dev_y[split]) for split, ids in dev_ids.items()})
    bar.close()
    return {
        "seed": seed,
        "epochs": epochs,
        "train_examples": len(train),
        "dev_examples": {split: len(exs) for split, exs in dev.items()},
        "seconds": round(time.perf_counter() - start, 2),
        "loss_scale": update.scaler.get_scale() if update.scaler.is_enabled() else None,  # fp16 only
    }
