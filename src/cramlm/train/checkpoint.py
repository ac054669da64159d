"""Training checkpoints, written atomically (temp folder + rename; single files: :mod:`cramlm.io`), so a
crash, even a SIGKILL in the middle of a write, never leaves a broken file under a final name.

A checkpoint is a folder ``<run>/checkpoints/step-00000042/`` with

- ``model.safetensors``: the full (unsharded) weights, tied tensors stored once;
- ``training.pt``: optimizer and grad-scaler state (keyed by parameter name, so it loads into any
  number of processes and any sharding), the data position (shuffled stream and the collator's
  generator), torch/CUDA RNG;
- ``state.json``: the trainer's counters (step, tokens, seconds, events, ...), Python/NumPy RNG.

It is written as ``.tmp-step-...`` and renamed when complete; ``latest_checkpoint`` only ever sees
complete ones. The newest ``keep`` checkpoints are kept. Saving a step again (the final checkpoint
after a periodic one of the same step) moves the old folder aside (``.old-step-...``) before the
rename and deletes it after, so a kill in between leaves one to restore. ``resumable_checkpoint``
checks files before a resume (truncated or missing: that checkpoint is set aside, the next older
one is used). A full disk is reported as such (``DiskFullError``), the partial write removed.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import random
import re
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np

import torch
from safetensors.torch import load_file, load_model

from cramlm.io import save_safetensors


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_weights(model: torch.nn.Module, path: str | Path, strict: bool = True) -> None:
    missing, unexpected = load_model(model, str(path), strict=strict)
    if strict and (missing or unexpected):
        raise ValueError(f"{path}: missing {missing}, unexpected {unexpected}")


# ------------------------------------------------------------------ tied weights in state dicts


def save_state_dict(state: dict[str, torch.Tensor], path: Path, aliases: dict[str, str]) -> None:
    """A full state dict to safetensors with each tied tensor once (loads with ``load_weights``)."""
    tensors = {k: v.contiguous() for k, v in state.items() if k not in aliases}
    save_safetensors(tensors, path, metadata={"format": "pt"})


def load_state_dict(path: Path, aliases: dict[str, str]) -> dict[str, torch.Tensor]:
    state = load_file(str(path))
    for alias, canonical in aliases.items():
        state[alias] = state[canonical]
    return state


# ------------------------------------------------------------------ RNG and train state


def rng_state() -> tuple[dict, dict]:
    """Every generator a training step draws from: (tensors for training.pt, JSON for state.json)."""
    tensors = {
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    np_state = np.random.get_state(legacy=False)
    np_state["state"]["key"] = np_state["state"]["key"].tolist()
    return tensors, {"python_rng": random.getstate(), "numpy_rng": np_state}


def set_rng_state(training: dict, state: dict) -> None:
    torch.set_rng_state(training["torch_rng"])
    if training.get("cuda_rng") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(training["cuda_rng"])
    np_state = dict(state["numpy_rng"])
    np_state["state"] = dict(np_state["state"], key=np.asarray(np_state["state"]["key"], dtype=np.uint32))
    np.random.set_state(np_state)
    version, internal, gauss = state["python_rng"]
    random.setstate((version, tuple(internal), gauss))


def train_state(optimizer: dict, scaler: dict, data: dict, counters: dict) -> tuple[dict, dict]:
    """(training.pt, state.json) of a checkpoint: the optimizer, scaler and data position (once:
    shuffled stream and collator generator) with torch RNG; the trainer's counters with Python
    and NumPy RNG."""
    tensors, json_rng = rng_state()
    return {"optimizer": optimizer, "scaler": scaler, "data": data, **tensors}, {**counters, **json_rng}


# ------------------------------------------------------------------ checkpoint folders

STEP_DIR = re.compile(r"step-(\d+)")
ASIDE_PREFIX = ".old-"  # a checkpoint moved aside while the same step is written again


class DiskFullError(ValueError):  # a ValueError: the command line reports it as one Error: line
    def __init__(self, folder: Path, needed: int, free: int, latest: Path | None):
        self.folder, self.needed, self.free, self.latest = folder, needed, free, latest
        keep = f"the newest checkpoint is still {latest.name}" if latest else "no earlier checkpoint exists"
        super().__init__(
            f"disk full while writing checkpoint {folder}: it needs about {_mb(needed)}, "
            f"{_mb(free)} free on that disk; removed the partial write, {keep}"
        )


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MB"


def checkpoint_dirs(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.fullmatch(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(root: Path) -> Path | None:
    dirs = checkpoint_dirs(root)
    return dirs[-1] if dirs else None


def _nbytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0


def _is_disk_full(e: BaseException | None) -> bool:
    """ENOSPC / EDQUOT, also as torch's and safetensors' own errors, which wrap the OS error in text."""
    while e is not None:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(e)
        if "No space left" in text or "StorageFull" in text or "Disk quota exceeded" in text:
            return True
        e = e.__cause__ or e.__context__
    return False


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
    try:
        tmp.mkdir()
        save_state_dict(model_state, tmp / "model.safetensors", aliases)
        torch.save(training, tmp / "training.pt")
        (tmp / "state.json").write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
        for f in tmp.iterdir():
            _fsync(f)
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        needed, free = _nbytes(model_state) + _nbytes(training), shutil.disk_usage(root).free
        # torch.save's zip writer says only "file write failed" or "unexpected pos ...": whatever
        # the message, a write that needed more than the free space failed for want of it
        if _is_disk_full(e) or free < needed:
            raise DiskFullError(final, needed, free, latest_checkpoint(root)) from None
        raise
    aside = None
    if final.exists():  # the same step saved again (e.g. the final checkpoint after a periodic one)
        aside = root / f"{ASIDE_PREFIX}{final.name}-{os.getpid()}"
        os.replace(final, aside)  # a kill from here until it is deleted leaves it to restore
    os.replace(tmp, final)
    _fsync(root)
    if aside is not None:
        shutil.rmtree(aside)
    for old in checkpoint_dirs(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _restore_asides(root: Path) -> None:
    """Undo a rewrite of a step that was interrupted: its old folder comes back, unless the new one
    is already in place (then the old one is deleted)."""
    for aside in root.glob(f"{ASIDE_PREFIX}step-*") if root.is_dir() else []:
        final = root / aside.name[len(ASIDE_PREFIX):].rsplit("-", 1)[0]
        if STEP_DIR.fullmatch(final.name) is None:
            continue
        if final.exists():
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(aside, final)


def remove_partial_checkpoints(root: Path) -> list[Path]:
    """Delete leftovers of checkpoint writes that were interrupted (by a kill or a crash)."""
    _restore_asides(root)
    partial = [p for p in root.glob(".tmp-step-*")] if root.is_dir() else []
    for p in partial:
        shutil.rmtree(p, ignore_errors=True)
    return partial


def _safetensors_problem(path: Path) -> str | None:
    """A safetensors file is an 8-byte header length, a JSON header, then the data its offsets cover."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            return f"{path.name}: truncated ({size} bytes)"
        (n,) = struct.unpack("<Q", raw)
        if n > size - 8:
            return f"{path.name}: truncated (header of {n} bytes in a file of {size})"
        try:
            header = json.loads(f.read(n))
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError):
            return f"{path.name}: unreadable header"
    if 8 + n + end != size:
        return f"{path.name}: {'truncated' if 8 + n + end > size else 'trailing bytes'} ({size} bytes, {8 + n + end} expected)"
    return None


def checkpoint_problem(folder: Path) -> str | None:
    """What is wrong with a checkpoint folder (a missing, truncated or unreadable file), or None.
    Reads training.pt once to check its CRCs; loads nothing."""
    for name in ("model.safetensors", "training.pt", "state.json"):
        if not (folder / name).is_file():
            return f"{name} is missing"
    try:
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
        if not isinstance(state, dict) or "usage" not in state:
            return "state.json has no usage counters"
    except (ValueError, UnicodeDecodeError):
        return "state.json is not valid JSON"
    problem = _safetensors_problem(folder / "model.safetensors")
    if problem:
        return problem
    try:
        with zipfile.ZipFile(folder / "training.pt") as z:
            bad = z.testzip()
        if bad is not None:
            return f"training.pt: {bad} fails its CRC check"
    except (zipfile.BadZipFile, OSError, EOFError):
        return "training.pt: not a complete archive (truncated?)"
    try:  # the weights-only unpickler runs no code; mmap leaves the tensors on disk, so this is cheap
        torch.load(folder / "training.pt", map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:  # objects beyond tensors and plain data: cramlm did not write it
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        what = next((line for line in lines if "nsupported" in line), lines[0] if lines else "UnpicklingError")
        return f"training.pt: refused by the weights-only loader, it holds more than tensors and plain data ({what[:160]})"
    except Exception as e:
        return f"training.pt: unreadable ({type(e).__name__}: {str(e)[:160]})"
    return None


def resumable_checkpoint(root: Path, warn=print) -> Path | None:
    """The newest checkpoint under ``root`` whose files verify. Damaged newer ones are renamed
    ``<name>.damaged`` (kept for inspection, no longer seen as checkpoints) with a warning each."""
    _restore_asides(root)
    for folder in reversed(checkpoint_dirs(root)):
        problem = checkpoint_problem(folder)
        if problem is None:
            return folder
        damaged = folder.with_name(f"{folder.name}.damaged")
        n = 1
        while damaged.exists():
            n += 1
            damaged = folder.with_name(f"{folder.name}.damaged{n}")
        os.replace(folder, damaged)
        warn(f"cramlm: warning: checkpoint {folder.name} is damaged ({problem}); renamed it {damaged.name} "
             "and trying the next older one")
    return None


def read_checkpoint(folder: Path, aliases: dict[str, str]) -> tuple[dict, dict, dict]:
    """(model state, training state, counters) of a checkpoint folder."""
    try:
        model_state = load_state_dict(folder / "model.safetensors", aliases)
        training = torch.load(folder / "training.pt", map_location="cpu", weights_only=True)
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, pickle.UnpicklingError):
        raise  # the caller names the file (a refused pickle is a security finding, not damage)
    except Exception as e:  # safetensors, torch.load (unpickling refused, truncated zip), JSON
        raise ValueError(f"{folder}: cannot read this checkpoint ({type(e).__name__}: {str(e)[:200]})") from None
    return model_state, training, state
