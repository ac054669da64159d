"""Run-folder files and training checkpoints, all written atomically (temp + rename), so a crash,
even a SIGKILL in the middle of a write, never leaves a broken file under a final name.

A checkpoint is a folder ``<run>/checkpoints/step-00000042/`` with

- ``model.safetensors``: the full (unsharded) weights, tied tensors stored once;
- ``training.pt``: optimizer and grad-scaler state (keyed by parameter name, so it loads into any
  number of processes and any sharding), torch/CUDA RNG and the collator's generator;
- ``state.json``: counters (step, tokens, seconds, ...), the data position, Python/NumPy RNG.

It is written as ``.tmp-step-...`` and renamed when complete; ``latest_checkpoint`` only ever sees
complete ones. The newest ``keep`` checkpoints are kept.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, load_model, save_file, save_model


def atomic_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def save_safetensors(tensors: dict, path: str | Path, metadata: dict | None = None) -> None:
    """``safetensors.save_file`` with the permissions of any new file (it creates 0600 files;
    run folders and exports are meant to be shared like the rest: 0666 less the umask)."""
    save_file(tensors, str(path), metadata=metadata)
    os.chmod(path, 0o666 & ~_umask())


def _umask() -> int:
    try:  # Linux: read it, rather than set and restore it (which races with other threads)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_weights(model: torch.nn.Module, path: str | Path) -> None:
    """safetensors weights of a plain module; tied tensors (decoder = embedding) are stored once."""
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


# ------------------------------------------------------------------ tied weights in state dicts


def tied_aliases(model: torch.nn.Module) -> dict[str, str]:
    """{alias: canonical} for parameters registered under several names (e.g. a decoder tied to
    the embedding); the canonical name is the first one in module order."""
    first: dict[int, str] = {}
    aliases = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
    return aliases


def save_state_dict(state: dict[str, torch.Tensor], path: Path, aliases: dict[str, str]) -> None:
    """A full state dict to safetensors with each tied tensor once (loads with ``load_weights``)."""
    tensors = {k: v.contiguous() for k, v in state.items() if k not in aliases}
    save_safetensors(tensors, path, metadata={"format": "pt"})


def load_state_dict(path: Path, aliases: dict[str, str]) -> dict[str, torch.Tensor]:
    state = load_file(str(path))
    for alias, canonical in aliases.items():
        state[alias] = state[canonical]
    return state


# ------------------------------------------------------------------ checkpoint folders

STEP_DIR = re.compile(r"step-(\d+)")


def checkpoint_dirs(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.fullmatch(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(root: Path) -> Path | None:
    dirs = checkpoint_dirs(root)
    return dirs[-1] if dirs else None


def write_checkpoint(
    root: Path,
    step: int,
    model_state: dict[str, torch.Tensor],
    aliases: dict[str, str],
    training: dict,
    state: dict,
    keep: int,
) -> Path:
    """Write one checkpoint folder atomically, then drop all but the newest ``keep``."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_state_dict(model_state, tmp / "model.safetensors", aliases)
    torch.save(training, tmp / "training.pt")
    (tmp / "state.json").write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
    for f in tmp.iterdir():
        _fsync(f)
    if final.exists():  # the same step saved again (e.g. the final checkpoint after a periodic one)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync(root)
    for old in checkpoint_dirs(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def remove_partial_checkpoints(root: Path) -> list[Path]:
    """Delete leftovers of checkpoint writes that were interrupted (by a kill or a crash)."""
    partial = [p for p in root.glob(".tmp-step-*")] if root.is_dir() else []
    for p in partial:
        shutil.rmtree(p, ignore_errors=True)
    return partial


def read_checkpoint(folder: Path, aliases: dict[str, str]) -> tuple[dict, dict, dict]:
    """(model state, training state, counters) of a checkpoint folder."""
    model_state = load_state_dict(folder / "model.safetensors", aliases)
    training = torch.load(folder / "training.pt", map_location="cpu", weights_only=True)
    state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
    return model_state, training, state
