"""Run-folder files, written atomically (temp + rename) so a crash never leaves a broken file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model


def atomic_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def save_weights(model: torch.nn.Module, path: str | Path) -> None:
    """safetensors weights; tied tensors (decoder = embedding) are stored once."""
    path = Path(path)
    tmp = atomic_path(path)
    save_model(model, str(tmp))
    os.replace(tmp, path)


def load_weights(model: torch.nn.Module, path: str | Path, strict: bool = True) -> None:
    missing, unexpected = load_model(model, str(path), strict=strict)
    if strict and (missing or unexpected):
        raise ValueError(f"{path}: missing {missing}, unexpected {unexpected}")


def write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    tmp = atomic_path(path)
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json(path: str | Path, obj) -> None:
    write_text(path, json.dumps(obj, indent=2) + "\n")
