"""``cramlm eval``: fine-tune a pretrained run on each task and report dev scores.

Results go to ``<run>/eval.json`` and are printed as a table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cramlm.config.base import Config
from cramlm.eval.finetune import EvalConfig, finetune
from cramlm.eval.tasks import load_task
from cramlm.pretrain import load_run
from cramlm.train.checkpoint import write_json
from cramlm.train.runtime import ImplConfig, setup_device

DEFAULTS: dict[str, Any] = {"eval": "default", "impl": "default"}


class EvalRunConfig(Config):
    name: str = "default"  # the run to evaluate: <base_dir>/<name>
    base_dir: str = "outputs"
    checkpoint: str | None = None  # a run folder path; overrides name/base_dir
    plugins: list[str] = []
    eval: EvalConfig = EvalConfig()
    impl: ImplConfig = ImplConfig()

    @property
    def run_dir(self) -> Path:
        return Path(self.checkpoint) if self.checkpoint else Path(self.base_dir) / self.name


def evaluate(cfg: EvalRunConfig) -> list[dict]:
    tasks = [load_task(spec) for spec in cfg.eval.tasks]  # fail on a bad task before any training
    device = setup_device(cfg.impl)
    model, tok, _ = load_run(cfg.run_dir, device)
    results = [finetune(model, tok, task, cfg.eval, cfg.impl, device) for task in tasks]
    write_json(cfg.run_dir / "eval.json", {"config": cfg.eval.model_dump(mode="json"), "results": results})
    print(f"\n| task | metric | dev (last epoch) | best epoch |\n|---|---|---:|---:|")
    for r in results:
        print(f"| {r['task']} | {r['metric']} | {100 * r['score']:.2f} | {100 * r['best']:.2f} |")
    print(json.dumps(results))
    return results
