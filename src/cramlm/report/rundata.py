"""Read a run folder for reporting: every file is optional, and unknown fields are kept; a zero-shot
record the tables cannot read (eval.json's minimal_pairs) is an error naming the file and key.

metrics.jsonl lines carry step/t/elapsed/tokens/loss/lr/batch_size/tokens_per_second and may carry
more (val_loss, mfu, ...), possibly on lines of their own; series are built from the lines that
hold both keys, so either layout plots.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from cramlm.report.segments import current_lines


@dataclass
class Evaluated:
    """One evaluation along a run: a checkpoint's (``eval-step-N.json``) or its end's (``eval.json``)."""

    step: int | None
    source: str  # the results file's name
    tokens: float | None  # of training the weights had
    flops: float | None
    heldout: float | None  # held-out loss
    zero_shot: float | None  # the minimal pairs' macro accuracy in %, by ``headline``
    headline: str | None
    task_mean: float | None  # the fine-tuned tasks' arithmetic mean in %
    pairs: dict[str, Any] = field(default_factory=dict)  # its minimal_pairs record ({}: none)
    results: list[dict[str, Any]] = field(default_factory=list)  # its task rows


@dataclass
class RunData:
    folder: Path
    name: str
    config: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)  # the run as it stands (segments.current_lines)
    log: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl's every line, superseded ones too
    summary: dict[str, Any] = field(default_factory=dict)  # {} where absent or older than the log (stale_summary)
    stale_summary: dict[str, Any] = field(default_factory=dict)  # summary.json of a finish the run trained on from
    eval: dict[str, Any] = field(default_factory=dict)
    eval_untrained: dict[str, Any] = field(default_factory=dict)  # the untrained twin's eval.json
    pipeline: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)  # config-history.jsonl: each segment's step and config
    # (step, eval-step-N.json) of each of its checkpoints evaluated (`cramlm eval checkpoint=<run>/checkpoints/step-N`)
    checkpoint_evals: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    def logged(self, key: str) -> tuple[list[float], list[float]]:
        """(steps, values) of ``key`` on the metric lines that hold both, in step order."""
        known = sorted({m["step"]: m[key] for m in self.metrics if is_number(m.get(key)) and is_number(m.get("step"))}.items())
        return [k for k, _ in known], [v for _, v in known]

    def at_step(self, key: str, step: int) -> float | None:
        """A logged quantity (tokens, flops) at ``step``, interpolated between the logged steps; None outside them."""
        return _interpolate(*self.logged(key), step)

    def series(self, x: str, y: str) -> tuple[list[float], list[float]]:
        """(xs, ys) from the metric lines holding a number under ``y``. A line without ``x`` (a
        validation line has no ``flops``) takes it from the lines around its step, interpolated
        linearly, since validation need not fall on a logged step."""
        steps, values = self.logged(x)
        pairs = []
        for m in self.metrics:
            if is_number(m.get(y)):
                at = m.get(x) if is_number(m.get(x)) else _interpolate(steps, values, m.get("step"))
                if at is not None:
                    pairs.append((at, m[y]))
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def has(self, key: str) -> bool:
        return any(is_number(m.get(key)) for m in self.metrics)

    @property
    def heldout(self) -> dict[str, Any]:
        """eval.json's held-out numbers (loss, bpb, ...; data/heldout.py), {} when not evaluated."""
        block = self.eval.get("heldout")
        return block if isinstance(block, dict) else {}

    @property
    def objective(self) -> str:
        """The registered objective (models/objectives/) the run trained, as it recorded it: "mlm",
        "clm", "rtd" (ELECTRA: its loss is the generator's MLM loss, a group of its own), "hybrid", ...;
        else (a run still training) from its config: ``train.objective`` on its architecture."""
        from cramlm.config.registry import config_class, names
        from cramlm.models.objectives.base import objective_name

        for where in (self.summary, self.heldout):
            if where.get("objective") in names("objective"):
                return str(where["objective"])
        arch = (self.config.get("arch") or {}).get("type")
        kind = config_class("model", arch).objective if arch in names("model") else "mlm"
        trained = (self.config.get("train") or {}).get("objective")
        return objective_name(kind, trained) if trained in names("objective") else kind

    @property
    def objective_config(self):
        """The objective's config class: what the report calls it (``title``, ``loss_title``)."""
        from cramlm.config.registry import config_class

        return config_class("objective", self.objective)

    @property
    def train_curve(self) -> tuple[str, str]:
        """(metrics key, words) of the train curve drawn on the held-out loss's axis: the objective's
        ``train_curve`` where the run logged it (ELECTRA: "mlm_loss", the generator's MLM, not the loss
        it minimises, which adds rtd_weight x the detector's BCE), else ("loss", the loss's words: a run
        from before its objective logged the curve draws what it minimised, and says so)."""
        cfg = self.objective_config
        return (cfg.train_curve, cfg.train_curve_title) if self.has(cfg.train_curve) else ("loss", self.train_loss_words)

    @property
    def train_curve_keys(self) -> tuple[str, ...]:
        """The train keys that decide what the drawn train curve measures (``train_curve_keys``; all of
        ``train_loss_keys`` when the run draws the loss it minimised)."""
        cfg = self.objective_config
        if self.has(cfg.train_curve) and cfg.train_curve_keys is not None:
            return cfg.train_curve_keys
        return cfg.train_loss_keys

    @property
    def train_loss_words(self) -> str:
        """'generator MLM + 50 x detector BCE': the loss the run minimised in words, where it is not
        one task's loss (its objective's ``train_loss``; a value the words cannot take, such as one changed
        on a resume, stays its key's name: 'generator MLM + rtd_weight x detector BCE'); "" for one task's."""
        form = self.objective_config.train_loss
        if form == "train":
            return ""
        form = form.removeprefix("train: ")
        try:
            return form.format(**{k.split(".")[-1]: v for k, v in self.train_task.items()})
        except (KeyError, ValueError, TypeError):  # a value the words cannot take (changed on a resume, hand-edited):
            return re.sub(r"\{(\w+)(:[^}]*)?\}", r"\1", form)  # the key's name ("rtd_weight x detector BCE")

    @cached_property
    def train_task(self) -> dict[str, Any]:
        """What the run's train loss measures: its objective's ``train_loss_keys`` (``mlm_probability``,
        ``rtd.rtd_weight``, a plugin's ``objective_options.mask_rate``) with their values from its config,
        else the defaults (the objective's config class for its own options, the train group's for the rest).
        A value changed on a resume (``--allow-change``; config-history.jsonl) reads "0.15 → 0.4 at step
        1,200". Two runs of one objective whose train tasks differ have train losses that do not compare."""
        keys = self.objective_config.train_loss_keys
        segments: list[tuple[Any, dict]] = []
        for line in self.history:  # a line at step s replaces the lines from s on (a resume from an older checkpoint)
            step = line.get("step")
            if isinstance(line.get("config"), dict) and is_number(step) and step >= 0:  # (a hand-edited step: no line)
                segments = [(s, c) for s, c in segments if s < step] + [(step, line["config"])]
        tasks = [(step, self._train_task_of(config, keys)) for step, config in segments]
        now = self._train_task_of(self.config, keys)
        if not tasks or (self.config and any(not same_value(tasks[-1][1][k], now[k]) for k in keys)):
            tasks = [(0, now)]  # none, or config.yaml (the latest segment's) disagrees: a history that does not say when
        out = {}
        for key in keys:
            first = last = tasks[0][1][key]
            words = [_words(first)]
            for step, task in tasks[1:]:
                if not same_value(task[key], last):
                    last = task[key]
                    words.append(f"{_words(last)} at step {int(step):,}" if is_number(step) else _words(last))
            out[key] = first if len(words) == 1 else " → ".join(words)
        return out

    def _train_task_of(self, config: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
        """``keys``' values in one config (a segment's), defaults where it leaves them out."""
        from cramlm.train.config import TrainConfig

        out, train, options, defaults = {}, config.get("train"), self.objective_config, None
        for key in keys:
            value: Any = train if isinstance(train, dict) else {}
            for part in key.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            head, _, name = key.rpartition(".")
            if value is None and head and name in options.model_fields:
                value = options.model_fields[name].get_default(call_default_factory=True)
            elif value is None:
                value = defaults = defaults or TrainConfig()
                for part in key.split("."):
                    value = getattr(value, part, None)
            out[key] = value
        return out

    @property
    def tokenizer(self) -> str | None:
        """Which tokenizer the run used, in words (None when nothing says)."""
        for where in (self.summary, self.heldout):
            if isinstance(where.get("tokenizer"), str) and where["tokenizer"]:
                return where["tokenizer"]
        data = self.config.get("data")
        if isinstance(data, dict) and isinstance(data.get("tokenizer"), dict):
            from cramlm.data.tokenizer import tokenizer_label

            return tokenizer_label(data)
        return None

    def along(self) -> list[Evaluated]:
        """The run's checkpoints evaluated, in step order, then its end: what it had learned along the way
        (the compute from each results file's ``trained``, else the log's at that step). [] when no
        checkpoint was evaluated."""
        if not self.checkpoint_evals:
            return []
        points = []
        for step, data in [*self.checkpoint_evals, *([(None, self.eval)] if self.eval else [])]:
            heldout, pairs, results = data.get("heldout"), _pairs(data), _results(data)
            done = data.get("trained") if isinstance(data.get("trained"), dict) else {}  # (older results: the log's tokens)
            if data is self.eval:  # the step its weights had (an eval.json from before a resume is not the end's)
                step = done.get("steps") if _positive(done.get("steps")) else self.summary.get("steps")
            tokens, flops = (done.get(k) if _positive(done.get(k)) else self.at_step(k, step) if is_number(step) else None
                             for k in ("tokens", "flops"))
            head = pairs["scores"][pairs["headline"]]["accuracy"] if pairs else None
            scores = percent_scores(results)
            points.append(Evaluated(
                int(step) if is_number(step) else None,
                "eval.json" if data is self.eval else f"eval-step-{step:08d}.json", tokens, flops,
                heldout["loss"] if isinstance(heldout, dict) and is_number(heldout.get("loss")) else None,
                100 * head if is_number(head) else None, pairs.get("headline") if pairs else None,
                sum(scores) / len(scores) if scores else None, pairs, results))
        return points

    @property
    def pairs(self) -> dict[str, Any]:
        """eval.json's zero-shot minimal pairs (eval/pairs.py), {} when not scored."""
        return _pairs(self.eval)

    @property
    def untrained_pairs(self) -> dict[str, Any]:
        """The untrained twin's minimal pairs, {} when not scored."""
        return _pairs(self.eval_untrained)

    @property
    def pairs_skipped(self) -> str | None:
        """Why the minimal pairs were not scored (eval.json's recorded refusal), None when they were or
        were not asked for."""
        return _skipped(self.eval)

    @property
    def untrained_pairs_skipped(self) -> str | None:
        """Why the untrained twin's minimal pairs were not scored, None when they were or were not asked for."""
        return _skipped(self.eval_untrained)

    @property
    def eval_results(self) -> list[dict[str, Any]]:
        return _results(self.eval)

    @property
    def untrained_results(self) -> list[dict[str, Any]]:
        return _results(self.eval_untrained)

    def untrained_score(self, task: Any) -> float | None:
        """The untrained twin's headline score on ``task`` (None where it was not evaluated, or
        fine-tuned by another protocol than the run: eval/tables.py's ``same_protocol``)."""
        from cramlm.eval.tables import same_protocol

        r = next((r for r in self.untrained_results if r.get("task") == task), None)
        mine = next((r for r in self.eval_results if r.get("task") == task), None)
        if r is None or (mine is not None and not same_protocol(mine, r)):
            return None
        return result_score(r)


def _positive(value: Any) -> bool:
    return is_number(value) and value > 0


def _pairs(data: dict[str, Any]) -> dict[str, Any]:
    block = data.get("minimal_pairs")
    ok = (isinstance(block, dict) and isinstance(block.get("scores"), dict) and isinstance(block.get("headline"), str)
          and block["headline"] in block["scores"])
    return block if ok else {}


def check_pairs(data: dict[str, Any], path: Path) -> None:
    """A zero-shot headline record the tables cannot read (a damaged or hand-made eval.json) is an error
    naming the file and key, not a traceback."""
    raw = data.get("minimal_pairs")
    if isinstance(raw, dict) and "headline" in raw and not isinstance(raw["headline"], str):
        raise ValueError(f"{path}: minimal_pairs.headline is {raw['headline']!r}, not a scorer's name: the file is damaged "
                         "(evaluate the checkpoint again)")
    block = _pairs(data)
    if not block:
        return
    rec, where = block["scores"][block["headline"]], f"{path}: minimal_pairs.scores.{block['headline']}"
    if not isinstance(rec, dict):
        raise ValueError(f"{where} is not a record (accuracy, tie_rate, phenomena, paradigms): the file is damaged")
    wrong = [k for k in ("accuracy", "tie_rate") if not is_number(rec.get(k))]
    wrong += [k for k in ("phenomena", "paradigms") if not isinstance(rec.get(k), dict) or not rec[k]]
    if not wrong:
        wrong = [f"paradigms.{name}" for name, r in rec["paradigms"].items() if not isinstance(r, dict)
                 or not is_number(r.get("accuracy")) or not isinstance(r.get("pairs"), int) or r["pairs"] < 1]
    if wrong:
        raise ValueError(f"{where}: {', '.join(wrong[:3])} missing or not a number/record as cramlm writes it: the file is "
                         "damaged (evaluate the checkpoint again)")


def _skipped(data: dict[str, Any]) -> str | None:
    block = data.get("minimal_pairs")
    return str(block["skipped"]) if isinstance(block, dict) and block.get("skipped") and not _pairs(data) else None


def _results(data: dict[str, Any]) -> list[dict[str, Any]]:
    results = data.get("results", [])
    return [r for r in results if isinstance(r, dict)] if isinstance(results, list) else []


def percent_scores(results: list[dict[str, Any]]) -> list[float]:
    """The headline scores of task results that have one, in % (a correlation x 100 too)."""
    return [as_percent(str(r.get("metric", "")), s) for r in results if (s := result_score(r)) is not None]


def _interpolate(steps: list[float], values: list[float], step: Any) -> float | None:
    """``values`` at ``step`` by linear interpolation over sorted ``steps``; None outside them."""
    if not is_number(step) or not steps:
        return None
    at = float(np.interp(step, steps, values, left=math.nan, right=math.nan))
    return None if math.isnan(at) else at


def is_number(value: Any) -> bool:
    """A finite int or float, not a bool; an int past float's range (10**400 in a hand-edited file) is not one."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _read_text(path: Path) -> str:
    """A run file's text; bytes that are not UTF-8 (a damaged file) are an error naming the file."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at position {e.start}): "
                         "the file is damaged; cramlm writes it as UTF-8 JSON") from None


def _json(path: Path) -> dict[str, Any]:
    """A run's JSON file ({} where absent); one that is not a JSON object is an error naming it (cramlm
    writes them whole, through a rename: such a file was damaged after)."""
    try:
        data = json.loads(_read_text(path))
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg} at line {e.lineno}): the file is damaged") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a JSON {type(data).__name__}, not the object cramlm writes: the file is damaged")
    return data


def trained_past(summary: dict[str, Any], log: list[dict[str, Any]], current: list[dict[str, Any]]) -> bool:
    """Whether summary.json describes an earlier finish than the run as it stands (a finished run resumed
    with a larger budget, cut off or with its new summary not written): train lines after the log's last
    "finished" line (a resume at its own budget re-validates but trains no step), or that line at another
    step than the summary's; a log from before those lines: a current train step past the summary's."""
    steps = summary.get("steps")
    finished = [i for i, m in enumerate(log) if m.get("kind") == "finished"]
    if finished:
        last = log[finished[-1]]
        return (any(m.get("kind", "train") == "train" for m in log[finished[-1] + 1:])
                or (is_number(last.get("step")) and is_number(steps) and last["step"] != steps))
    trained = [m["step"] for m in current if m.get("kind", "train") == "train" and is_number(m.get("step"))]
    return is_number(steps) and bool(trained) and max(trained) > steps


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Metric lines; a torn last line (a run killed mid-write) is ignored."""
    if not path.is_file():
        return []
    lines = []
    for line in _read_text(path).splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            lines.append(record)
    return lines


SECTIONS = ("arch", "data", "train", "impl", "eval", "train.optim", "train.budget", "train.rtd", "train.hybrid", "data.tokenizer")


def check_sections(config: dict[str, Any], path: Path) -> None:
    """A run's config.yaml whose groups are not mappings (``arch: 5``: hand-edited) is an error naming the key."""
    for key in SECTIONS:
        value: Any = config
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"{path}: {key} is {value!r}, not a mapping of its settings: the file is damaged")


def load_run_data(folder: str | Path) -> RunData:
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such run folder")
    if not any((folder / f).is_file() for f in ("metrics.jsonl", "summary.json", "eval.json")):
        raise FileNotFoundError(f"{folder}: not a cramlm run (no metrics.jsonl, summary.json or eval.json)")
    config: dict[str, Any] = {}
    if (folder / "config.yaml").is_file():
        from cramlm.config.loader import safe_load_text

        loaded = safe_load_text(_read_text(folder / "config.yaml"), str(folder / "config.yaml"))
        config = loaded if isinstance(loaded, dict) else {}
        check_sections(config, folder / "config.yaml")
    log = read_metrics(folder / "metrics.jsonl")
    summary, metrics = _json(folder / "summary.json"), current_lines(log)
    stale = summary if summary and trained_past(summary, log, metrics) else {}
    run = RunData(
        folder=folder,
        name=str(config.get("name") or folder.name),
        config=config,
        metrics=metrics,
        log=log,
        summary={} if stale else summary,
        stale_summary=stale,
        eval=_json(folder / "eval.json"),
        eval_untrained=_json(folder / "eval-untrained.json"),
        pipeline=_json(folder / "pipeline.json"),
        history=read_metrics(folder / "config-history.jsonl"),  # JSON lines, a torn one ignored, as metrics'
    )
    check_pairs(run.eval, folder / "eval.json")
    check_pairs(run.eval_untrained, folder / "eval-untrained.json")
    for path in folder.glob("eval-step-*.json"):
        if (step := path.stem[len("eval-step-"):]).isdigit() and (data := _json(path)):
            check_pairs(data, path)
            run.checkpoint_evals.append((int(step), data))
    run.checkpoint_evals.sort(key=lambda e: e[0])
    return run


def result_score(result: dict[str, Any]) -> float | None:
    """The headline score of one task result (``score``, else ``median``), as eval.json holds it."""
    for key in ("score", "median", "mean"):
        if is_number(result.get(key)):
            return float(result[key])
    return None


def as_percent(metric: str, value: float) -> float:
    """Scores shown as percentages, like cramming's tables (errors and losses stay as they are)."""
    return value if any(word in metric.lower() for word in ("mse", "loss", "perplexity")) else 100 * value


def loss_groups(runs: list[RunData]) -> dict[tuple[str, str | None], list[RunData]]:
    """Runs by (objective, tokenizer): losses in nats per token compare only within a group."""
    groups: dict[tuple[str, str | None], list[RunData]] = {}
    for run in runs:
        groups.setdefault((run.objective, run.tokenizer), []).append(run)
    return groups


def same_value(a: Any, b: Any) -> bool:
    """Equal as settings: numbers by value (a plugin's options are stored as written: 1 and 1.0 are one rate)."""
    return float(a) == float(b) if is_number(a) and is_number(b) else a == b


def _words(value: Any) -> str:
    return f"{value:g}" if is_number(value) else str(value)


def train_task_differences(members: list[RunData], curve: bool = False) -> list[str]:
    """The train-task keys (``RunData.train_task``) whose values differ among runs of one loss group:
    their train losses measure different tasks (their held-out losses still compare). ``curve``: only
    the keys that decide a run's drawn train curve (``RunData.train_curve_keys``: ELECTRA's generator
    MLM does not depend on rtd_weight)."""
    tasks = [run.train_task for run in members]
    keys = dict.fromkeys(k for run in members for k in (run.train_curve_keys if curve else run.train_task))
    return [key for key in keys
            if any(not same_value(t.get(key), tasks[0].get(key)) for t in tasks[1:])]


def train_task_words(run: RunData, keys: list[str]) -> str:
    """'mlm_probability 0.4, rtd.rtd_weight 50': the run's values of ``keys``."""
    task = run.train_task
    return ", ".join(f"{key} {_words(task.get(key))}" for key in keys)
