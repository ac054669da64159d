"""``<stem>.partial.json``: what ``cramlm eval`` has finished so far, so that a stopped evaluation
continues where it stopped.

Every finished fine-tuning (one task, one seed) is written at once beside the results. SIGINT,
SIGTERM or SIGUSR1 (train/preemption.py) abandon the fine-tuning in progress after its current
step, leave the finished ones written and exit with status 75, as training does; the same command
again reuses every finished fine-tuning whose checkpoint (its weight files), task data and
hyperparameters are unchanged, and redoes only the rest. The minimal pairs' sentence scores are
written every ``eval.minimal_pairs.save_every`` sentences, so a stopped (or killed) scoring continues
after the last written ones. The partial file is removed once ``<stem>.json`` is written.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def stop_exit(signum: int, doing: str, partial: Partial, total: int) -> None:
    """Say what was kept and exit 75 (training's status for a stop)."""
    from cramlm.train.preemption import EXIT_INTERRUPTED, signal_name

    pairs = f"{partial.pairs_scored:,} sentences of the minimal pairs scored, " if partial.pairs_scored else ""
    print(f"cramlm eval: {signal_name(signum)}: stopped ({doing}); {pairs}{partial.finished} of {total} fine-tunings "
          f"finished, written to {partial.path}; the same command continues from them", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_INTERRUPTED)


def task_digest(task) -> str:
    """A digest of a task's examples and labels: a finished fine-tuning is reused only on the same data."""
    h = hashlib.sha256(json.dumps([task.name, task.labels, task.metrics]).encode())
    for split, examples in [("train", task.train), *sorted(task.dev.items())]:
        h.update(split.encode())
        for e in examples:
            h.update(json.dumps([e.text_a, e.text_b, e.label]).encode())
    return h.hexdigest()[:16]


# header keys a partial file written before they existed lacks: taken as this evaluation's
ADDED_LATER = ("device", "precision")


class Partial:
    """``<stem>.partial.json``: the fine-tunings (task, seed) finished so far, the held-out LM and
    the minimal-pair results, for the checkpoint ``header`` names. A file for another checkpoint (or
    other weights, protocol, device or precision) is set aside under another name, never overwritten;
    an unreadable one is started afresh; a task's runs are reused only with the same data and
    hyperparameters."""

    def __init__(self, path: Path, header: dict):
        self.path, self.header = path, header
        self.data: dict = {**header, "heldout": None, "minimal_pairs": None, "minimal_pairs_kept": None, "tasks": {}}
        self.reused = 0
        old = self._read()
        if old is not None and all(old.get(k, v if k in ADDED_LATER else None) == v for k, v in header.items()):
            self.data["heldout"], self.data["tasks"] = old.get("heldout"), old.get("tasks") or {}
            self.data["minimal_pairs"], self.data["minimal_pairs_kept"] = old.get("minimal_pairs"), old.get("minimal_pairs_kept")
            self.reused = self.finished
        elif old is not None:
            aside = self._set_aside()
            print(f"cramlm eval: {path} holds results of another checkpoint, protocol, device or precision: kept as "
                  f"{aside.name}; starting afresh", file=sys.stderr)
        self._digests: dict[int, tuple] = {}  # id(task) -> (task, digest): the task kept, so its id is not reused

    def _set_aside(self) -> Path:
        """Rename the file to ``<stem>.partial.other[-N].json`` (the first free name)."""
        import os

        stem = self.path.name[: -len(".partial.json")] if self.path.name.endswith(".partial.json") else self.path.stem
        for n in range(1000):
            aside = self.path.with_name(f"{stem}.partial.other{'' if n == 0 else f'-{n}'}.json")
            if not aside.exists():
                os.replace(self.path, aside)
                return aside
        raise OSError(f"{self.path}: no free name to set it aside")

    def _read(self) -> dict | None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            print(f"cramlm eval: {self.path} is unreadable ({e}); starting afresh", file=sys.stderr)
            return None
        return data if isinstance(data, dict) and isinstance(data.get("tasks", {}), dict) else None

    @property
    def finished(self) -> int:
        return sum(len(t.get("seeds", {})) for t in self.data["tasks"].values() if isinstance(t, dict))

    def save(self) -> None:
        from cramlm.io import write_json

        write_json(self.path, self.data)

    def _key(self, task, hp) -> dict:
        cached = self._digests.get(id(task))
        if cached is None:  # hashed once per task object
            cached = self._digests[id(task)] = (task, task_digest(task))
        return {"data": cached[1], "hparams": hp.model_dump(mode="json")}

    def run(self, task, hp, seed: int) -> dict | None:
        entry = self.data["tasks"].get(task.name)
        if not isinstance(entry, dict) or {k: entry.get(k) for k in ("data", "hparams")} != self._key(task, hp):
            return None
        done = entry.get("seeds", {}).get(str(seed))
        if isinstance(done, dict):
            print(f"{task.name} seed {seed}: finished before, from {self.path.name}")
            return done
        return None

    def add_run(self, task, hp, seed: int, done: dict) -> None:
        key = self._key(task, hp)
        entry = self.data["tasks"].get(task.name)
        if not isinstance(entry, dict) or {k: entry.get(k) for k in ("data", "hparams")} != key:
            entry = self.data["tasks"][task.name] = {**key, "seeds": {}}
        entry["seeds"][str(seed)] = done
        self.save()
        print(f"{task.name} seed {seed}: fine-tuned in {done.get('seconds')}s", flush=True)

    def heldout(self, val: Path) -> dict | None:
        """The held-out result scored before on the same file, or None."""
        done = self.data.get("heldout")
        return done if isinstance(done, dict) and done.get("file") == str(val) else None

    def set_heldout(self, heldout: dict) -> None:
        self.data["heldout"] = heldout
        self.save()

    def pairs(self, key: str) -> dict | None:
        """The minimal-pair result scored before on the same pairs and settings (``key``), or None."""
        done = self.data.get("minimal_pairs")
        return done.get("result") if isinstance(done, dict) and done.get("key") == key else None

    def set_pairs(self, key: str, result: dict) -> None:
        self.data["minimal_pairs"], self.data["minimal_pairs_kept"] = {"key": key, "result": result}, None
        self.save()

    def pairs_kept(self, key: str) -> dict | None:
        """The sentence scores of a minimal-pair scoring stopped part way on the same pairs and settings:
        scorer -> method -> the scores of the first sentences (eval/pair_models.py's ``score_pairs``)."""
        kept = self.data.get("minimal_pairs_kept")
        scores = kept.get("scores") if isinstance(kept, dict) and kept.get("key") == key else None
        well_formed = isinstance(scores, dict) and all(
            isinstance(by_method, dict) and all(isinstance(v, list) and all(isinstance(x, float) for x in v)
                                                for v in by_method.values()) for by_method in scores.values())
        return scores if well_formed else None

    def pairs_seconds(self, key: str) -> float:
        """The seconds spent scoring the kept sentences (0 without them)."""
        kept = self.data.get("minimal_pairs_kept")
        seconds = kept.get("seconds") if self.pairs_kept(key) is not None else None
        return float(seconds) if isinstance(seconds, (int, float)) and seconds >= 0 else 0.0

    def keep_pairs(self, key: str, scores: dict, seconds: float) -> None:
        self.data["minimal_pairs_kept"] = {"key": key, "scores": scores, "seconds": seconds}
        self.save()

    @property
    def pairs_scored(self) -> int:
        """Sentences of the minimal pairs scored so far and kept (the fewest of any scorer begun, 0 if none)."""
        kept = self.data.get("minimal_pairs_kept")
        scores = kept.get("scores") if isinstance(kept, dict) else None
        lengths = [len(v) for by_method in scores.values() for v in by_method.values()
                   if isinstance(by_method, dict) and isinstance(v, list)] if isinstance(scores, dict) else []
        return min(lengths, default=0)
