"""End to end through the real `cramlm` command line, in a temporary directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import TINY_PRETRAIN

from cramlm.run.build import load_run


def cramlm_command() -> list[str]:
    # the console script of the environment running the tests (it may not be on PATH)
    exe = shutil.which("cramlm", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "cramlm"]


def cramlm(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([*cramlm_command(), *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def test_pretrain_then_eval_through_cli(tmp_path):
    # a step budget: what it learns does not depend on the machine's load (a 15 s budget got 9 steps once)
    steps = 40
    cramlm("pretrain", *TINY_PRETRAIN, "budget=null", f"train.budget.steps={steps}", "name=e2e", "train.optim.lr=1e-2",
           cwd=tmp_path)
    run = tmp_path / "outputs" / "e2e"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["last_loss"] < summary["first_loss"] - 0.3, summary  # it learned (ln 512 = 6.24 at start; 5.7 at 30 steps)
    assert summary["steps"] == steps and summary["tokens"] == steps * 8 * 32, summary  # stopped at the budget
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train_lines = [x for x in lines if x.get("kind", "train") == "train"]
    assert train_lines[-1]["step"] == summary["steps"] and train_lines[-1]["tokens"] == summary["tokens"]
    model, tok, cfg = load_run(run)
    assert cfg.name == "e2e" and tok.token_to_id("[MASK]") == 4
    assert model.tokens.weight.shape[0] == tok.get_vocab_size()

    proc = cramlm("eval", "name=e2e", "eval.epochs=1", "eval.max_train_examples=64", "eval.max_seq_length=32",
                  "impl.progress=false", cwd=tmp_path)
    assert any(line.split()[:2] == ["rotten_tomatoes_small", "accuracy"] for line in proc.stdout.splitlines()), proc.stdout
    result = json.loads((run / "eval.json").read_text())["results"][0]
    assert result["dev_examples"] == 500 and 0.0 <= result["score"] <= 1.0


def test_dryrun_prepares_data_and_takes_a_few_steps(tmp_path):
    cramlm("pretrain", *TINY_PRETRAIN, "dryrun=true", "impl.dryrun_steps=3", cwd=tmp_path)
    summary = json.loads((tmp_path / "outputs" / "default" / "summary.json").read_text())
    assert summary["steps"] == 3
    cache = Path(os.environ["CRAMLM_CACHE"]) / "data"  # the per-user cache (a temporary one in tests)
    manifest = json.loads(next(cache.glob("*/manifest.json")).read_text())
    docs = manifest["documents"]
    assert docs["read"] == docs["packed"] + docs["skipped"] == 20
    assert not (tmp_path / "outputs" / "data").exists()
    # a second run, from another folder, reuses the prepared data (same config -> same folder, nothing new)
    (tmp_path / "elsewhere").mkdir()
    cramlm("pretrain", *TINY_PRETRAIN, "dryrun=true", "name=again", cwd=tmp_path / "elsewhere")
    assert len(list(cache.iterdir())) == 1 and not (tmp_path / "elsewhere" / "outputs" / "data").exists()


def test_bad_override_fails_before_any_work(tmp_path):
    proc = subprocess.run([*cramlm_command(), "pretrain", "train.optim.lrr=1"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode != 0 and "train.optim.lrr: unknown key" in proc.stderr
    assert not (tmp_path / "outputs").exists()
