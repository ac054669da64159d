"""Training checkpoints, written atomically (temp folder + rename; single files: :mod:`cramlm.io`), so a
crash, even a SIGKILL in the middle of a write, never leaves a broken file under a final name.

A checkpoint is a folder ``<run>/checkpoints/step-00000042/`` with

- ``model.safetensors``: the full (unsharded) weights, tied tensors stored once;
- ``training.pt``: optimizer and grad-scaler state (keyed by parameter name, so it loads into any
  number of processes and any sharding), the data position (the shuffled stream's global position
  and the data format, batches.py), torch/CUDA RNG;
- ``state.json``: the trainer's counters (``TrainState``: step, tokens, seconds, events, ...),
  Python/NumPy RNG, and what the run was (``run``: its resolved config and its data's identity);
- ``digests.json``: the blake2b digest of each of the three files (``checkpoint_problem`` checks them).

It is written as ``.tmp-step-...`` and renamed when complete; ``latest_checkpoint`` only ever sees
complete ones. The newest ``keep`` checkpoints are kept. Saving a step again (the final checkpoint
after a periodic one of the same step) moves the old folder aside (``.old-step-...``) before the
rename and deletes it after, so a kill in between leaves one to restore. ``resumable_checkpoint``
checks files before a resume (truncated or missing: that checkpoint is set aside, the next older
one is used; so is one whose digest does not match). A checkpoint of an older cramlm (version 1:
no digests, no record of its run) is not damage: it is refused, with what to do. A full disk is
reported as such (``DiskFullError``), the partial write removed.

Resume vetting (``find_resume``, ``check_resumable``, ``check_same_run``, ``resume_trainer``): which
checkpoint a run continues from, and whether this run can continue it (docs/training.md).
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
from typing import Any

import numpy as np

import torch
from safetensors.torch import load_file, load_model

from cramlm.config.base import resume_policy
from cramlm.io import (
    DIGESTS,
    digest_record,
    CheckpointFileError,
    atomic_dir,
    digest_problem,
    is_disk_full,
    load_error_reason,
    safetensors_shapes,
    save_safetensors,
    write_digests,
)
from cramlm.train import sharded
from cramlm.train.optim import resolve_optimizer

CHECKPOINT_VERSION = 2  # 2: digests.json and the run's record; one without digests.json is damaged (1: refused)
FILES = ("model.safetensors", "training.pt", "state.json")


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
    """Every generator a training step draws from: (tensors for training.pt, JSON for state.json).
    On CUDA the generator of this process's own device only (``cuda_rng_device``): every process seeds
    its device alike and draws alike, so rank 0's, restored on each process's device, is each one's;
    the other devices' generators, which this process never advanced, are not saved. A process that
    never used CUDA (a CPU run on a GPU machine) leaves it alone: no CUDA context is made for it."""
    tensors = {"torch_rng": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["cuda_rng_device"] = torch.cuda.get_rng_state()  # the current device's (impl: set per process)
    np_state = np.random.get_state(legacy=False)
    np_state["state"]["key"] = np_state["state"]["key"].tolist()
    return tensors, {"python_rng": random.getstate(), "numpy_rng": np_state}


def set_rng_state(training: dict, state: dict) -> None:
    torch.set_rng_state(training["torch_rng"])
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # (a CPU run on a GPU machine: no CUDA context)
        # older checkpoints hold every visible device's ("cuda_rng"), of which rank 0 advanced its first
        own = training.get("cuda_rng_device", (training.get("cuda_rng") or [None])[0])
        if own is not None:
            torch.cuda.set_rng_state(own)
    np_state = dict(state["numpy_rng"])
    np_state["state"] = dict(np_state["state"], key=np.asarray(np_state["state"]["key"], dtype=np.uint32))
    np.random.set_state(np_state)
    version, internal, gauss = state["python_rng"]
    random.setstate((version, tuple(internal), gauss))


def train_state(optimizer: dict, scaler: dict, data: dict, counters: dict) -> tuple[dict, dict]:
    """(training.pt, state.json) of a checkpoint: the optimizer, scaler and data position (once:
    ``StepData.state_dict``) with torch RNG; the trainer's counters with Python and NumPy RNG."""
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


def write_checkpoint(
    root: Path,
    step: int,
    model_state: dict[str, torch.Tensor],
    aliases: dict[str, str],
    training: dict,
    state: dict,
    keep: int,
) -> Path:
    """Write one checkpoint folder atomically (io.atomic_dir: a hidden temporary folder, fsynced,
    renamed into place; the same step saved again goes aside first, so a kill at any moment leaves
    a complete folder under one of the two names), then drop all but the newest ``keep``."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp, aside = root / f".tmp-step-{step:08d}-{os.getpid()}", root / f"{ASIDE_PREFIX}{final.name}-{os.getpid()}"
    try:
        with atomic_dir(final, tmp=tmp, aside=aside, durable=True) as folder:
            save_state_dict(model_state, folder / "model.safetensors", aliases)
            torch.save(training, folder / "training.pt")
            state = {**state, "checkpoint_version": CHECKPOINT_VERSION}
            (folder / "state.json").write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
            write_digests(folder, FILES)
    except Exception as e:
        needed, free = _nbytes(model_state) + _nbytes(training), shutil.disk_usage(root).free
        # torch.save's zip writer says only "file write failed" or "unexpected pos ...": whatever
        # the message, a write that needed more than the free space failed for want of it
        if is_disk_full(e) or free < needed:
            raise DiskFullError(final, needed, free, latest_checkpoint(root)) from None
        raise
    drop_old_checkpoints(root, keep)
    return final


def kept_at(folder: Path) -> float | None:
    """The fraction of the budget (train.checkpoint_at) a checkpoint is kept for, or None."""
    try:
        state = _state_json(folder)
    except OSError:
        return None
    return state.get("kept_at") if isinstance(state, dict) else None


def drop_old_checkpoints(root: Path, keep: int) -> None:
    """All but the newest ``keep`` checkpoints deleted (0: none), besides which those kept at a fraction
    of the budget (``kept_at``) stay."""
    rotating = [folder for folder in checkpoint_dirs(root) if kept_at(folder) is None] if keep > 0 else []
    for old in rotating[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


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
    """What is wrong with a checkpoint folder (a missing, truncated, unreadable or changed file),
    or None. Reads each file (training.pt's CRCs, every file's digest, a weights-only load that runs no code).
    Raises CheckpointFileError for a checkpoint of an older cramlm (``check_version``)."""
    if sharded.is_sharded(folder):
        return sharded_checkpoint_problem(folder)
    for name in FILES:
        if not (folder / name).is_file():
            return f"{name} is missing"
    state = _state_json(folder)
    if isinstance(state, str):
        return state
    check_version(folder, state)
    problem = _safetensors_problem(folder / "model.safetensors")
    if problem:
        return problem
    if problem := _archive_problem(folder / "training.pt"):
        return problem
    if problem := _digests_problem(folder, state):
        return problem
    return _unpickle_problem(folder / "training.pt")


def _state_json(folder: Path) -> dict | str:
    """A checkpoint's state.json, or what is wrong with it."""
    try:
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
        if not isinstance(state, dict) or "usage" not in state:
            return "state.json has no usage counters"
    except (ValueError, UnicodeDecodeError):
        return "state.json is not valid JSON"
    return state


def _archive_problem(path: Path) -> str | None:
    """A torch.save file whose zip archive is incomplete or fails a CRC check."""
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
        if bad is not None:
            return f"{path.name}: {bad} fails its CRC check"
    except (zipfile.BadZipFile, OSError, EOFError):
        return f"{path.name}: not a complete archive (truncated?)"
    return None


def _unpickle_problem(path: Path) -> str | None:
    """A torch.save file the weights-only unpickler refuses or cannot read."""
    try:  # the weights-only unpickler runs no code; mmap leaves the tensors on disk, so this is cheap
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:  # objects beyond tensors and plain data: cramlm did not write it
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        what = next((line for line in lines if "nsupported" in line), lines[0] if lines else "UnpicklingError")
        return f"{path.name}: refused by the weights-only loader, it holds more than tensors and plain data ({what[:160]})"
    except Exception as e:
        return f"{path.name}: unreadable ({type(e).__name__}: {str(e)[:160]})"
    return None


def check_version(folder: Path, state: dict) -> None:
    """Refuse a checkpoint an older cramlm wrote (version 1: no ``checkpoint_version`` in its
    state.json, no digests.json): not damage, so it is not set aside, but nothing this cramlm resumes."""
    if "checkpoint_version" not in state and not (folder / DIGESTS).is_file():
        raise CheckpointFileError(
            f"resume from {folder}: it is a checkpoint of version 1 (written by cramlm before checkpoints carried "
            f"digests and their run's record); this cramlm does not resume it: start the run fresh (or resume with "
            "the cramlm that wrote it)")


def _digests_problem(folder: Path, state: dict) -> str | None:
    if not (folder / DIGESTS).is_file():
        return f"{DIGESTS} is missing"
    return next((p for name in FILES if (p := digest_problem(folder / name))), None)


def resumable_checkpoint(root: Path, warn=print) -> Path | None:
    """The newest checkpoint under ``root`` whose files verify. Damaged newer ones are renamed
    ``<name>.damaged`` (kept for inspection, no longer seen as checkpoints) with a warning each."""
    _restore_asides(root)
    for folder in reversed(checkpoint_dirs(root)):
        problem = checkpoint_problem(folder)
        if problem is None:
            return folder
        damaged = _aside_name(folder, "damaged")
        os.replace(folder, damaged)
        warn(f"cramlm: warning: checkpoint {folder.name} is damaged ({problem}); renamed it {damaged.name} "
             "and trying the next older one")
    return None


def _aside_name(folder: Path, why: str) -> Path:
    """``<name>.<why>``, or ``<name>.<why>N`` where that is taken: a name no longer seen as a checkpoint."""
    aside, n = folder.with_name(f"{folder.name}.{why}"), 1
    while aside.exists():
        n += 1
        aside = folder.with_name(f"{folder.name}.{why}{n}")
    return aside


def supersede_later_checkpoints(root: Path, step: int) -> list[tuple[Path, Path]]:
    """A run resumed from step ``step`` while its folder holds later checkpoints (a rewind: the user
    chose an older checkpoint): those are renamed ``<name>.superseded`` (kept, no longer seen as
    checkpoints), so that pruning, ``--resume auto`` and a rollback see only the line that goes on.
    Returns (old, new) names."""
    moved = []
    for folder in checkpoint_dirs(root):
        if int(STEP_DIR.fullmatch(folder.name).group(1)) > step:
            aside = _aside_name(folder, "superseded")
            os.replace(folder, aside)
            moved.append((folder, aside))
    return moved


def read_checkpoint(folder: Path, aliases: dict[str, str], weights: bool = True) -> tuple[dict, dict, dict]:
    """(model state, training state, counters) of a checkpoint folder. ``weights=False``: no model
    state ({}), and training.pt memory-mapped, so that tensors not used (the optimizer's, which
    rank 0 broadcasts under FSDP2) are never read into this process's memory."""
    try:
        model_state = load_state_dict(folder / "model.safetensors", aliases) if weights else {}
        training = torch.load(folder / "training.pt", map_location="cpu", weights_only=True, mmap=not weights)
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, pickle.UnpicklingError):
        raise  # the caller names the file (a refused pickle is a security finding, not damage)
    except Exception as e:  # safetensors, torch.load (unpickling refused, truncated zip), JSON
        raise ValueError(f"{folder}: cannot read this checkpoint ({type(e).__name__}: {str(e)[:200]})") from None
    return model_state, training, state


# ------------------------------------------------------------------ sharded checkpoints (train/sharded.py)


def write_sharded_checkpoint(root: Path, step: int, model_state: dict, optim_state: dict, training: dict,
                             state: dict, keep: int, d) -> Path:
    """Every process (``d``: its Dist): its shards of ``model_state`` and ``optim_state`` (sharded
    state dicts) into the checkpoint folder with DCP, each process digesting its own files; rank 0
    adds training.pt (with the optimizer's non-tensor state), state.json and digests.json, atomically
    as ``write_checkpoint`` (temporary folder, rename, keep-k). Every process raises what failed
    (a full disk: ``DiskFullError``)."""
    from cramlm.train.distributed import broadcast_object

    final = root / f"step-{step:08d}"
    tmp, aside = (root / name for name in broadcast_object(
        (f".tmp-step-{step:08d}-{os.getpid()}", f"{ASIDE_PREFIX}{final.name}-{os.getpid()}") if d.main else None, d))
    tensors, rest = sharded.split_tensors(optim_state)
    if not d.main:
        if broadcast_object(None, d) == "ready":  # rank 0 made the temporary folder
            _write_shards(tmp, model_state, tensors)
        outcome = broadcast_object(None, d)
    else:
        outcome, ready = None, False
        root.mkdir(parents=True, exist_ok=True)
        try:
            with atomic_dir(final, tmp=tmp, aside=aside, durable=True) as folder:
                ready = broadcast_object("ready", d)
                digests, failed = _write_shards(folder, model_state, tensors)
                if failed is not None:
                    raise failed
                torch.save({**training, "optimizer": rest}, folder / "training.pt")
                state = {**state, "checkpoint_version": CHECKPOINT_VERSION, "checkpoint_format": "sharded"}
                (folder / "state.json").write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
                write_digests(folder, ["training.pt", "state.json", sharded.METADATA], known=digests)
        except Exception as e:
            if not ready:
                broadcast_object("failed", d)
            needed = _nbytes(model_state) + _nbytes(tensors) + _nbytes(training)  # (a DTensor's numel is global)
            free = shutil.disk_usage(root).free
            outcome = (needed, free, latest_checkpoint(root)) if is_disk_full(e) else f"{type(e).__name__}: {e}"
            broadcast_object(outcome, d)
            if isinstance(outcome, tuple):
                raise DiskFullError(final, *outcome) from None
            raise
        broadcast_object(None, d)
    if isinstance(outcome, tuple):
        raise DiskFullError(final, *outcome)
    if outcome is not None:
        raise RuntimeError(f"writing checkpoint {final} failed on rank 0: {outcome[:500]}")
    if d.main:
        drop_old_checkpoints(root, keep)
    return final


def _write_shards(folder: Path, model_state: dict, tensors: dict) -> tuple[dict, Exception | None]:
    """Every process: its shards and their digests ({file: digest}, every process's on rank 0), or
    the error (DCP raises on every process when one fails)."""
    try:
        sharded.save_shards(folder, model_state, tensors)
    except Exception as e:
        return {}, e
    return sharded.own_shard_digests(folder), None


def check_finite_shards(folder: Path) -> None:
    """``check_finite`` of a sharded checkpoint's weights, assembled a tensor at a time."""
    for name, tensor in sharded.iter_weights(folder):
        if tensor.is_floating_point() and not (finite := torch.isfinite(tensor)).all():
            raise CheckpointFileError(
                f"{folder}: weight {name} holds {int((~finite).sum()):,} non-finite values (NaN or inf) of "
                f"{tensor.numel():,}; weights that are not numbers are not evaluated, exported or trained on: use an "
                "earlier checkpoint")


def assemble_weights(folder: Path, into: Path) -> Path:
    """A sharded checkpoint's full weights as ``into``/model.safetensors (what a full checkpoint holds:
    every weight of the training model, tied ones once), after its files verified and its weights
    proved finite; assembled a tensor at a time, the optimizer's shards never read. The file's path."""
    if problem := sharded_checkpoint_problem(folder):
        raise CheckpointFileError(f"{folder}: {problem}; use another checkpoint, or the run's own model.safetensors")
    check_finite_shards(folder)
    sharded.stream_weights(folder, into / "model.safetensors")
    return into / "model.safetensors"


def sharded_checkpoint_problem(folder: Path) -> str | None:
    """``checkpoint_problem`` of a sharded checkpoint: state.json, training.pt, DCP's index and every
    process's shards present, each recorded in digests.json and matching its digest; only then
    is the index (a pickle) read, by an unpickler that admits DCP's records alone."""
    for name in ("state.json", "training.pt", DIGESTS, sharded.METADATA):
        if not (folder / name).is_file():
            return f"{name} is missing"
    state = _state_json(folder)
    if isinstance(state, str):
        return state
    if problem := _archive_problem(folder / "training.pt"):
        return problem
    recorded = digest_record(folder)
    if recorded is None:
        return f"{DIGESTS} is unreadable"
    present = {"training.pt", "state.json", *sharded.shard_files(folder)}
    if unrecorded := sorted(present - set(recorded)):
        return f"{DIGESTS} records no digest of {', '.join(unrecorded[:3])} (added or changed since it was written)"
    if absent := sorted(set(recorded) - present):
        return f"{', '.join(absent[:3])} is missing"
    if problem := next((p for name in sorted(recorded) if (p := digest_problem(folder / name))), None):
        return problem
    return _unpickle_problem(folder / "training.pt") or sharded.index_problem(folder, set(recorded))


# ------------------------------------------------------------------ resume: which checkpoint, and whether it fits


def verified_weights(path: Path) -> Path:
    """``path`` (a model.safetensors) after checking it against its folder's digests.json, if any,
    and that every tensor in it is finite."""
    if problem := digest_problem(path):
        raise CheckpointFileError(f"{path}: {problem}; use another checkpoint, or the run's own model.safetensors")
    check_finite(path)
    return path


def check_finite(path: Path) -> None:
    """Refuse weights holding NaN or inf: one line naming the file and the first such tensor
    (a tensor at a time: the file is never all in memory)."""
    from safetensors import safe_open

    bad: list[tuple[str, int, int]] = []
    with safe_open(str(path), "pt") as f:
        for key in f.keys():
            tensor = f.get_tensor(key)
            if tensor.is_floating_point() and not (finite := torch.isfinite(tensor)).all():
                bad.append((key, int((~finite).sum()), tensor.numel()))
    if bad:
        key, n, total = bad[0]
        more = f" (and {len(bad) - 1} more tensors)" if len(bad) > 1 else ""
        raise CheckpointFileError(
            f"{path}: tensor {key} holds {n:,} non-finite values (NaN or inf) of {total:,}{more}; weights that are "
            "not numbers are not evaluated, exported or trained on: use an earlier checkpoint")


def find_resume(resume: str | None, root: Path) -> Path | None:
    """The checkpoint ``resume`` names: ``auto``, the newest under ``root`` that verifies (damaged
    newer ones: set aside, warned); a folder, that one, which must verify; None: none."""
    if resume is None:
        return None
    if resume == "auto":
        found = resumable_checkpoint(root)
        damaged = sorted(p.name for p in root.glob("step-*.damaged*")) if found is None and root.is_dir() else []
        if damaged:  # a requeued job must not report success after discarding all progress
            raise CheckpointFileError(
                f"resume=auto: every checkpoint in {root} is damaged ({', '.join(damaged)}), nothing to continue from; "
                "nothing was started. Repair one and resume from it (resume=<folder>), or start the run afresh with "
                "overwrite=true")
        return found
    folder = Path(resume)
    if not (folder / "state.json").is_file():
        raise FileNotFoundError(f"resume={resume}: not a checkpoint folder (no state.json)")
    if problem := checkpoint_problem(folder):
        raise ValueError(f"resume={resume}: damaged checkpoint ({problem})")
    return folder


def clear_checkpoints(root: Path) -> list[Path]:
    """Remove the checkpoints an earlier run of this name left: only cramlm's own ``step-<n>``
    folders, never the folder itself or anything else in it."""
    found = checkpoint_dirs(root)
    for folder in found:
        shutil.rmtree(folder)
    return found


def written_state(folder: Path) -> dict:
    """A checkpoint's state.json (vetted by ``checkpoint_problem``; {} if it cannot be read)."""
    try:
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def check_resumable(folder: Path, model: torch.nn.Module, vocab_size: int) -> None:
    """Refuse, before any work, a checkpoint this run cannot continue from: unreadable files, or
    weights of another shape (a different vocabulary or arch), saying which file and what differs."""
    from cramlm.models.base import tied_aliases

    is_sharded = sharded.is_sharded(folder)
    shapes = sharded.weight_shapes(folder) if is_sharded else safetensors_shapes(folder / "model.safetensors")
    aliases = tied_aliases(model)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if k not in aliases}
    problems = [f"{k} is {list(shapes[k])} there, {list(v)} here" for k, v in expected.items() if k in shapes and shapes[k] != v]
    problems += [f"{k} missing there" for k in expected if k not in shapes]
    problems += [f"{k} not in this model" for k in shapes if k not in expected]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise CheckpointFileError(
            f"resume from {folder}: its {'sharded weights do' if is_sharded else 'model.safetensors does'} not fit this "
            f"run's model: {'; '.join(problems[:3])}{more}. "
            f"This run's vocabulary has {vocab_size} tokens; the data (tokenizer) or arch config differs from the run "
            "that wrote the checkpoint: resume with the same config, or start a fresh run"
        )
    training = folder / "training.pt"
    try:
        zipfile.ZipFile(training).close()  # its central directory: a truncated file fails here, cheaply
    except (OSError, zipfile.BadZipFile) as e:
        raise CheckpointFileError(f"{training}: not a readable torch checkpoint, truncated or damaged ({e})") from None


def written_run(folder: Path) -> dict:
    """What a checkpoint's run recorded (``run`` in state.json): its resolved ``config`` and its
    data's identity (``data``: the tokenizer's fingerprint, each packed file's checksum)."""
    run = written_state(folder).get("run")
    if not (isinstance(run, dict) and isinstance(run.get("config"), dict) and isinstance(run.get("data"), dict)):
        raise CheckpointFileError(
            f"resume from {folder}: its state.json holds no record of its run (run.config, run.data), which every "
            "checkpoint of `cramlm pretrain` holds; this cramlm does not resume it: start the run fresh")
    return run


def check_same_data(folder: Path, then: dict[str, str], data_now: dict[str, str], config_then: dict | None = None,
                    config_now: dict | None = None) -> None:
    """Refuse a checkpoint written on other data: its run recorded the tokenizer's fingerprint and
    each packed file's checksum (``then``: ``run.data`` in state.json); a re-prepared cache must match.
    The line names the ``data.*`` keys of the config that changed (``config_then``/``config_now``), if any."""
    differ = [f"{k}: {then.get(k)} there, {data_now.get(k)} here" for k in sorted({*then, *data_now}) if then.get(k) != data_now.get(k)]
    if differ:
        before, after = flat((config_then or {}).get("data") or {}, "data."), flat((config_now or {}).get("data") or {}, "data.")
        changed = [f"{k} {_show(before[k])} -> {_show(after[k])}" for k in sorted(before.keys() & after.keys())
                   if before[k] != after[k] and k != "data.name"]
        why = (f"This run's data config differs from the run's own ({'; '.join(changed)}); resume with the run's data "
               "config, or start a fresh run" if changed else
               "The data cache was prepared again (another tokenizer or other packed bytes); point impl.data_cache at "
               "the run's own prepared data, or start a fresh run")
        raise CheckpointFileError(
            f"resume from {folder}: this run's data is not the data the checkpoint was trained on ({'; '.join(differ)}). {why}"
        )


def check_data_state(folder: Path) -> None:
    """Refuse a checkpoint whose data state (in training.pt) this cramlm cannot continue
    (train/batches.py ``data_state_problem``: data format 1, or a newer format)."""
    from cramlm.train.batches import data_state_problem

    training = torch.load(folder / "training.pt", map_location="cpu", weights_only=True, mmap=True)
    data = training.get("data") if isinstance(training, dict) else None
    if isinstance(data, dict) and (problem := data_state_problem(data)):  # (no data state at all: the load names it)
        raise CheckpointFileError(f"resume from {folder}: {problem}")


def resume_trainer(trainer, folder: Path, changes: dict | None = None, say=print, budgets: tuple[str, ...] = ()) -> None:
    """``trainer.resume`` with its failures as one clear line naming the checkpoint; accepted
    config ``changes`` become a ``config_changed`` event (metrics.jsonl) at the step they take effect,
    unless they only extend ``budgets`` (``budget_keys``)."""
    from cramlm.train.batches import DataFormatError

    try:
        trainer.resume(folder)
    except DataFormatError as e:
        raise CheckpointFileError(f"resume from {folder}: {e}") from None
    except pickle.UnpicklingError as e:  # training.pt is the checkpoint's only pickle
        raise CheckpointFileError(f"{folder / 'training.pt'}: {load_error_reason(e)}") from None
    except (RuntimeError, KeyError, ValueError) as e:
        raise CheckpointFileError(
            f"resume from {folder}: cannot load it into this run ({load_error_reason(e)}); "
            "was train.optim or the arch changed since it was written?"
        ) from None
    say(f"cramlm: resumed from {folder} (step {trainer.used.steps})")
    # the same run goes on at the cost its steps were booked at; an allowed change of its maths re-books them
    if not any(k not in budgets for k in changes) and (booked := trainer.meter.keep_booked_costs()):
        say(f"cramlm: FLOPs per token {booked[1]:,.0f}, as the run booked its steps (this cramlm counts "
            f"{booked[0]:,.0f}): the budget, t and the lr go on as they began")
    if any(k not in budgets for k in changes):  # (a longer budget alone is no event: runs are extended often)
        step, listed = trainer.used.steps, ", ".join(f"{k} {_show(a)} -> {_show(b)}" for k, (a, b) in changes.items())
        trainer.notes.append({"kind": "event", "event": "config_changed", "step": step, "changes": changes,
                              "message": f"config changed from step {step}: {listed}"})
        say(f"cramlm: config changed from step {step}: {listed}")


def adopt_checkpoint_threads(impl, folder: Path, world: int, say) -> None:
    """impl.threads=auto: resume with the thread count the checkpoint was written with (bitwise
    resume; train/hardware.py ``resume_threads``)."""
    from cramlm.train.hardware import auto_threads, resume_threads

    threads = resume_threads(impl.threads, written_state(folder), torch.get_num_threads(), world, auto_threads(free=None))
    if threads:
        say(f"cramlm: impl.threads=auto: {torch.get_num_threads()} -> {threads} threads, as {folder.name} was written "
            "(a resumed run stays bitwise on course)")
        torch.set_num_threads(threads)


# ------------------------------------------------------------------ resume: is it the same run?

# What a resume may change without allow_change is a property of each config field
# (config/base.py RESUME_FREE / RESUME_GROW; ``resume_policy`` of the root config): where the run lives
# and how it is watched, stored or run on this machine (impl.* never changes the maths: the precision
# it resolves to is compared instead), and budgets, which may extend the run.


def _keys(policy: dict[str, str], kind: str) -> tuple[str, ...]:
    return tuple(k for k, v in policy.items() if v == kind)


def budget_keys(cfg) -> tuple[str, ...]:
    """The keys of ``cfg``'s config class that a resume may only grow (its budgets)."""
    return _keys(resume_policy(type(cfg)), "grow")


# changes no checkpoint can serve, allowed or not: its optimizer state is of its optimizer, its weights
# and batches of its objective
UNSERVABLE = {"train.optim.type": "a checkpoint's optimizer state loads only into the optimizer that wrote it",
              "train.objective": "a checkpoint holds the model of the objective it was trained with",
              "arch.type": "a checkpoint holds the weights of its own architecture"}


def flat(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{'train': {'optim': {'lr': 1}}} -> {'train.optim.lr': 1} (lists stay whole)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _under(key: str, prefixes) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def _extends(key: str, old: Any, new: Any) -> bool:
    """A budget key that lets the run go on at least as long (null: no limit of that kind)."""
    return new is None or (isinstance(old, (int, float)) and isinstance(new, (int, float)) and new >= old)


def resume_changes(old: dict, new: dict, allow: list[str], where: str, policy: dict[str, str]) -> dict[str, list]:
    """The changes of a resumed run's config (``new``, resolved) against the config its checkpoint
    was written with (``old``): {key: [old, new]} for each budget extension and each key in
    ``allow``; any other change of the maths is refused, listing each key old -> new. ``policy``:
    the root config's ``resume_policy`` (which keys are free, which may only grow)."""
    free, grow = _keys(policy, "free"), _keys(policy, "grow")
    before, after = flat(old), flat(new)
    unknown = [a for a in allow if not any(_under(k, [a]) for k in {*before, *after})]
    if unknown:
        raise ValueError(f"allow_change: {', '.join(unknown)}: no such config key")
    # keys only one side has (a field of another cramlm version, another component's fields) are
    # not compared: a component change shows as its `type`
    changed = {k: [before[k], after[k]] for k in sorted(before.keys() & after.keys())
               if before[k] != after[k] and not _under(k, free)}
    refused = {k: v for k, v in changed.items()
               if not _under(k, allow) and not (k in grow and _extends(k, *v))}
    if refused:
        listed = "; ".join(f"{k} {_show(a)} -> {_show(b)}" for k, (a, b) in refused.items())
        raise ValueError(
            f"resume from {where}: the config differs from the run's own where it changes the maths "
            f"({len(refused)} key{'s' if len(refused) > 1 else ''}): {listed}. A resumed run is the run it "
            f"continues: resume with the run's config, allow a deliberate change with --allow-change "
            f"{next(iter(refused))} (allow_change=[...]), or start a fresh run"
        )
    return changed


def check_servable(old: dict, new: dict, where: str) -> None:
    """Refuse a change no checkpoint can serve (``UNSERVABLE``), allowed or not, naming the key."""
    before, after = flat(old), flat(new)
    unservable = [f"{k} {_show(before[k])} -> {_show(after[k])} ({why})" for k, why in UNSERVABLE.items()
                  if k in before and k in after and before[k] != after[k]]
    if unservable:
        raise ValueError(f"resume from {where}: {'; '.join(unservable)}; no --allow-change makes it continue: resume "
                         "with the run's own setting, or start a fresh run (another name=, or overwrite=true)")


def _as_in(old: dict, new: dict, key: str) -> dict:
    """``old`` (a nested config) with the dotted ``key`` set to ``new``'s value where both have it:
    that key left out of a comparison (and still a key ``--allow-change`` may name)."""
    head, _, rest = key.partition(".")
    if head not in old or head not in new:
        return old
    if not rest:
        return {**old, head: new[head]}
    both = isinstance(old[head], dict) and isinstance(new[head], dict)
    return {**old, head: _as_in(old[head], new[head], rest)} if both else old


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def check_precision(folder: Path, precision, allow: list[str], changes: dict) -> dict:
    """The precision this run resolved to (impl.precision=auto: per machine) against the one the
    checkpoint was trained in: another one changes the maths (refused unless impl.precision is
    allowed; then it is one more change). ``changes`` with it."""
    then = written_state(folder).get("precision")
    if then is None or then == precision.precision:
        return changes
    if not _under("impl.precision", allow):
        raise ValueError(
            f"resume from {folder}: it was trained in {then}, this run resolves impl.precision to {precision.precision} "
            f"({precision.reason}); set impl.precision={then}, or allow the change with --allow-change impl.precision"
        )
    return {**changes, "impl.precision": [then, precision.precision]}


NS_DTYPE = "train.optim.ns_dtype"


def check_newton_schulz(folder: Path, optim, precision, allow: list[str], changes: dict) -> dict:
    """Muon's Newton-Schulz dtype, compared as each side resolved it (``auto`` follows the precision:
    the checkpoint's own, this run's ``precision``), so ``bfloat16 -> auto`` on a bf16 run is no
    change; a checkpoint written before ``train.optim.ns_dtype`` existed ran bfloat16. Another dtype
    changes the maths: refused unless allowed, or unless both sides are ``auto`` and ``impl.precision``
    is allowed (auto follows it); then it is one more change. ``changes`` with it."""
    then_cfg = written_run(folder)["config"].get("train", {}).get("optim", {})
    if getattr(optim, "ns_dtype", None) is None or then_cfg.get("type") != "muon":
        return changes
    then_named = then_cfg.get("ns_dtype", "bfloat16")
    then_precision = written_state(folder).get("precision") or precision.precision
    then = resolve_optimizer(optim.model_copy(update={"ns_dtype": then_named}), then_precision).ns_dtype
    now = resolve_optimizer(optim, precision.precision).ns_dtype
    if now == then:
        return changes
    follows = then_named == optim.ns_dtype == "auto" and _under("impl.precision", allow)  # auto follows an allowed precision change
    if not (_under(NS_DTYPE, allow) or follows):
        if "ns_dtype" not in then_cfg:
            raise ValueError(
                f"resume from {folder}: its Muon ran the Newton-Schulz iteration in bfloat16 (it predates "
                f"train.optim.ns_dtype), this run's in {now} (train.optim.ns_dtype={optim.ns_dtype}); set "
                "train.optim.ns_dtype=bfloat16, or allow the change with --allow-change train.optim.ns_dtype")
        raise ValueError(
            f"resume from {folder}: the config differs from the run's own where it changes the maths: "
            f"train.optim.ns_dtype {then} -> {now} (the run's {then_named}, this run's {optim.ns_dtype}, as each "
            f"resolves with its precision); resume with train.optim.ns_dtype={then}, or allow the change with "
            "--allow-change train.optim.ns_dtype")
    return {**changes, NS_DTYPE: [then, now]}


def plan_units(state: dict) -> tuple[int, int]:
    """The (microbatch size, processes) a checkpoint's batch plan counts in (train/budget.py
    ``BatchPlan``): recorded since it was, else those of the session that wrote it."""
    if isinstance(units := state.get("batch_plan"), list) and len(units) == 2:
        return int(units[0]), int(units[1])
    return int(state["run"]["config"]["impl"]["microbatch_size"]), int(state["world_size"])


def follows(units: tuple[int, int], here: tuple[int, int], full_batch: int) -> bool:
    """Whether microbatches of ``here`` (size, processes) make up every batch a plan in ``units`` takes
    of a full batch of ``full_batch`` sequences (itself a whole number of the plan's units: after an
    allowed change of the batch size it may not be, and the plan counts in this run's microbatches)."""
    step = units[0] * units[1]
    return step % (here[0] * here[1]) == 0 and full_batch % step == 0


def plan_can_move(train, hours: float | None, usage: dict) -> bool:
    """Whether the batch plan may still take other than the full batch from the checkpoint's usage on:
    the ramp not over (t < batch_ramp), or a minimum-updates cap under a budget that can bind it (tokens,
    FLOPs or hours; a steps budget alone never caps the batch)."""
    from cramlm.train.budget import Budget, Usage

    budget = Budget(train.budget, hours, 1.0)
    used = Usage(**{k: v for k, v in usage.items() if k in Usage.__dataclass_fields__})
    ramping = train.batch_ramp > 0 and budget.progress(used) < train.batch_ramp
    capped = train.min_updates > 0 and bool({"seconds", "tokens", "flops"} & budget.limits.keys())
    return ramping or capped


def check_batch_plan(folder: Path, train, hours: float | None, micro: int, world: int, allow: list[str], changes: dict) -> dict:
    """A resume with another microbatch size or process count takes the same batch at every step
    when its microbatches make up the plan's (``follows``), or when the plan can only take the full
    batch from here (``plan_can_move``). Otherwise the ramp and the cap would move to other batch
    sizes: refused unless ``impl.microbatch_size`` is allowed to change (then one more change, and the
    plan counts in this run's microbatches from here). ``changes`` with it."""
    state = written_state(folder)
    try:
        units = plan_units(state)
        movable = plan_can_move(train, hours, state.get("usage") or {})
    except (KeyError, TypeError, ValueError):
        return changes  # (a state this check cannot read: the resume's own checks name it)
    here = (micro, world)
    if units == here or follows(units, here, train.full_batch()) or not movable:
        return changes
    if train.full_batch() % (units[0] * units[1]):  # another batch size (allowed): the plan moves with it
        return changes
    then, now = f"{units[0]} x {units[1]} processes", f"{micro} x {world} processes"
    if not _under("impl.microbatch_size", allow):
        divisors = [m for m in range(1, units[0] * units[1] // world + 1) if (units[0] * units[1]) % (m * world) == 0
                    and train.full_batch() % (m * world) == 0]
        raise ValueError(
            f"resume from {folder}: its batch plan (train.batch_ramp={train.batch_ramp}, train.min_updates="
            f"{train.min_updates}) counts in microbatches of {then}; microbatches of {now} cannot make up its "
            "batches, so the run would take other batch sizes from here. Resume with impl.microbatch_size"
            + (f" one of {', '.join(map(str, divisors))} on {world} process{'es' if world > 1 else ''}" if divisors else
               f" dividing {units[0] * units[1]} sequences over the processes")
            + ", or allow the change with --allow-change impl.microbatch_size")
    return {**changes, "impl.microbatch_size": [then, now]}


def vet_resume(cfg, model: torch.nn.Module, data, folder: Path, world: int, say, device: torch.device) -> dict:
    """Every check of a resume from ``folder`` that needs no Trainer (docs/training.md: "What a
    resume checks"), given the run's config ``cfg`` and prepared ``data``; the accepted config
    changes. impl.threads=auto then takes the checkpoint's thread count."""
    run, new = written_run(folder), cfg.model_dump(mode="json")
    check_servable(run["config"], new, str(folder))  # before the shapes: named as such, not as a misfit
    check_resumable(folder, model, data.tokenizer.get_vocab_size())
    check_data_state(folder)
    check_finite_shards(folder) if sharded.is_sharded(folder) else check_finite(folder / "model.safetensors")
    check_same_data(folder, run["data"], data.identity(), run["config"], new)
    # Muon's ns_dtype is compared as each side resolved it, once the precision is known (check_newton_schulz)
    changes = resume_changes(_as_in(run["config"], new, NS_DTYPE), new, cfg.allow_change, str(folder),
                             resume_policy(type(cfg)))
    if not cfg.dryrun:  # (a dry run trains a batch of one microbatch a process: no plan to follow)
        changes = check_batch_plan(folder, cfg.train, cfg.budget, cfg.impl.microbatch_size, world, cfg.allow_change, changes)
    if device.type == "cpu":  # the run's device (a model built on the meta device is on none yet); before anything is measured with the thread count
        adopt_checkpoint_threads(cfg.impl, folder, world, say)
    return changes
