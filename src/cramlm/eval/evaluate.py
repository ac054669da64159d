"""``cramlm eval``: fine-tune a checkpoint on each task with N seeds and report dev scores.

``checkpoint`` is a run name, ``latest``, a run folder, a Hugging Face folder or ``hf://name``;
append ``-untrained`` (or set ``untrained=true``) for the random-weights baseline. Results go to
``<run>/eval.{json,md,csv}`` (``eval-untrained.*`` for the baseline; ``<base_dir>/eval/<name>/eval.*``
for HF checkpoints; or ``out_dir``) and are printed. ``eval.json`` holds ``results``: one row per
task and dev split with ``task``, ``metric``, ``score`` (median last-epoch headline score) and ``best``;
``heldout``: the held-out LM loss and bits per byte of cramlm runs (definition in data/heldout.py);
``minimal_pairs``: with ``eval.minimal_pairs.paths``, the zero-shot minimal-pair accuracy of the
pretrained heads (eval/pairs.py, eval/pair_models.py), before any fine-tuning.

A stop signal (SIGINT, SIGTERM, SIGUSR1) abandons the fine-tuning in progress, keeps the finished
ones in ``<stem>.partial.json`` and exits 75; the same command continues from them (eval/partial.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from pydantic import Field

from cramlm.config.base import Config
from cramlm.constants import OUTPUTS_DIR
from cramlm.eval.config import EvalConfig
from cramlm.train.impl import ImplConfig, setup_device

DEFAULTS: dict[str, Any] = {"eval": "default", "impl": "default"}


class EvalRunConfig(Config):
    name: str = Field("latest", description="the run to evaluate, <base_dir>/<name>, when checkpoint is not set; latest: the newest run")
    base_dir: str = Field(OUTPUTS_DIR, description="folder holding the run folders")
    checkpoint: str | None = Field(
        None, description="what to evaluate: a run name or folder, one of its checkpoints (<run>/checkpoints/step-N), "
        "latest, a Hugging Face folder or hf://name; "
        "suffix -untrained for the random-weights twin. null: name")
    untrained: bool = Field(False, description="the untrained twin: the same architecture with random weights (the baseline)")
    trust_remote_code: bool = Field(False, description="let transformers run a checkpoint's own modeling code (HF folders)")
    out_dir: str | None = Field(
        None, description="where eval.{json,md,csv} go; null: the run folder (HF checkpoints: <base_dir>/eval/<name>)")
    plugins: list[str] = Field([], description="modules to import first (they may register components): trusted code, "
                               "importing runs it like any Python import")
    overwrite: bool = Field(False, description="replace results of another checkpoint in out_dir; false: such an "
                            "out_dir is refused (results of the same checkpoint are always replaced)")
    eval: EvalConfig = Field(EvalConfig(), description="the tasks and the fine-tuning protocol (the eval group)")
    impl: ImplConfig = Field(ImplConfig(), description="device, precision and threads (the impl group)")


def evaluate(cfg: EvalRunConfig) -> list[dict]:
    """Evaluate as the module docstring says; a stop signal exits with status 75 (``SystemExit``)
    once the finished fine-tunings are written."""
    from cramlm.train.preemption import StopRequest

    with StopRequest() as stop:
        return _evaluate(cfg, stop)


def check_overrides(ev, tasks=None) -> None:
    """Every ``eval.overrides`` entry names a task of this evaluation (an override of no task would be
    ignored unsaid); ``tasks``: the loaded tasks (None: loaded here, so `cramlm run` checks before
    training). An evaluation without tasks (minimal pairs alone, as a zero-shot sweep) fine-tunes
    nothing: its overrides are not checked."""
    if not ev.overrides or not ev.tasks:
        return
    from cramlm.eval.tasks import load_tasks

    names = [t.name for t in (tasks if tasks is not None else load_tasks(ev.tasks, ev.glue_dir))]
    if unknown := sorted(set(ev.overrides) - set(names)):
        import difflib

        close = difflib.get_close_matches(unknown[0], names, n=1)
        raise ValueError(f"eval.overrides.{unknown[0]}: no task of this evaluation is named so (tasks: {', '.join(names)})"
                         + (f"; did you mean '{close[0]}'?" if close else ""))


def _evaluate(cfg: EvalRunConfig, stop) -> list[dict]:
    # imported here: EvalRunConfig validates without torch (fast config errors)
    from cramlm.eval.checkpoints import load_checkpoint
    from cramlm.eval.pairs import load_pairs, pairs_markdown, pairs_text
    from cramlm.eval.partial import Partial, stop_exit
    from cramlm.eval.tables import markdown, means, objective_label, text_table, to_csv
    from cramlm.eval.tasks import load_tasks
    from cramlm.io import write_json, write_text

    ev = cfg.eval
    tasks = load_tasks(ev.tasks, ev.glue_dir)  # fail before any training, naming every bad task
    check_overrides(ev, tasks)
    if ev.select.active:
        for task in tasks:
            select_split(task, ev.for_task(task.name), ev.select)
    pairs = load_pairs(ev.minimal_pairs)  # (empty without eval.minimal_pairs.paths)
    device = setup_device(cfg.impl)
    ckpt = load_checkpoint(cfg.checkpoint or cfg.name, cfg.base_dir, cfg.untrained, ev.seed, cfg.trust_remote_code)
    out_dir = Path(cfg.out_dir) if cfg.out_dir else ckpt.out_dir
    stem = out_dir / ckpt.stem
    if ckpt.lm is None or out_dir.resolve() != ckpt.out_dir.resolve():  # a run's own folder holds its own results
        check_results_folder(Path(f"{stem}.json"), ckpt, cfg.overwrite)
    # the results folder must take files before hours of fine-tuning: its partial file is written now
    # another device or precision: other numbers, never one median of both
    with results_lock(out_dir, stem):
        partial = Partial(Path(f"{stem}.partial.json"), {"checkpoint": ckpt.label, "identity": ckpt.identity,
                                                          "protocol": ev.protocol, "device": device.type,
                                                          "precision": cfg.impl.precision})
        partial.save()
        start = time.perf_counter()
        print(f"cramlm eval: {ckpt.label}, protocol {ev.protocol}, {len(tasks)} tasks x {ev.seeds} seeds, device {device}")
        if partial.reused:
            print(f"cramlm eval: continuing from {partial.path}: {partial.reused} finished fine-tunings are not redone")

        def stopped(doing: str) -> None:
            if stop.signal:
                stop_exit(stop.signal, doing, partial, ev.fine_tunings)

        stopped("before the held-out LM loss")
        heldout = heldout_result(cfg, ckpt, device, partial)
        stopped("before the minimal pairs")
        zero_shot = pairs_result(cfg, ckpt, device, pairs, partial, stopped)
        rows = [row for task in tasks for row in finetune_task(cfg, ckpt, task, device, stop, partial, stopped)]
        mean = means(rows)
        title = f"{ckpt.label} ({ev.protocol}, median of {ev.seeds} seed{'s' if ev.seeds > 1 else ''})"
        table = markdown(rows, mean, title)
        result = {
            "checkpoint": ckpt.label,
            "source": source_of(ckpt),
            "untrained": ckpt.untrained,
            "trained": ckpt.trained,
            "protocol": ev.protocol,
            "results": rows,
            "mean": mean,
            "heldout": heldout,
            "minimal_pairs": zero_shot,
            "seconds": round(time.perf_counter() - start, 1),
            "config": cfg.model_dump(mode="json"),
        }
        write_json(Path(f"{stem}.json"), result)
        write_text(Path(f"{stem}.csv"), to_csv(rows, mean))
        write_text(Path(f"{stem}.md"), table + (f"\nheld-out {objective_label(heldout['objective'])} loss: {heldout['loss']:.4f}"
                                                     + (f", {heldout['bpb']:.4f} bits per byte" if heldout["bpb"] is not None else "")
                                                     + f" ({heldout['definition']})\n" if heldout else "")
                   + (f"\n{pairs_markdown(zero_shot)}" if zero_shot and "scores" in zero_shot else "")
                   + (f"\nminimal pairs not scored: {zero_shot['skipped']}\n" if zero_shot and "skipped" in zero_shot else ""))
        partial.path.unlink(missing_ok=True)  # everything is in the results now
        print("\n" + text_table(rows, mean, title), end="")  # one aligned table, in % (eval.json keeps every digit)
        if zero_shot and "scores" in zero_shot:
            print("\n" + pairs_text(zero_shot), end="")
        elif zero_shot:
            print(f"\nminimal pairs not scored: {zero_shot['skipped']}")
        print(f"results in {stem}.{{md,csv,json}}")
        return rows


@contextmanager
def results_lock(out_dir: Path, stem: Path) -> Iterator[None]:
    """One evaluation into ``<stem>.json`` at a time (``.<stem>.lock`` beside it, removed afterwards): a
    second is refused, naming the first, before it reads or writes the partial file. The folder is made
    here and must take files before hours of fine-tuning."""
    from cramlm.locks import FolderLock

    lock = FolderLock(out_dir / f".{stem.name}.lock", f"results file {stem}.json")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except OSError as e:
        raise OSError(e.errno, f"{e.strerror}: cannot write results in this folder (out_dir)", str(out_dir)) from None
    try:
        yield
    finally:
        lock.path.unlink(missing_ok=True)
        lock.release()


def pairs_result(cfg: EvalRunConfig, ckpt, device, pairs: list, partial, stopped) -> dict | None:
    """``eval.json``'s ``minimal_pairs`` (eval/pair_models.py), None without pairs; a checkpoint that
    cannot score them (no trained LM head) is said and recorded as ``{"skipped": why}``. Scored once:
    a continued evaluation takes it from the partial file; ``stopped`` is asked between batches."""
    if not pairs:
        return None
    from cramlm.eval.pair_models import PairsUnavailable, score_pairs

    key = pairs_key(pairs, cfg.eval.minimal_pairs)
    done = partial.pairs(key)
    if done is not None:
        print(f"minimal pairs: scored before, from {partial.path.name}")
        return done
    try:
        done = score_pairs(ckpt, cfg.eval.minimal_pairs, pairs, device, progress=lambda _: stopped("in the minimal pairs"),
                           kept=partial.pairs_kept(key), keep=lambda kept, seconds: partial.keep_pairs(key, kept, seconds),
                           seconds_before=partial.pairs_seconds(key))
    except PairsUnavailable as e:
        print(f"minimal pairs skipped: {e}")
        done = {"skipped": str(e)}
    partial.set_pairs(key, done)
    return done


def pairs_key(pairs: list, pairs_cfg) -> str:
    """A digest of the pairs and how they are scored: a result is reused only for the same."""
    h = hashlib.sha256(json.dumps(pairs_cfg.model_dump(mode="json", exclude={"save_every"}), sort_keys=True).encode())
    for p in pairs:
        h.update(json.dumps([p.good, p.bad, p.paradigm, p.phenomenon]).encode())
    return h.hexdigest()[:16]


def heldout_result(cfg: EvalRunConfig, ckpt, device, partial) -> dict | None:
    """The held-out LM loss and bits per byte of a cramlm run (data/heldout.py), scored once: a continued
    evaluation takes it from the partial file."""
    ev = cfg.eval
    if not ev.lm_eval or ckpt.lm is None or ckpt.lm.model is None:
        return None
    val = Path(ev.lm_data) if ev.lm_data else ckpt.lm.val_path
    if val is None:
        print("held-out loss skipped: the run's val.cramtok was not found (set eval.lm_data=<file>)")
        return None
    heldout = partial.heldout(val)
    if heldout is None:
        from cramlm.eval.lm import lm_heldout

        heldout = {**lm_heldout(ckpt.lm, val, device=device, progress=cfg.impl.progress),
                   "file": str(val), "tokenizer": ckpt.lm.tokenizer}
        partial.set_heldout(heldout)
    from cramlm.eval.tables import objective_label

    print(f"held-out {objective_label(heldout['objective'])} loss {heldout['loss']:.4f}"
          + (f", {heldout['bpb']:.4f} bits per byte" if heldout["bpb"] is not None else "")
          + (f", perplexity {heldout['perplexity']:.2f}" if "perplexity" in heldout else "")
          + f" ({heldout['sequences']:,} of {heldout['file_sequences']:,} sequences of {val}, {heldout['definition']})")
    return heldout


def finetune_task(cfg: EvalRunConfig, ckpt, task, device, stop=None, partial=None, stopped=None) -> list[dict]:
    """Fine-tune ``ckpt`` on ``task`` with ``eval.seeds`` seeds (those ``partial`` holds already are
    not redone): its result rows (median over seeds, one per dev split), printed as they come."""
    from cramlm.eval.tables import majority_scores, task_rows

    ev = cfg.eval
    hp = ev.for_task(task.name)
    selected = None
    if ev.select.active:
        hp, selected = select_hparams(cfg, ckpt, task, hp, device, stop, partial, stopped)
    runs = []
    for seed in range(ev.seed, ev.seed + ev.seeds):
        if stopped:
            stopped(f"before {task.name} seed {seed}")
        runs.append(finetune_once(cfg, ckpt, task, hp, seed, device, stop, partial))
    rows = task_rows(task, runs, majority_scores(task, hp.max_dev_examples))
    for r in rows:
        r["hparams"] = hp.model_dump(mode="json")
        if selected:
            r["selected"] = selected
        r["skipped_rows"] = task.skipped
        print(f"{r['task']}: {r['metric']} last {100 * r['score']:.2f}, best {100 * r['best']:.2f} ({r['seconds']}s)")
    return rows


def finetune_once(cfg: EvalRunConfig, ckpt, task, hp, seed: int, device, stop, partial) -> dict:
    """One fine-tuning's result: from ``partial`` when it finished before, else trained and added there."""
    from cramlm.eval.finetune import Abandoned, finetune
    from cramlm.eval.partial import stop_exit

    done = partial.run(task, hp, seed) if partial else None
    if done is None:
        try:
            done = finetune(ckpt, task, hp, seed, cfg.impl, device, stop=stop)
        except Abandoned as e:
            stop_exit(stop.signal, str(e), partial, cfg.eval.fine_tunings)
        if partial:
            partial.add_run(task, hp, seed, done)
    return done


def select_hparams(cfg: EvalRunConfig, ckpt, task, hp, device, stop, partial, stopped) -> tuple:
    """``eval.select``: (the task's hyperparameters with the chosen lr and epochs, the record of the
    choice). The capped training split is cut once into a held-out share and the rest; each grid
    configuration fine-tunes on the rest with the first seed and is scored on the share."""
    import itertools

    from cramlm.eval.tasks import Task

    ev, sel = cfg.eval, cfg.eval.select
    rest_examples, held_examples = select_split(task, hp, sel)
    scores = []
    for lr, epochs in itertools.product(sel.lr or [hp.lr], sel.epochs or [hp.epochs]):
        trial = hp.model_copy(update={"lr": lr, "epochs": epochs, "max_train_examples": None, "max_dev_examples": None})
        # each configuration its own task name: its own entry in the partial file
        split = Task(f"{task.name} [select lr={lr:g} epochs={epochs}]", task.labels, task.metrics, rest_examples,
                     {"select": held_examples})
        if stopped:
            stopped(f"before {split.name}")
        done = finetune_once(cfg, ckpt, split, trial, ev.seed, device, stop, partial)
        scores.append({"lr": lr, "epochs": epochs, "score": done["epochs"][-1]["select"][task.metric]})
    best = max(scores, key=lambda s: s["score"] if s["score"] == s["score"] else -math.inf)  # the first of equals; NaN last
    print(f"{task.name}: selected lr {best['lr']:g}, {best['epochs']} epochs ({task.metric} {100 * best['score']:.2f} on "
          f"{len(held_examples)} held-out training examples; " + ", ".join(f"{s['lr']:g}/{s['epochs']}: {100 * s['score']:.2f}" for s in scores) + ")")
    chosen = hp.model_copy(update={"lr": best["lr"], "epochs": best["epochs"]})
    return chosen, {"lr": best["lr"], "epochs": best["epochs"], "metric": task.metric, "held_out": len(held_examples),
                    "trained_on": len(rest_examples), "grid": scores}


def select_split(task, hp, sel) -> tuple[list, list]:
    """``eval.select``'s cut of the task's capped training split: (the rest, the held-out share)."""
    from cramlm.eval.tasks import hold_out, sample

    train = sample(task.train, hp.max_train_examples)
    rest_examples, held_examples = hold_out(train, sel.fraction, sel.seed)
    if not rest_examples or not held_examples:
        raise ValueError(f"eval.select.fraction={sel.fraction}: {task.name} has {len(train)} training examples, "
                         "too few to hold a share out and train on the rest")
    return rest_examples, held_examples


def source_of(ckpt) -> str | None:
    """What the results are of: the checkpoint's folder (resolved) or hf:// name."""
    source = ckpt.identity.get("source")
    return source if source is None or source.startswith("hf://") else str(Path(source).resolve())


def check_results_folder(path: Path, ckpt, overwrite: bool) -> None:
    """Results of another checkpoint (``path``: an eval.json) are never replaced silently."""
    import json

    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(old, dict) or overwrite:
        return
    theirs, source = old.get("source"), source_of(ckpt)
    if old.get("checkpoint") == ckpt.label and (theirs is None or source is None or theirs == source):
        return
    raise ValueError(f"{path} holds the results of another checkpoint ({theirs or old.get('checkpoint')}); this "
                     f"evaluation of {source or ckpt.label} never replaces them: pick another out_dir=..., or "
                     "overwrite=true to replace them")
