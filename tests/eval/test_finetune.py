"""Fine-tuning paths: 3-class classification and regression train and score; batching helpers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cramlm.data.tokenizer import TokenizerConfig, train_tokenizer
from cramlm.eval.checkpoints import Checkpoint, CramTokenizer
from cramlm.eval.finetune import EvalConfig, Hparams, finetune, length_grouped_batches, lr_factor, pad_batch
from cramlm.eval.tasks import Example, Task
from cramlm.models.crammed_bert import CrammedBert, CrammedBertConfig
from cramlm.train.runtime import ImplConfig

WORDS = ["red", "green", "blue"]
FILLER = "the a of and to in is it that was".split()


def _tiny_checkpoint(texts: list[str]) -> Checkpoint:
    torch.manual_seed(0)
    tok = train_tokenizer(TokenizerConfig(vocab_size=120, min_frequency=1), texts)
    cfg = CrammedBertConfig(hidden_size=64, num_layers=1, num_heads=2, intermediate_size=128, max_seq_length=32)
    return Checkpoint("tiny", CrammedBert(cfg, tok.get_vocab_size()), CramTokenizer(tok), 32, Path("."), "eval", False)


def _sentences(rng, n):
    return [" ".join(rng.choice(FILLER, 4)) for _ in range(n)]


HP = Hparams(lr=1e-2, batch_size=16, epochs=4, warmup=0.1, dropout=0.0)
IMPL = ImplConfig(progress=False, precision="fp32")  # not the machine-dependent auto probe


def test_three_class_task_trains_and_scores():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 160)
    texts = [f"{WORDS[y]} {s} {WORDS[y]} {WORDS[y]}" for s, y in zip(_sentences(rng, 160), labels)]
    examples = [Example(t, None, int(y)) for t, y in zip(texts, labels)]
    task = Task("colors", WORDS, ["accuracy", "matthews"], examples[:128], {"dev": examples[128:]})
    result = finetune(_tiny_checkpoint(texts), task, HP, 0, IMPL, torch.device("cpu"))
    assert len(result["epochs"]) == HP.epochs
    assert result["epochs"][-1]["dev"]["accuracy"] >= 0.9  # the colour word decides the class


def test_regression_task_trains_and_scores():
    rng = np.random.default_rng(1)
    counts = rng.integers(0, 4, 160)  # the target is how many times "blue" occurs
    texts = [" ".join(["blue"] * int(c) + list(rng.choice(FILLER, 4 - int(c)))) for c in counts]
    pairs = [Example(t, "the", float(c)) for t, c in zip(texts, counts)]  # a pair task, too
    task = Task("blues", [], ["pearson", "spearman"], pairs[:128], {"dev": pairs[128:]})
    hp = HP.model_copy(update={"lr": 3e-3})  # 1e-2 overshoots a regression head (the sign of the fit flips)
    result = finetune(_tiny_checkpoint(texts + ["the"]), task, hp, 0, IMPL, torch.device("cpu"))
    final = result["epochs"][-1]["dev"]
    assert set(final) == {"pearson", "spearman"}
    assert final["pearson"] > 0.8  # untrained: about 0


def test_dynamic_padding_and_length_groups():
    batch = pad_batch([[2, 7, 3], [2, 3]], pad_id=9)
    assert batch["input_ids"].tolist() == [[2, 7, 3], [2, 3, 9]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    lengths = np.arange(100)
    batches = length_grouped_batches(lengths, 10, np.random.default_rng(0), pool=10)
    assert sorted(np.concatenate(batches).tolist()) == list(range(100))  # every example once
    assert all(b.max() - b.min() == 9 for b in batches)  # one pool: sorted, so batches are contiguous


def test_schedules():
    assert lr_factor("cosine", 10, 0, 100) == pytest.approx(0.1)
    assert lr_factor("cosine", 10, 10, 100) == pytest.approx(1.0)
    assert lr_factor("cosine", 10, 55, 100) == pytest.approx(0.5)
    assert lr_factor("linear", 0, 50, 100) == pytest.approx(0.5)
    assert lr_factor("constant", 0, 99, 100) == 1.0


def test_per_task_overrides():
    cfg = EvalConfig(lr=4e-5, overrides={"rte": {"lr": 1e-5, "epochs": 10}})
    assert cfg.for_task("rte").lr == 1e-5 and cfg.for_task("rte").epochs == 10
    assert cfg.for_task("rte").batch_size == cfg.batch_size
    assert cfg.for_task("cola").lr == 4e-5
