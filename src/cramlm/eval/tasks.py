"""Labelled tasks from a folder in GLUE style: ``train.tsv``, ``dev.tsv`` and an optional
``task.json`` ({"name", "columns": {"sentence1", "sentence2", "label"}, "labels", "metric"}).

Without ``task.json`` the columns are found by name in the header (``sentence`` or ``sentence1``
and ``sentence2``, ``label``), labels are the sorted distinct training labels and the metric is
accuracy. Fields are TAB-separated with no quoting.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from cramlm.eval.metrics import METRICS, REGRESSION_METRICS


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
    metric: str
    train: list[Example]
    dev: list[Example]

    @property
    def is_regression(self) -> bool:
        return not self.labels

    @property
    def num_outputs(self) -> int:
        return len(self.labels) or 1


def task_path(spec: str) -> Path:
    if spec.startswith("pkg://"):
        return Path(str(resources.files("cramlm") / "resources" / spec[len("pkg://") :]))
    return Path(spec).expanduser()


def _read_tsv(path: Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    if not path.is_file():
        raise TaskError(f"{path}: file not found")
    lines = path.read_text(encoding="utf-8").split("\n")
    if not lines or not lines[0].strip():
        raise TaskError(f"{path}: empty file, expected a header row")
    header = lines[0].rstrip("\r").split("\t")
    rows = [(i, line.rstrip("\r").split("\t")) for i, line in enumerate(lines[1:], 2) if line.strip()]
    return header, rows


def _column(header: list[str], name: str | None, path: Path) -> int | None:
    if name is None:
        return None
    if name not in header:
        raise TaskError(f"{path}: no column '{name}' in header {header}")
    return header.index(name)


def _examples(path: Path, columns: dict, labels: list[str]) -> list[Example]:
    header, rows = _read_tsv(path)
    ia = _column(header, columns["sentence1"], path)
    ib = _column(header, columns.get("sentence2"), path)
    il = _column(header, columns["label"], path)
    index = {label: i for i, label in enumerate(labels)}
    out = []
    for lineno, fields in rows:
        if len(fields) != len(header):
            raise TaskError(f"{path}:{lineno}: {len(fields)} fields, header has {len(header)}")
        raw = fields[il]
        if labels:
            if raw not in index:
                raise TaskError(f"{path}:{lineno}: label '{raw}' is not one of {labels}")
            label: int | float = index[raw]
        else:
            try:
                label = float(raw)
            except ValueError:
                raise TaskError(f"{path}:{lineno}: regression label '{raw}' is not a number") from None
        out.append(Example(fields[ia], fields[ib] if ib is not None else None, label))
    if not out:
        raise TaskError(f"{path}: no examples")
    return out


def load_task(spec: str) -> Task:
    folder = task_path(spec)
    if not folder.is_dir():
        raise TaskError(f"{spec}: no such task folder")
    meta_path = folder / "task.json"
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise TaskError(f"{meta_path}: invalid JSON: {e}") from None
    else:
        header, rows = _read_tsv(folder / "train.tsv")
        single = "sentence" in header
        meta = {
            "columns": {
                "sentence1": "sentence" if single else "sentence1",
                "sentence2": None if single else "sentence2",
                "label": "label",
            },
            "labels": sorted({r[header.index("label")] for _, r in rows}) if "label" in header else [],
            "metric": "accuracy",
        }
    metric = meta.get("metric", "accuracy")
    if metric not in METRICS:
        raise TaskError(f"{meta_path}: unknown metric '{metric}'; known: {', '.join(METRICS)}")
    labels = [] if metric in REGRESSION_METRICS else [str(x) for x in meta.get("labels") or []]
    if metric not in REGRESSION_METRICS and len(labels) < 2:
        raise TaskError(f"{meta_path}: a classification task needs at least two labels")
    columns = meta.get("columns") or {}
    for key in ("sentence1", "label"):
        if not columns.get(key):
            raise TaskError(f"{meta_path}: columns.{key} is missing")
    return Task(
        name=meta.get("name", folder.name),
        labels=labels,
        metric=metric,
        train=_examples(folder / "train.tsv", columns, labels),
        dev=_examples(folder / "dev.tsv", columns, labels),
    )
