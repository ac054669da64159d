"""Fine-tune a pretrained encoder on one task and score it on the dev split.

Defaults follow cramming's GLUE-sane protocol: AdamW lr 4e-5, betas (0.9, 0.98), eps 1e-6, no
weight decay, batch 16, 5 epochs, cosine decay after 10% warm-up, max length 128, first-token pooler.
"""

from __future__ import annotations

import copy
import time

import numpy as np
import torch
from tokenizers import Tokenizer
from tqdm import tqdm

from cramlm.config.base import Config
from cramlm.data.tokenizer import PAD_ID
from cramlm.eval.metrics import score
from cramlm.eval.tasks import Example, Task
from cramlm.models.heads import SequenceClassifier
from cramlm.train.runtime import ImplConfig, autocast, autocast_dtype
from cramlm.train.schedules import CosineConfig, cosine


class EvalConfig(Config):
    tasks: list[str] = ["pkg://tasks/rotten_tomatoes_small"]  # task folders (pkg:// = shipped)
    lr: float = 4e-5
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    weight_decay: float = 0.0
    batch_size: int = 16
    epochs: int = 5
    warmup: float = 0.1  # fraction of steps of linear warm-up before cosine decay
    max_seq_length: int = 128
    dropout: float = 0.1  # classifier dropout
    max_train_examples: int | None = None  # subsample the training split (None: all)
    seed: int = 0


def encode(tok: Tokenizer, examples: list[Example], max_len: int) -> list[list[int]]:
    tok = copy.deepcopy(tok)  # truncation is tokenizer state; leave the caller's alone
    tok.enable_truncation(max_len)
    tok.no_padding()
    pairs = [(e.text_a, e.text_b) if e.text_b is not None else e.text_a for e in examples]
    return [enc.ids for enc in tok.encode_batch(pairs, add_special_tokens=True)]


def pad_batch(ids: list[list[int]], labels: list, regression: bool) -> dict[str, torch.Tensor]:
    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
    y = torch.tensor(labels, dtype=torch.float32 if regression else torch.long)
    return {"input_ids": input_ids, "attention_mask": mask, "labels": y}


@torch.inference_mode()
def predict(model, ids, labels, regression, batch_size, device, amp) -> np.ndarray:
    model.eval()
    order = np.argsort([len(x) for x in ids], kind="stable")  # similar lengths together: less padding
    out = np.zeros(len(ids), dtype=np.float64)
    for start in range(0, len(ids), batch_size * 4):
        idx = order[start : start + batch_size * 4]
        batch = pad_batch([ids[i] for i in idx], [labels[i] for i in idx], regression)
        batch.pop("labels")
        with autocast(device, amp):
            logits = model(**{k: v.to(device) for k, v in batch.items()})["logits"].float()
        out[idx] = (logits.squeeze(-1) if regression else logits.argmax(-1)).cpu().numpy()
    return out


def finetune(
    encoder: torch.nn.Module, tok: Tokenizer, task: Task, cfg: EvalConfig, impl: ImplConfig, device: torch.device
) -> dict:
    """Fine-tune a copy of ``encoder`` on ``task``; dev score after every epoch."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    train = task.train
    if cfg.max_train_examples and len(train) > cfg.max_train_examples:
        train = [train[i] for i in sorted(rng.choice(len(train), cfg.max_train_examples, replace=False))]
    model = SequenceClassifier(copy.deepcopy(encoder), task.num_outputs, cfg.dropout).to(device)
    train_ids, dev_ids = encode(tok, train, cfg.max_seq_length), encode(tok, task.dev, cfg.max_seq_length)
    train_y, dev_y = [e.label for e in train], [e.label for e in task.dev]
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    schedule = cosine(CosineConfig(warmup=cfg.warmup))
    amp = autocast_dtype(impl, device)
    steps_per_epoch = (len(train) + cfg.batch_size - 1) // cfg.batch_size
    total, step, start = steps_per_epoch * cfg.epochs, 0, time.perf_counter()
    epochs = []
    bar = tqdm(total=total, desc=f"fine-tune {task.name}", disable=not impl.progress, dynamic_ncols=True)
    for epoch in range(cfg.epochs):
        model.train()
        order = rng.permutation(len(train))
        for b in range(steps_per_epoch):
            idx = order[b * cfg.batch_size : (b + 1) * cfg.batch_size]
            batch = pad_batch([train_ids[i] for i in idx], [train_y[i] for i in idx], task.is_regression)
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr * schedule(step / total)
            with autocast(device, amp):
                loss = model(**{k: v.to(device) for k, v in batch.items()})["loss"]
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
        preds = predict(model, dev_ids, dev_y, task.is_regression, cfg.batch_size, device, amp)
        epochs.append(score(task.metric, preds, np.asarray(dev_y)))
    bar.close()
    return {
        "task": task.name,
        "metric": task.metric,
        "score": epochs[-1],  # last epoch, as cramming reports
        "best": max(epochs),
        "epochs": epochs,
        "train_examples": len(train),
        "dev_examples": len(task.dev),
        "seconds": round(time.perf_counter() - start, 2),
    }
