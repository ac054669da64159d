"""The run folder ``<base_dir>/<name>/``: claimed, locked, its config history kept, its final
files written. It holds ``model.safetensors`` (its digest in ``digests.json``; an objective with
trained parts, e.g. ELECTRA, writes them beside it), ``config.yaml`` (this segment's resolved config;
``config-history.jsonl``: every segment's), ``tokenizer.json``, ``metrics.jsonl`` (train / val /
event lines), ``summary.json`` and ``checkpoints/step-*/`` (the newest few, the final one always)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from cramlm.config.loader import to_yaml
from cramlm.constants import OUTPUTS_DIR
from cramlm.io import replace_digested, save_safetensors, write_json, write_text
from cramlm.locks import FolderLock, LockHeld
from cramlm.run.console import console_summary

if TYPE_CHECKING:
    from cramlm.run.config import PretrainConfig


RUN_LOCK = ".cramlm.lock"  # in the run folder; its owner file says which process holds it


RUN_FILES = ("config.yaml", "model.safetensors", "summary.json", "metrics.jsonl", "checkpoints", "pipeline.json",
             "eval.json", "report.html")  # what a folder holding a run holds (any one of them)


class RunFolderTaken(ValueError):
    """A fresh run was pointed at a folder that holds a run; the message names it and the ways out."""


def held_run(run_dir: Path) -> list[str]:
    """The files of a run that ``run_dir`` holds (an empty ``checkpoints/`` does not count)."""
    return [name for name in RUN_FILES if (run_dir / name).is_file()
            or ((run_dir / name).is_dir() and any((run_dir / name).iterdir()))]


def empty_run_dir(run_dir: Path, keep: tuple[str, ...] = ()) -> None:
    """Delete everything in ``run_dir`` but its lock (which the caller holds) and the files named in ``keep``."""
    for entry in run_dir.iterdir():
        if entry.name in (RUN_LOCK, RUN_LOCK + ".owner", *keep):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def claim_run_dir(run_dir: Path, overwrite: bool, command: str, whose: str = "a run", keep: tuple[str, ...] = ()) -> None:
    """A fresh run takes a folder that holds no run; ``overwrite``: it deletes the one there whole
    first (but ``keep``); otherwise the folder is refused (HF Trainer's ``overwrite_output_dir``, the other way round)."""
    held = held_run(run_dir)
    if not held:
        return
    if overwrite:
        empty_run_dir(run_dir, keep)
        return
    raise RunFolderTaken(
        f"{run_dir} holds {whose} already ({', '.join(held)}); {command} never starts over it. Continue it with "
        f"--resume auto, pick another name=..., or delete that run and start afresh with overwrite=true")


def lock_run_dir(cfg: PretrainConfig, dist, replace: bool = False) -> FolderLock | None:
    """Rank 0 takes the run folder's lock (a second run of the same name refuses, naming the
    holder) and, for a fresh run, the folder (``claim_run_dir``; ``replace``: the caller owns it,
    as `cramlm run` does its stage's folder); every rank learns the outcome, so none waits for a
    rank that gave up."""
    from cramlm.train.distributed import broadcast_object

    lock, error = None, None
    if dist.main:
        try:
            lock = FolderLock(cfg.run_dir / RUN_LOCK, f"run folder {cfg.run_dir}").acquire()
            if cfg.resume is None and not replace:
                claim_run_dir(cfg.run_dir, cfg.overwrite, "a fresh `cramlm pretrain`")
        except (LockHeld, RunFolderTaken) as e:
            error = (type(e).__name__, str(e))
    error = broadcast_object(error, dist)
    if error is not None:
        if lock is not None:
            lock.release()
        raise (LockHeld if error[0] == "LockHeld" else RunFolderTaken)(error[1])
    return lock


def unlock_run_dir(lock: FolderLock | None, created: bool) -> None:
    """Release; a run folder this run created and left empty (it failed early) is removed again."""
    if lock is None:
        return
    lock.release()
    if created and [p.name for p in lock.path.parent.iterdir()] == [RUN_LOCK]:
        lock.path.unlink(missing_ok=True)
        try:
            lock.path.parent.rmdir()
        except OSError:  # something appeared meanwhile: leave it
            pass


HISTORY = "config-history.jsonl"  # one line per segment of a run: the step it began at, its changes, its config


def record_segment(run_dir: Path, step: int, changes: dict, config: dict, fresh: bool) -> None:
    """A run's config history: a fresh run starts it (step 0), a resume with changes adds a line."""
    line = json.dumps({"step": step, "changes": changes, "config": config})
    path = run_dir / HISTORY
    previous = path.read_text(encoding="utf-8") if not fresh and path.is_file() else ""
    write_text(path, previous + line + "\n")


def history_end(run_dir: Path) -> int:
    """The step of the config history's last line (0: none, or unreadable)."""
    path = run_dir / HISTORY
    try:
        step = json.loads(path.read_text(encoding="utf-8").splitlines()[-1]).get("step")
    except (OSError, ValueError, IndexError, AttributeError):
        return 0
    return step if isinstance(step, int) else 0


def prepare_run_dir(cfg: PretrainConfig, resume_from: Path | None, say) -> None:
    """Rank 0: the run folder, no interrupted checkpoint writes, no checkpoints of an earlier run of
    this name (`cramlm run` retraining in its own folder; any other fresh run has claimed an empty
    one), and on a resume from an older checkpoint than the folder's newest, the later ones set aside."""
    from cramlm.train.checkpoint import (clear_checkpoints, remove_partial_checkpoints, supersede_later_checkpoints,
                                         written_state)

    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    # first: an interrupted rewrite's old folder comes back here, and must not outlive the clearing below
    for partial in remove_partial_checkpoints(run_dir / "checkpoints"):
        say(f"cramlm: removed {partial.name}, an interrupted checkpoint write")
    if resume_from is None:
        clear_checkpoints(run_dir / "checkpoints")
        return
    step = (written_state(resume_from).get("usage") or {}).get("steps")
    for old, new in supersede_later_checkpoints(run_dir / "checkpoints", step) if isinstance(step, int) else []:
        say(f"cramlm: resuming from {resume_from.name}: the later {old.name} of this folder is renamed {new.name} "
            "(kept; the run goes on from the older step)")


def logged_steps(run_dir: Path) -> int | None:
    """The last step ``metrics.jsonl`` logged (0: none yet); None where there is no log. A folder
    with a log and no checkpoint holds an earlier start that was cut off before its first checkpoint."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file() or path.stat().st_size == 0:
        return None
    last = 0
    with open(path, "rb") as f:
        for raw in f:
            try:
                line = json.loads(raw)
            except ValueError:  # a line cut by the kill
                continue
            if isinstance(line, dict) and line.get("kind") in ("train", "val") and isinstance(line.get("step"), int):
                last = max(last, line["step"])
    return last


def record_run(cfg: PretrainConfig, data, resume_from: Path | None, changes: dict, restarted: bool = False) -> None:
    """Rank 0, once the run has started or its resume has loaded (a refused resume writes nothing):
    this segment's config (config.yaml; config-history.jsonl keeps every segment's: a line for the
    start, for each resume with changes, and for a resume from a checkpoint not newer than its last line,
    whose lines from that step on it supersedes) and the run's tokenizer. ``restarted``: a start again
    from step 0 after one cut off before its first checkpoint, whose history line stays."""
    from cramlm.train.checkpoint import written_state

    run_dir = cfg.run_dir
    step = written_state(resume_from)["usage"]["steps"] if resume_from else 0
    # a resume from a checkpoint not after the last line (written by the segment before that line's change):
    # its line at that step supersedes the later ones
    if resume_from is None or changes or step <= history_end(run_dir):
        record_segment(run_dir, step, changes, cfg.model_dump(mode="json"), fresh=resume_from is None and not restarted)
    write_text(run_dir / "config.yaml", to_yaml(cfg))
    shutil.copyfile(data.folder / "tokenizer.json", run_dir / "tokenizer.json")


def save_run(cfg: PretrainConfig, dist, summary: dict, say) -> None:
    """Rank 0: the final weights (with their digest) and summary.json. The weights files replace
    the run's earlier ones through pending digests (io.replace_digested): a stop half-way leaves
    one save's files, accepted, or files of both, refused together."""
    from cramlm.train.distributed import barrier

    from cramlm.models.objectives.base import build_objective

    if dist.main:
        final = Path(summary["final_checkpoint"]) / "model.safetensors"
        objective = build_objective(cfg)
        names = ["model.safetensors", *([objective.trained_parts] if objective.trained_parts else [])]
        try:
            with replace_digested(cfg.run_dir, names) as tmp:
                if sharded_weights(final.parent, tmp, objective):
                    pass  # assembled from the shards
                elif objective.trained_parts:  # the arch under its own names (fine-tuning), and beside it the
                    from safetensors.torch import load_file  # parts it lacks (eval, export): ELECTRA's generator and detector

                    state = load_file(str(final))
                    save_safetensors(objective.encoder_state(state), tmp["model.safetensors"], {"format": "pt"})
                    save_safetensors(objective.parts_state(state), tmp[objective.trained_parts], {"format": "pt"})
                else:
                    shutil.copyfile(final, tmp["model.safetensors"])
        except Exception as e:  # (torch's and safetensors' errors wrap the OS error in text)
            from cramlm.io import is_disk_full

            if not is_disk_full(e):
                raise
            raise OSError(f"{cfg.run_dir}: disk full writing the run's {' and '.join(names)} from its final checkpoint "
                          f"{final.parent}, which is intact: free space, then `--resume auto` writes them") from None
        write_json(cfg.run_dir / "summary.json", summary)
        say(console_summary(summary, cfg.run_dir))
    barrier(dist)


def sharded_weights(folder: Path, paths: dict[str, Path], objective) -> bool:
    """A sharded final checkpoint (``folder``): the run's model.safetensors (the arch's weights; an
    objective with trained parts, e.g. ELECTRA: those beside it) assembled from the shards a tensor
    at a time on this process, never the optimizer's, into ``paths`` ({file name: path}); False
    for a full checkpoint (nothing written)."""
    from cramlm.train.sharded import is_sharded, stream_weights, weight_shapes

    if not is_sharded(folder):
        return False
    if not objective.trained_parts:
        stream_weights(folder, paths["model.safetensors"])
        return True
    names = {k: k for k in weight_shapes(folder)}  # the objective's selections applied to names: {new name: name}
    for part, select in (("model.safetensors", objective.encoder_state), (objective.trained_parts, objective.parts_state)):
        renamed = {old: new for new, old in select(names).items()}
        stream_weights(folder, paths[part], rename=renamed.get)
    return True


def named_run(path: str | Path) -> Path:
    """``path`` itself, or ``outputs/<path>`` when only that exists: a run name works wherever a run
    folder does (``cramlm report default``, ``cramlm export default ...``)."""
    path = Path(path)
    named = Path(OUTPUTS_DIR) / path
    return named if not path.exists() and named.is_dir() else path
