"""Labelled tasks: custom tasks from TSV / CSV / JSONL files, and GLUE (see :mod:`cramlm.eval.glue`).

A custom task is a folder with ``train.<ext>`` and ``dev.<ext>`` and an optional ``task.json``,
or the same keys given inline in the config (``eval.tasks=[{path: my/task, metric: f1}]``)::

    {"name": "spam", "format": "tsv", "columns": {"sentence1": "sentence", "sentence2": null,
     "label": "label"}, "labels": ["0", "1"], "metric": "f1"}

Columns are header names, or 0-based indices for files without a header (``"header": false``).
Without ``labels`` the sorted distinct training labels are used; a regression metric (pearson,
spearman) makes the task a regression. ``metric`` may be a list: the first is the headline metric,
the others are reported beside it (MRPC: [f1, accuracy]). Every error names the file and line, and
shows at most a few values of a file (:func:`few`).

File names in ``task.json`` (``train``, ``dev``) are relative to the task folder and must stay
inside it: an absolute path or one that climbs out with ``..`` is refused, so a task folder from
elsewhere cannot make cramlm read (and print) other files. To use a file from elsewhere, copy or
symlink it into the folder. A symlink is followed, but an error about a file that is a symlink to
another folder shows none of its content (no header fields, no label values; only the columns
and labels the task itself declares, the line number and the field count): a task folder from
elsewhere cannot make cramlm print a file it links to.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

from pydantic import Field, ValidationError, field_validator, model_serializer

from cramlm.config.base import Config
from cramlm.eval.metrics import METRICS, REGRESSION_METRICS
from cramlm.io import did_you_mean, package_path

FORMATS = ("tsv", "csv", "jsonl")
INFO_KEYS = {"num_train", "num_dev", "source", "licence", "license", "canary", "description", "citation"}


class TaskError(ValueError):
    """A task folder or file is missing or malformed; the message names the file and line."""


@dataclass
class Example:
    text_a: str
    text_b: str | None
    label: int | float


@dataclass
class Task:
    name: str
    labels: list[str]  # empty for regression
    metrics: list[str]  # metrics[0] is the headline metric
    train: list[Example]
    dev: dict[str, list[Example]]  # split name -> examples (MNLI: matched and mismatched)
    skipped: dict[str, int] = field(default_factory=dict)  # file -> malformed rows skipped
    notes: list[str] = field(default_factory=list)  # how files were read, when it was guessed (also printed)

    @property
    def metric(self) -> str:
        return self.metrics[0]

    @property
    def is_regression(self) -> bool:
        return not self.labels

    @property
    def num_outputs(self) -> int:
        return len(self.labels) or 1


SAMPLE_SEED = 0  # eval.max_train_examples / max_dev_examples: one sample for every model and seed


def hold_out(examples: list[Example], fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    """(the rest, a held-out share of ``fraction``): drawn with ``seed``, each kept in file order."""
    import numpy as np

    order = np.random.default_rng(seed).permutation(len(examples))
    n = round(fraction * len(examples))
    return [examples[i] for i in sorted(order[n:])], [examples[i] for i in sorted(order[:n])]


def sample(examples: list[Example], n: int | None) -> list[Example]:
    """At most ``n`` of ``examples``: a random sample drawn with the fixed SAMPLE_SEED (not
    ``eval.seed``), so every model and every fine-tuning seed sees the same rows, kept in file order
    (the first N of a file are often one genre or source: STS-B's dev file is captions, then forum,
    then news)."""
    if not n or len(examples) <= n:
        return examples
    import numpy as np

    keep = np.random.default_rng(SAMPLE_SEED).choice(len(examples), n, replace=False)
    return [examples[i] for i in sorted(keep)]


class Columns(Config):
    sentence1: str | int = Field(description="the first text's column: a header name, or a 0-based index (header: false)")
    sentence2: str | int | None = Field(None, description="the second text's column for sentence-pair tasks; null: single sentences")
    label: str | int = Field(description="the label's column: class names (classification) or numbers (regression)")


class TaskSpec(Config):
    """Where a task's files are and how to read them: the keys of ``task.json``."""

    path: str | None = Field(None, description="the task folder, for inline specs (task.json, if any, sits in it)")
    name: str | None = Field(None, description="the task's name in tables and eval.overrides; null: the folder name")
    format: Literal["tsv", "csv", "jsonl"] | None = Field(None, description="file format; null: from the file extension")
    train: str | None = Field(None, description="training file name in the folder; null: train.<ext>")
    dev: str | dict[str, str] | None = Field(
        None, description="dev file name, or {split: file} for several dev splits (MNLI's matched/mismatched); null: dev.<ext>")
    header: bool = Field(True, description="tsv/csv: the first row names the columns")
    columns: Columns = Field(Columns(sentence1="sentence", label="label"), description="which columns hold the texts and the label")
    labels: list[str] | None = Field(
        None, description="class names in id order (0..C-1); null: the sorted labels of the training file")
    metric: str | list[str] = Field(
        "accuracy", description="dev metric(s), the first one the headline: accuracy, f1, matthews, pearson, spearman")
    skip_malformed: bool = Field(
        False, description="skip rows with the wrong field count and count them (GLUE's QQP has some); false: an error naming the line")

    @field_validator("labels", mode="before")
    @classmethod
    def _labels_as_text(cls, value: Any) -> Any:
        return [str(v) for v in value] if isinstance(value, list) else value

    @model_serializer(mode="wrap")
    def _given_keys_only(self, handler) -> dict:
        """Only the keys given: an inline spec refines its folder's task.json with exactly those, and a
        config dumped and validated again (config.yaml, a pipeline's eval stage) must not turn the
        other keys' defaults into given keys that override the folder's."""
        return {k: v for k, v in handler(self).items() if k in self.model_fields_set}

    @property
    def metrics(self) -> list[str]:
        return [self.metric] if isinstance(self.metric, str) else list(self.metric)


def task_path(spec: str) -> Path:
    return package_path(spec)


def clip(value: Any, width: int = 60) -> str:
    """A value from a file, shortened for an error message."""
    text = str(value)
    return text if len(text) <= width else text[:width] + f"... ({len(text)} characters)"


def few(values: list, n: int = 5) -> str:
    """At most ``n`` values of a file for an error message, then how many more there are."""
    shown = "[" + ", ".join(repr(clip(v)) for v in values[:n]) + "]"
    return shown + (f" ... ({len(values) - n} more)" if len(values) > n else "")


def linked_elsewhere(path: Path) -> bool:
    """Whether ``path`` is a symlink to a file in another folder: its content stays out of errors."""
    try:
        return path.is_symlink() and Path(os.path.realpath(path)).parent != Path(os.path.realpath(path.parent))
    except OSError:
        return True


HIDDEN = "(not shown: the file is a symlink to another folder)"


def from_file(path: Path, text: str) -> str:
    """``text`` (values read from ``path``) for an error, or a note that it is not shown."""
    return HIDDEN if linked_elsewhere(path) else text


# ---------------------------------------------------------------- reading rows


def _lines(path: Path) -> list[str]:
    """The file's lines (gunzipped where its name ends in .gz)."""
    if not path.is_file():
        raise TaskError(f"{path}: file not found")
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        import gzip
        import zlib

        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError; a cut file an EOFError
            raise TaskError(f"{path}: not a complete gzip file ({str(e) or type(e).__name__})") from None
    try:
        text = data.decode("utf-8-sig")  # -sig: GLUE's MRPC files start with a BOM
    except UnicodeDecodeError as e:  # e.object: the bytes after any BOM, e.start indexing them
        line = e.object[: e.start].count(b"\n") + 1
        raise TaskError(f"{path}:{line}: not UTF-8 text (byte {e.object[e.start]:#04x}: {e.reason})") from None
    return text.split("\n")


def _rows(path: Path, fmt: str, header: bool) -> tuple[list[str] | None, Iterator[tuple[int, Any]]]:
    """(header names or None, iterator of (line number, fields list or JSON object))."""
    lines = _lines(path)
    if fmt == "jsonl":

        def objects():
            for lineno, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise TaskError(f"{path}:{lineno}: invalid JSON: {e.msg}") from None
                if not isinstance(obj, dict):
                    raise TaskError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
                yield lineno, obj

        return None, objects()
    if fmt == "tsv":  # GLUE style: TAB-separated, no quoting
        rows = [(i, line.rstrip("\r").split("\t")) for i, line in enumerate(lines, 1) if line.strip()]
    else:
        reader = csv.reader(lines)
        rows = []
        try:
            for fields in reader:
                if fields and any(f.strip() for f in fields):
                    rows.append((reader.line_num, fields))
        except csv.Error as e:
            raise TaskError(f"{path}:{reader.line_num}: malformed CSV: {e}") from None
    if not header:
        return None, iter(rows)
    if not rows:
        raise TaskError(f"{path}: empty file, expected a header row")
    return rows[0][1], iter(rows[1:])


def _index(header: list[str] | None, column: str | int | None, path: Path, key: str) -> str | int | None:
    """A column as a field index (header files) or as-is (JSON keys, headerless indices)."""
    if column is None or isinstance(column, int) or header is None:
        return column
    if column not in header:
        shown = from_file(path, f"{few(header, 12)}.{did_you_mean(column, header)}")
        raise TaskError(f"{path}:1: columns.{key} '{column}' is not in the header ({len(header)} fields) {shown}")
    return header.index(column)


def _label_ok(value: str, labels: list[str] | None) -> bool:
    if labels:
        return value in labels
    try:
        float(value)
        return True
    except ValueError:
        return False


def _table(path: Path, spec: TaskSpec, fmt: str, layouts: list[list[str]] | None, notes: list[str] | None = None):
    """``_rows`` of a file; with ``layouts`` (the known column names of a format, e.g. GLUE's) a
    first row that is not a header is recognised from its field count and its label, and the
    file is read as headerless in that layout (noted in ``notes`` and printed)."""
    header, rows = _rows(path, fmt, spec.header)
    if not layouts or header is None:
        return header, rows
    named = [c for c in (spec.columns.sentence1, spec.columns.sentence2, spec.columns.label) if isinstance(c, str)]
    if all(c in header for c in named):
        return header, rows
    for names in layouts:
        if len(names) == len(header) and spec.columns.label in names and all(c in names for c in named):
            if _label_ok(header[names.index(spec.columns.label)].strip(), spec.labels):
                note = f"{path}: no header row; read as headerless with the official columns {names}"
                if notes is not None and note not in notes:
                    notes.append(note)
                    print(f"cramlm: {note}", file=sys.stderr)
                first = (1, header)
                return names, iter([first, *rows])
    expected = " or ".join(str(len(names)) for names in layouts)
    raise TaskError(f"{path}:1: the first row is neither a header with the columns {few(named)} nor a data row of "
                    f"the official layout ({expected} fields, a valid label); it has {len(header)} fields {from_file(path, few(header))}")


def _field(row: Any, column: str | int, path: Path, lineno: int, key: str) -> str:
    try:
        value = row[column]
    except (IndexError, KeyError):
        raise TaskError(f"{path}:{lineno}: no field for columns.{key} ({column!r})") from None
    if isinstance(value, bool):
        return str(value).lower()
    return value if isinstance(value, str) else json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def read_examples(path: Path, spec: TaskSpec, fmt: str, labels: list[str], skipped: dict[str, int],
                  layouts: list[list[str]] | None = None, notes: list[str] | None = None) -> list[Example]:
    header, rows = _table(path, spec, fmt, layouts, notes)
    cols = spec.columns
    ia = _index(header, cols.sentence1, path, "sentence1")
    ib = _index(header, cols.sentence2, path, "sentence2")
    il = _index(header, cols.label, path, "label")
    width, by = (len(header), "the header") if header else (None, "the first row")  # without a header: the first row's
    index = {label: i for i, label in enumerate(labels)}
    out = []
    for lineno, row in rows:
        if width is None and fmt != "jsonl":
            width = len(row)
        if width is not None and len(row) != width:
            if spec.skip_malformed:
                skipped[str(path)] = skipped.get(str(path), 0) + 1
                continue
            raise TaskError(f"{path}:{lineno}: {len(row)} fields, {by} has {width}")
        raw = _field(row, il, path, lineno, "label")
        if labels:
            if raw not in index:
                raise TaskError(f"{path}:{lineno}: label {from_file(path, repr(clip(raw)))} is not one of {few(labels)}")
            label: int | float = index[raw]
        else:
            try:
                label = float(raw)
            except ValueError:
                raise TaskError(f"{path}:{lineno}: regression label {from_file(path, repr(clip(raw)))} is not a number") from None
        text_b = _field(row, ib, path, lineno, "sentence2") if ib is not None else None
        out.append(Example(_field(row, ia, path, lineno, "sentence1"), text_b, label))
    if not out:
        raise TaskError(f"{path}: no examples")
    return out


def _distinct_labels(path: Path, spec: TaskSpec, fmt: str, layouts: list[list[str]] | None = None) -> list[str]:
    """The labels of the rows ``read_examples`` keeps (with ``skip_malformed``, a row of another width
    is no example, and its fields no label)."""
    header, rows = _table(path, spec, fmt, layouts)
    il = _index(header, spec.columns.label, path, "label")
    width = len(header) if header else None
    labels = set()
    for lineno, row in rows:
        if width is None and fmt != "jsonl":
            width = len(row)
        if spec.skip_malformed and width is not None and len(row) != width:
            continue
        labels.add(_field(row, il, path, lineno, "label"))
    return sorted(labels)


# ---------------------------------------------------------------- specs -> tasks


def _inside(folder: Path, name: str, where: str, key: str) -> Path:
    """``folder / name``, refusing a name that leaves the folder (absolute, or climbing with ``..``)."""
    norm = os.path.normpath(name)
    if os.path.isabs(name) or norm == ".." or norm.startswith(".." + os.sep):
        raise TaskError(f"{where}: {key} '{clip(name)}' is outside the task folder {folder}; task files must be "
                        "inside it (copy or symlink the file into the folder)")
    return folder / norm


def _find_file(folder: Path, given: str | None, stem: str, fmt: str | None, where: str = "", key: str = "") -> Path:
    if given:
        return _inside(folder, given, where or str(folder), key or stem)
    for ext in [fmt] if fmt else FORMATS:
        for name in (f"{stem}.{ext}", f"{stem}.{ext}.gz"):  # gzipped files are read as they are
            if (folder / name).is_file():
                return folder / name
    tried = ", ".join(f"{stem}.{ext}" for ext in ([fmt] if fmt else FORMATS)) + " (or .gz)"
    raise TaskError(f"{folder}: no {stem} file (looked for {tried})")


def _format_of(path: Path, fmt: str | None) -> str:
    if fmt:
        return fmt
    ext = Path(path.name.removesuffix(".gz")).suffix.lstrip(".").lower()  # train.tsv.gz: tsv
    if ext not in FORMATS:
        raise TaskError(f"{path}: cannot tell the format from the extension; set \"format\" to one of {FORMATS}")
    return ext


def build_task(spec: TaskSpec, folder: Path, where: str, layouts: list[list[str]] | None = None) -> Task:
    """Read the files ``spec`` describes (inside ``folder``); ``where`` names the spec in errors.
    ``layouts``: column names of headerless variants of the files (see :func:`_table`)."""
    metrics = spec.metrics
    for m in metrics:
        if m not in METRICS:
            raise TaskError(f"{where}: unknown metric '{m}'; known: {', '.join(METRICS)}")
    regression = metrics[0] in REGRESSION_METRICS
    if regression and (other := [m for m in metrics if m not in REGRESSION_METRICS]):  # refused now, not after training
        raise TaskError(f"{where}: metric {other[0]} needs classes, but {metrics[0]} (the first) makes this a regression task")
    if not regression and (other := [m for m in metrics if m in REGRESSION_METRICS]):
        raise TaskError(f"{where}: metric {other[0]} needs a regression task, but {metrics[0]} (the first) makes this a classification task")
    train_path = _find_file(folder, spec.train, "train", spec.format, where, "train")
    fmt = _format_of(train_path, spec.format)
    dev_files = spec.dev if isinstance(spec.dev, dict) else {"dev": spec.dev}
    dev_paths = {split: _find_file(folder, f, "dev", fmt, where, "dev" if split == "dev" and not isinstance(spec.dev, dict)
                                   else f"dev.{split}") for split, f in dev_files.items()}
    if regression:
        labels: list[str] = []
    else:
        labels = spec.labels if spec.labels is not None else _distinct_labels(train_path, spec, fmt, layouts)
        if len(labels) < 2:
            got = f"{few(labels)}" if spec.labels is not None else f"in {train_path}: {from_file(train_path, few(labels))}"
            raise TaskError(f"{where}: a classification task needs at least two labels, got {len(labels)} {got}")
        if "f1" in metrics and len(labels) > 2:
            raise TaskError(f"{where}: metric f1 is binary F1 (the second label positive), but the task has {len(labels)} "
                            "labels: use accuracy or matthews")
    skipped: dict[str, int] = {}
    notes: list[str] = []
    return Task(
        name=spec.name or folder.name,
        labels=labels,
        metrics=metrics,
        train=read_examples(train_path, spec, fmt, labels, skipped, layouts, notes),
        dev={split: read_examples(p, spec, _format_of(p, spec.format), labels, skipped, layouts, notes)
             for split, p in dev_paths.items()},
        skipped=skipped,
        notes=notes,
    )


def parse_spec(data: dict, where: str) -> TaskSpec:
    data = {k: v for k, v in data.items() if k not in INFO_KEYS}
    try:
        return TaskSpec.model_validate(data)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            path = ".".join(str(p) for p in e["loc"])
            if e["type"] == "extra_forbidden":
                problems.append(f"{path}: unknown key." + did_you_mean(e["loc"][-1], TaskSpec.model_fields))
            else:
                problems.append(f"{path}: {e['msg']}")
        raise TaskError(f"{where}: " + "; ".join(problems)) from None


def read_task_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise TaskError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None
    if not isinstance(data, dict):
        raise TaskError(f"{path}: expected a JSON object")
    return data


# "<prefix>:<name>" task loaders, (name, glue_dir) -> Task, registered by the modules built on this one
# (eval/glue.py: "glue"; eval/__init__.py imports it), so that this module imports none of them
PREFIXES: dict[str, Callable[[str, str | None], Task]] = {}


def load_tasks(specs: list, glue_dir: str | None = None) -> list[Task]:
    """Every task of ``specs``; if some cannot be loaded, one error naming each of them (so one bad
    folder is found together with the others, before any training)."""
    tasks, problems = [], []
    for spec in specs:
        try:
            tasks.append(load_task(spec, glue_dir))
        except TaskError as e:
            label = spec if isinstance(spec, str) else f"task {spec.get('path') if isinstance(spec, dict) else spec.path}"
            message = str(e)
            problems.append(message if message.startswith(label) else f"{label}: {message}")
    if len(problems) == 1:
        raise TaskError(problems[0])
    if problems:
        raise TaskError(f"{len(problems)} of {len(specs)} tasks cannot be loaded:\n  " + "\n  ".join(problems))
    return tasks


def load_task(spec: str | TaskSpec | dict, glue_dir: str | None = None) -> Task:
    """A task from ``glue:<name>``, a folder (with or without task.json), a task.json path, a
    ``pkg://`` shipped folder, or an inline spec (a dict / TaskSpec with ``path``)."""
    if isinstance(spec, str) and spec.partition(":")[0] in PREFIXES:
        prefix, _, name = spec.partition(":")
        return PREFIXES[prefix](name, glue_dir)
    if isinstance(spec, (dict, TaskSpec)):
        inline = spec if isinstance(spec, TaskSpec) else parse_spec(spec, "inline task spec")
        if not inline.path:
            raise TaskError("inline task spec: 'path' (the task folder) is required")
        folder = task_path(inline.path)
        meta = folder / "task.json"
        if meta.is_file():  # inline keys refine the folder's task.json
            given = inline.model_dump(exclude_unset=True)
            inline = parse_spec({**read_task_json(meta), **given}, f"{meta} + inline keys")
        if not folder.is_dir():
            raise TaskError(f"{inline.path}: no such task folder")
        return build_task(inline, folder, f"task {inline.path}")
    path = task_path(spec)
    if path.is_file() and path.name.endswith(".json"):
        folder, meta = path.parent, path
    else:
        folder, meta = path, path / "task.json"
    if not folder.is_dir():
        raise TaskError(f"{spec}: no such task folder")
    if meta.is_file():
        return build_task(parse_spec(read_task_json(meta), str(meta)), folder, str(meta))
    # no task.json: GLUE-style names in the header (sentence | sentence1 + sentence2, label)
    train = _find_file(folder, None, "train", None)
    fmt = _format_of(train, None)
    header, rows = _rows(train, fmt, True)
    if header is None:  # jsonl: look at the first object's keys
        header = list(next(rows, (0, {}))[1])
    single = "sentence" in header
    columns = Columns(
        sentence1="sentence" if single else "sentence1", sentence2=None if single else "sentence2", label="label"
    )
    return build_task(TaskSpec(columns=columns), folder, str(folder))
