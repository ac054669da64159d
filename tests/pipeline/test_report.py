"""Reports from run folders: optional files, extra metric fields, comparisons."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from cramlm.cli import main
from cramlm.report import write_report
from cramlm.report.runs import load_run_data


def fake_run(folder: Path, name: str, loss0: float, with_extras: bool) -> Path:
    """A run folder as pretrain + eval write it; extras: val_loss on lines of their own, mfu, unknown keys."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(f"name: {name}\nbudget: 0.01\narch: {{type: crammed-bert}}\ndata: {{name: d}}\n")
    lines = []
    for step in range(1, 31):
        t = step / 30
        line = {"step": step, "t": t, "elapsed": 36 * t, "tokens": 8192 * step, "loss": loss0 - 2 * t, "lr": 1e-3 * min(0.25 + t, (1 - t) / 0.25),
                "batch_size": 64, "tokens_per_second": 2000 + step}
        if with_extras:
            line.update(mfu=0.3, grad_norm=1.0, note="unknown keys are ignored")
        lines.append(json.dumps(line))
        if with_extras and step % 10 == 0:
            lines.append(json.dumps({"kind": "val", "step": step, "t": t, "val_loss": loss0 - 1.8 * t}))  # x from the train line
    (folder / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 31, "lo')  # a torn last line
    (folder / "summary.json").write_text(json.dumps({"name": name, "parameters": 1000, "steps": 30, "tokens": 245760,
                                                     "first_loss": loss0, "last_loss": loss0 - 2}))
    (folder / "eval.json").write_text(json.dumps({"results": [
        {"task": "sst", "metric": "accuracy", "score": 0.8, "best": 0.82, "seeds": 3},
        {"task": "stsb", "metric": "pearson", "median": 0.5}]}))
    return folder


def plots_in(html: str) -> set[str]:
    return set(re.findall(r'data-plot="([^"]+)"', html))


def test_extra_fields_are_plotted_when_present(tmp_path):
    run = fake_run(tmp_path / "a", "a", 9.0, with_extras=True)
    data = load_run_data(run)
    assert len(data.metrics) == 33  # 30 train lines + 3 validation lines; the torn line dropped
    assert data.series("tokens", "val_loss")[1] == pytest.approx([9 - 0.6, 9 - 1.2, 9 - 1.8])
    html = write_report(run).read_text()
    assert plots_in(html) == {"loss_vs_tokens", "loss_vs_time", "schedule", "throughput", "eval"}
    assert "last val_loss" in html and "7.2" in html  # the last validation loss is in the table
    assert ">80<" in html and ">82<" in html and ">50<" in html  # eval scores as percentages; median accepted
    assert (run / "plots" / "throughput.png").stat().st_size > 0


def test_validation_between_logged_steps_is_placed_by_interpolation(tmp_path):
    """Training logs every 10 steps but validation falls where the budget fraction says (step 25):
    the point must be plotted at its interpolated tokens, not dropped."""
    run = tmp_path / "r"
    run.mkdir()
    lines = [{"kind": "train", "step": s, "tokens": 100 * s, "elapsed": 2.0 * s, "loss": 5.0} for s in (10, 20, 30)]
    lines += [{"kind": "val", "step": 25, "val_loss": 4.0}, {"kind": "val", "step": 40, "val_loss": 3.0}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines))
    data = load_run_data(run)
    assert data.series("tokens", "val_loss") == ([2500.0], [4.0])  # step 40 lies beyond every logged step
    assert data.series("elapsed", "val_loss") == ([50.0], [4.0])


def test_missing_files_leave_out_their_plots(tmp_path):
    run = tmp_path / "bare"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"parameters": 5}))
    html = write_report(run).read_text()
    assert plots_in(html) == set() and "parameters" in html
    with pytest.raises(FileNotFoundError, match="not a cramlm run"):
        write_report(tmp_path)


def test_compare_runs_side_by_side(tmp_path):
    a = fake_run(tmp_path / "runs" / "a", "a", 9.0, with_extras=True)
    b = fake_run(tmp_path / "runs" / "b", "b", 8.0, with_extras=False)
    result = CliRunner().invoke(main, ["report", str(a), str(b)])
    assert result.exit_code == 0, result.output
    html = (tmp_path / "runs" / "compare-a-b" / "report.html").read_text()
    assert plots_in(html) == {"loss_vs_tokens", "loss_vs_time", "schedule", "throughput", "eval"}
    header = re.search(r"<h2>Runs</h2>\s*<table><thead><tr>(.*?)</tr>", html).group(1)
    assert "<th>a</th><th>b</th>" in header
    assert re.search(r"<td>sst</td><td>accuracy</td><td>80</td><td>80</td>", html)
