"""benchmarks/recipe_vs_cramming.py: its commands (shared overrides reach every run) and where its
summary finds the untrained twin."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import recipe_vs_cramming as rvc  # noqa: E402


def test_shared_overrides_reach_every_run(tmp_path):
    plan = rvc.commands(tmp_path, "null", True, "/d", ["rtd", "train.objective=rtd"], ["train.budget.flops=2.5e14"])
    cmds = plan["pretrain"] + plan["eval"]
    assert len(cmds) == 5
    for cmd in cmds:
        assert "train.budget.flops=2.5e14" in cmd and "budget=null" in cmd and "impl.threads=1" in cmd
    # the contender's own overrides only on its runs
    assert ["train.objective=rtd" in c for c in cmds] == [False, True, False, True, True]


def _eval(path: Path, score: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"mean": {"last": {"arithmetic": score}}, "heldout": None, "results": [
        {"task": "t", "metric": "accuracy", "majority": 0.5, "score": score,
         "seeds": [{"last": {"accuracy": score}}]}]}))


def test_twin_read_from_the_recipe_when_the_other_run_has_none(tmp_path):
    _eval(tmp_path / "recipe" / "eval.json", 0.8)
    _eval(tmp_path / "rtd" / "eval.json", 0.7)
    _eval(tmp_path / "recipe" / "eval-untrained.json", 0.6)
    result = rvc.summarize(tmp_path, "rtd")
    assert result["means"] == {"recipe": 0.8, "rtd": 0.7, "untrained twin": 0.6}
    _eval(tmp_path / "rtd" / "eval-untrained.json", 0.55)  # the other contender's twin comes first
    assert rvc.summarize(tmp_path, "rtd")["means"]["untrained twin"] == 0.55
    assert "recipe - twin" in rvc.table(result) and "+20.0" in rvc.table(result)


def test_an_rtd_runs_common_split_loss_is_marked_as_its_generators():
    """The RTD run's held-out MLM loss is its (smaller) generator's: the table says so in the cell."""
    result = {"against": "rtd", "tasks": {}, "means": {}, "lm": {}, "runs": {
        "recipe": {"common_split": {"loss": 2.873, "objective": "mlm"}},
        "rtd": {"common_split": {"loss": 3.834, "objective": "rtd"}}}}
    row = next(line for line in rvc.table(result).splitlines() if "run_heldout" in line)
    assert "| 2.873 | 3.834 (its generator) |" in row
