"""``cramlm pretrain``: prepare data, build the model, train under the budget, save the run.

Run folder ``<base_dir>/<name>/``: ``model.safetensors``, ``config.yaml`` (fully resolved),
``tokenizer.json``, ``metrics.jsonl`` (one line per logged step), ``summary.json``.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from pydantic import field_validator

from cramlm.config.base import Config, component
from cramlm.config.loader import to_yaml
from cramlm.data.collate import MLMCollator
from cramlm.data.dataset import BlockDataset, ShuffledStream
from cramlm.data.prepare import DataConfig, prepare_data
from cramlm.data.tokenizer import CLS_ID, MASK_ID, SPECIAL_TOKENS, check_special_ids
from cramlm.models.base import ModelConfig, build_model
from cramlm.train.checkpoint import save_weights, write_json, write_text
from cramlm.train.runtime import ImplConfig, setup_device
from cramlm.train.trainer import TrainConfig, check_batch, train

# what `cramlm pretrain` with no arguments runs: the tiny model for one minute on the shipped corpus
DEFAULTS: dict[str, Any] = {
    "arch": "crammed-bert-tiny",
    "train": "bert-o4-cpu",
    "data": "default",
    "impl": "default",
}

_UNITS = {"s": 1 / 3600, "m": 1 / 60, "min": 1 / 60, "h": 1.0}


def parse_hours(value: Any) -> Any:
    """Hours as a number, or a string with a unit: '90s', '2m', '1.5h'."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9.eE+-]+)\s*(s|m|min|h)?\s*", value)
        if match:
            return float(match.group(1)) * _UNITS[match.group(2) or "h"]
    return value


class PretrainConfig(Config):
    name: str = "default"  # run folder: <base_dir>/<name>
    base_dir: str = "outputs"
    seed: int = 0
    budget: float = 1 / 60  # wall-clock hours of training (cramming: budget=24); '90s', '2m' work too
    dryrun: bool = False  # full data preparation, then impl.dryrun_steps optimizer steps only
    plugins: list[str] = []  # modules to import first (they may register components)
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
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be positive")
        return value

    @property
    def run_dir(self) -> Path:
        return Path(self.base_dir) / self.name


def batch_stream(dataset: BlockDataset, collator: MLMCollator, microbatch: int, seed: int):
    order = ShuffledStream(len(dataset), seed)
    while True:
        yield collator(dataset.batch(order.take(microbatch)))


def pretrain(cfg: PretrainConfig) -> dict:
    check_batch(cfg.train, cfg.impl)
    setup_start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    device = setup_device(cfg.impl)
    data = prepare_data(cfg.data, cfg.impl.data_cache, progress=cfg.impl.progress)
    if cfg.data.seq_length > cfg.arch.max_seq_length:
        raise ValueError(f"data.seq_length={cfg.data.seq_length} exceeds arch.max_seq_length={cfg.arch.max_seq_length}")
    check_special_ids(data.tokenizer, f"{data.folder}/tokenizer.json (masked-LM batches need cramlm's special ids)")
    vocab_size = data.tokenizer.get_vocab_size()
    model = build_model(cfg.arch, vocab_size).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    dataset = BlockDataset(data.train, cfg.data.seq_length, CLS_ID)
    collator = MLMCollator(vocab_size, MASK_ID, len(SPECIAL_TOKENS), cfg.train.mlm_probability, cfg.seed)

    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    write_text(run_dir / "config.yaml", to_yaml(cfg))
    shutil.copyfile(data.folder / "tokenizer.json", run_dir / "tokenizer.json")
    setup_seconds = time.perf_counter() - setup_start
    print(
        f"cramlm pretrain: {cfg.arch.type} {n_params / 1e6:.2f}M parameters, vocab {vocab_size}, "
        f"{len(dataset)} sequences of {cfg.data.seq_length} tokens ({data.folder}), device {device}, "
        f"budget {cfg.budget * 3600:.0f}s" + (" [dryrun]" if cfg.dryrun else "")
    )
    result = train(
        model,
        batch_stream(dataset, collator, cfg.impl.microbatch_size, cfg.seed),
        cfg.train,
        cfg.impl,
        device,
        cfg.budget * 3600,
        run_dir / "metrics.jsonl",
        max_steps=cfg.impl.dryrun_steps if cfg.dryrun else None,
    )
    save_weights(model, run_dir / "model.safetensors")
    summary = {
        "name": cfg.name,
        "parameters": n_params,
        "setup_seconds": round(setup_seconds, 3),
        "budget_seconds": round(cfg.budget * 3600, 3),
        **result.summary(),
        "data": str(data.folder),
    }
    write_json(run_dir / "summary.json", summary)
    print(json.dumps(summary))
    print(f"first loss {summary['first_loss']}, last loss {summary['last_loss']}; checkpoint in {run_dir}")
    return summary


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
    load_weights(model, run_dir / "model.safetensors")
    return model.to(device), tok, cfg
