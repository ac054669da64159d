"""benchmarks/plan_grid.py's verdict: the planner's pick against the grid's held-out losses."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import plan_grid  # noqa: E402


def test_the_picks_are_judged_against_the_grids_best(tmp_path):
    """The planner's own pick (read off its table) and the law's pick given the runs' measured
    tokens/s are each put against the best held-out loss of the grid, with the 2% target."""
    points = []
    for size, tokens, seconds, loss in [("128x4", 9e6, 900, 4.60), ("256x4", 5e6, 900, 4.40), ("384x6", 1.8e6, 900, 4.52)]:
        run = tmp_path / "grid" / f"{size}-15m"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"train_seconds": seconds, "tokens": tokens}))
        points.append({"size": size, "budget": "15m", "run": str(run), "tokens": tokens, "loss": loss})
    (tmp_path / "grid" / "sweep.json").write_text(json.dumps({"points": points}))
    (tmp_path / "plan.txt").write_text("shape  params\n-----  ------\n384x6  12.00M  ...  4.581  <- chosen\n128x4  1.71M\n")
    (tmp_path / "settings.json").write_text(json.dumps({"recipe": "cpu-1h", "budget": "15m", "law": None, "sizes": ["128x4", "256x4", "384x6"],
                                                        "overrides": plan_grid.shared(type("A", (), {"extra": []}))}))
    result = plan_grid.main(["--summarize", str(tmp_path)])
    assert result["best"] == "256x4"
    own = result["picks"]["planner (its own throughput probe)"]
    assert own["size"] == "384x6" and own["vs_best"] == round(4.52 / 4.40 - 1, 4) and own["within_target"] is False
    law = result["picks"]["law with the grid's throughputs"]
    assert law["size"] in {"128x4", "256x4", "384x6"} and law["within_target"] == (law["vs_best"] <= 0.02)
    rows = {p["size"]: p for p in result["points"]}
    assert rows["256x4"]["vs_best"] == 0 and rows["128x4"]["tokens_per_second"] == 10000.0
    assert all(p["predicted_loss"] > 0 for p in result["points"])  # the law's prediction beside each measured loss
    assert "outside the 2% target" in plan_grid.table(result) and (tmp_path / "plan_grid.json").is_file()
    assert plan_grid.chosen_size("no table") is None
    assert plan_grid.chosen_size("64x2  0.61M  0.083M  2,053  0.0M  0  8.071  <- chosen (extrapolated)") == "64x2"
