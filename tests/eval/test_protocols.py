"""Protocol presets resolve to exactly the published settings; per-task overrides parse."""

from __future__ import annotations

import sys

import pytest

from cramlm.cli.common import resolve_or_exit
from cramlm.eval.glue import GLUE, GLUE_SANE
from cramlm.eval.tasks import TaskError, load_task


def test_glue_sane_is_crammings():
    cfg = resolve_or_exit("eval", ["eval=glue-sane"]).eval
    assert cfg.tasks == [f"glue:{t}" for t in GLUE_SANE] and "glue:wnli" not in cfg.tasks
    assert (cfg.lr, cfg.betas, cfg.eps, cfg.weight_decay) == (4e-5, (0.9, 0.98), 1e-6, 0.0)
    assert (cfg.batch_size, cfg.epochs, cfg.schedule, cfg.warmup, cfg.max_seq_length) == (16, 5, "cosine", 0.1, 128)
    assert cfg.seeds == 5


def test_full_glue_protocol():
    cfg = resolve_or_exit("eval", ["eval=glue"]).eval
    assert (cfg.lr, cfg.weight_decay, cfg.batch_size, cfg.epochs, cfg.schedule, cfg.warmup) == (2e-5, 0.1, 32, 10, "linear", 0.06)


def test_overrides_per_task_and_inline_tasks():
    cfg = resolve_or_exit(
        "eval", ["eval=glue-sane", "eval.overrides.rte.lr=2e-5", "eval.overrides.rte.epochs=10", "eval.glue_dir=hf",
                 "eval.tasks=[glue:rte, {path: my/task, metric: f1}]"], check_extras=False,  # datasets may be missing
    ).eval
    assert cfg.for_task("rte").lr == 2e-5 and cfg.for_task("rte").epochs == 10 and cfg.for_task("cola").lr == 4e-5
    assert cfg.glue_dir == "hf" and cfg.tasks[1].path == "my/task" and cfg.tasks[1].metrics == ["f1"]


def test_hf_glue_needs_datasets(monkeypatch):
    assert set(GLUE) == {"cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"}
    assert GLUE["mnli"].hf_dev == {"m": "validation_matched", "mm": "validation_mismatched"}
    monkeypatch.setitem(sys.modules, "datasets", None)  # absent, installed or not (the test extra has it, through lm-eval)
    with pytest.raises(TaskError, match="needs the `datasets` package"):
        load_task("glue:cola", "hf")
