"""``cramlm eval``: fine-tune a checkpoint on each task with N seeds and report dev scores.

``checkpoint`` is a run name, ``latest``, a run folder, a Hugging Face folder or ``hf://name``;
append ``-untrained`` (or set ``untrained=true``) for the random-weights baseline. Results go to
``<run>/eval.{json,md,csv}`` (``eval-untrained.*`` for the baseline; ``<base_dir>/eval/<name>/eval.*``
for HF checkpoints; or ``out_dir``) and are printed. ``eval.json`` holds ``results``: one row per
task and dev split with ``task``, ``metric``, ``score`` (median last-epoch headline score) and ``best``.

Stopping and continuing: every finished fine-tuning (one task, one seed) is written at once to
``<stem>.partial.json`` beside the results. SIGINT, SIGTERM or SIGUSR1 (train/preemption.py)
abandon the fine-tuning in progress after its current step, leave the finished ones written and
exit with status 75, as training does; the same command again reuses every finished fine-tuning
whose checkpoint (its weight files), task data and hyperparameters are unchanged, and redoes only
the rest. The partial file is removed once ``<stem>.json`` is written.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from cramlm.config.base import Config
from cramlm.constants import OUTPUTS_DIR
from cramlm.eval.config import EvalConfig
from cramlm.train.impl import ImplConfig, setup_device

DEFAULTS: dict[str, Any] = {"eval": "default", "impl": "default"}


class EvalRunConfig(Config):
    name: str = "latest"  # the run to evaluate (<base_dir>/<name>) when checkpoint is not set
    base_dir: str = OUTPUTS_DIR
    checkpoint: str | None = None  # run name/folder, latest, HF folder, hf://name; suffix -untrained
    untrained: bool = False  # same architecture, random weights
    trust_remote_code: bool = False  # let transformers run a checkpoint's own modeling code
    out_dir: str | None = None  # where results go (default: see the module docstring)
    plugins: list[str] = []  # modules to import first: trusted code (importing runs it, like any Python import)
    eval: EvalConfig = EvalConfig()
    impl: ImplConfig = ImplConfig()


def evaluate(cfg: EvalRunConfig) -> list[dict]:
    """Evaluate as the module docstring says; a stop signal exits with status 75 (``SystemExit``)
    once the finished fine-tunings are written."""
    from cramlm.train.preemption import StopRequest

    with StopRequest() as stop:
        return _evaluate(cfg, stop)


def _evaluate(cfg: EvalRunConfig, stop) -> list[dict]:
    # imported here: EvalRunConfig validates without torch (fast config errors)
    from cramlm.eval.checkpoints import load_checkpoint
    from cramlm.eval.finetune import Abandoned, finetune
    from cramlm.eval.tables import majority_scores, markdown, means, task_rows, to_csv
    from cramlm.eval.tasks import load_tasks
    from cramlm.io import write_json, write_text

    ev = cfg.eval
    tasks = load_tasks(ev.tasks, ev.glue_dir)  # fail before any training, naming every bad task
    device = setup_device(cfg.impl)
    ckpt = load_checkpoint(cfg.checkpoint or cfg.name, cfg.base_dir, cfg.untrained, ev.seed, cfg.trust_remote_code)
    out_dir = Path(cfg.out_dir) if cfg.out_dir else ckpt.out_dir
    stem = out_dir / ckpt.stem
    # the results folder must take files before hours of fine-tuning: its partial file is written now
    partial = Partial(Path(f"{stem}.partial.json"), {"checkpoint": ckpt.label, "identity": ckpt.identity,
                                                      "protocol": ev.protocol})
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        partial.save()
    except OSError as e:
        raise OSError(e.errno, f"{e.strerror}: cannot write results in this folder (out_dir)", str(out_dir)) from None
    start = time.perf_counter()
    print(f"cramlm eval: {ckpt.label}, protocol {ev.protocol}, {len(tasks)} tasks x {ev.seeds} seeds, device {device}")
    if partial.reused:
        print(f"cramlm eval: continuing from {partial.path}: {partial.reused} finished fine-tunings are not redone")

    def stopped(doing: str) -> None:
        if stop.signal:
            _stop_exit(stop.signal, doing, partial, len(tasks) * ev.seeds)

    stopped("before the held-out LM loss")
    lm = None
    if ev.lm_eval and ckpt.lm is not None:
        val = Path(ev.lm_data) if ev.lm_data else ckpt.lm.val_path
        if val is None:
            print("LM eval skipped: the run's val.cramtok was not found (set eval.lm_data=<file>)")
        elif (lm := partial.lm(val)) is None:
            from cramlm.data.cramtok import read_packed
            from cramlm.eval.lm import lm_eval, run_held_out_batches

            # the run's own held-out set, masked as in pretraining: the same number as its val_loss
            batches = run_held_out_batches(ckpt.lm.config, read_packed(val), ckpt.lm.vocab_size)
            lm = {**lm_eval(ckpt.lm.model, ckpt.lm.objective, batches, device=device, progress=cfg.impl.progress),
                  "file": str(val)}
            partial.set_lm(lm)
        if lm is not None:
            print(f"held-out {lm['objective'].upper()} loss {lm['loss']:.4f}"
                  + (f", perplexity {lm['perplexity']:.2f}" if "perplexity" in lm else "")
                  + f" ({lm['sequences']} sequences of {val}, as pretraining's val_loss)")

    rows = []
    for task in tasks:
        hp = ev.for_task(task.name)
        runs = []
        for seed in range(ev.seed, ev.seed + ev.seeds):
            stopped(f"before {task.name} seed {seed}")
            done = partial.run(task, hp, seed)
            if done is None:
                try:
                    done = finetune(ckpt, task, hp, seed, cfg.impl, device, stop=stop)
                except Abandoned as e:
                    _stop_exit(stop.signal, str(e), partial, len(tasks) * ev.seeds)
                partial.add_run(task, hp, seed, done)
            runs.append(done)
        task_result = task_rows(task, runs, majority_scores(task, hp.max_dev_examples))
        for r in task_result:
            r["hparams"] = hp.model_dump(mode="json")
            r["skipped_rows"] = task.skipped
            print(f"{r['task']}: {r['metric']} last {100 * r['score']:.2f}, best {100 * r['best']:.2f} ({r['seconds']}s)")
        rows += task_result

    mean = means(rows)
    title = f"{ckpt.label} ({ev.protocol}, median of {ev.seeds} seed{'s' if ev.seeds > 1 else ''})"
    table = markdown(rows, mean, title)
    result = {
        "checkpoint": ckpt.label,
        "untrained": ckpt.untrained,
        "protocol": ev.protocol,
        "results": rows,
        "mean": mean,
        "lm": lm,
        "seconds": round(time.perf_counter() - start, 1),
        "config": cfg.model_dump(mode="json"),
    }
    write_json(stem.with_suffix(".json"), result)
    write_text(stem.with_suffix(".csv"), to_csv(rows, mean))
    write_text(stem.with_suffix(".md"), table + (f"\nheld-out {lm['objective']} loss: {lm['loss']:.4f}\n" if lm else ""))
    partial.path.unlink(missing_ok=True)  # everything is in the results now
    print("\n" + table)
    print(f"results in {stem}.{{md,csv,json}}")
    print(json.dumps({"checkpoint": ckpt.label, "mean": mean, "lm_loss": lm and lm["loss"]}))
    return rows


def _stop_exit(signum: int, doing: str, partial: Partial, total: int) -> None:
    from cramlm.train.preemption import EXIT_INTERRUPTED, signal_name

    print(f"cramlm eval: {signal_name(signum)}: stopped ({doing}); {partial.finished} of {total} fine-tunings "
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


class Partial:
    """``<stem>.partial.json``: the fine-tunings (task, seed) finished so far and the held-out LM
    result, for the checkpoint ``header`` names. A file for another checkpoint (or other weights,
    or an unreadable one) is set aside; a task's runs are reused only with the same data and
    hyperparameters."""

    def __init__(self, path: Path, header: dict):
        self.path, self.header = path, header
        self.data: dict = {**header, "lm": None, "tasks": {}}
        self.reused = 0
        old = self._read()
        if old is not None and all(old.get(k) == v for k, v in header.items()):
            self.data["lm"], self.data["tasks"] = old.get("lm"), old.get("tasks") or {}
            self.reused = self.finished
        elif old is not None:
            print(f"cramlm eval: {path} holds results of another checkpoint or protocol; starting afresh", file=sys.stderr)
        self._digests: dict[int, str] = {}

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
        if id(task) not in self._digests:  # hashed once per task object
            self._digests[id(task)] = task_digest(task)
        return {"data": self._digests[id(task)], "hparams": hp.model_dump(mode="json")}

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

    def lm(self, val: Path) -> dict | None:
        lm = self.data.get("lm")
        return lm if isinstance(lm, dict) and lm.get("file") == str(val) else None

    def set_lm(self, lm: dict) -> None:
        self.data["lm"] = lm
        self.save()
