"""Reports from run folders: optional files, extra metric fields, comparisons."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from cramlm.cli import main
from cramlm.report import write_report
from cramlm.report.rundata import load_run_data, train_task_differences


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
        {"task": "sst", "metric": "accuracy", "score": 0.8, "best": 0.82, "seeds": 3, "majority": 0.556},
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
    assert "Validation loss at the end of training" in html and "7.200 (last logged)" in html
    assert ">80.0<" in html and ">82.0<" in html and ">50.0<" in html  # eval scores as percentages; median accepted
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
    assert re.search(r"<td>sst</td><td>accuracy</td><td>80.0</td><td>80.0</td>", html)


# ------------------------------------------------------------------ what the page says (issue 16.3)

SUMMARY = {"name": "r", "parameters": 1723137, "setup_seconds": 1.283, "steps": 22, "tokens": 180224, "flops": 1.139e12,
           "train_seconds": 62.808, "t": 1.046799, "budget": "60s", "budget_counts": {"compile": True},
           "first_step_seconds": 3.8, "eval_seconds": 5.6, "nonfinite_steps": 0, "skipped_steps": 0, "rollbacks": 0,
           "tokens_per_second": 2917.4, "flops_per_token": 6322272.0, "flops_source": "model.flops_per_token",
           "peak_flops": 46317790104.1, "peak_source": "measured fp32 GEMM, 2 threads", "mfu": 0.3982,
           "first_loss": 9.07058, "last_loss": 7.605474, "val_loss": 7.476473927497864, "world_size": 1,
           "final_checkpoint": "outputs/r/checkpoints/step-00000022", "data": "outputs/data/moby-dick-6fe2e039d378"}


def demo_like_run(folder: Path, scores: dict[str, tuple[str, float, float | None]], twin: dict[str, float] | None = None) -> Path:
    """A run folder as `cramlm run` of the demo writes it: the real summary.json keys, a budget of
    one minute, three logged lines, the report stage running (as while the report is written)."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(
        "name: r\nbudget: 0.016666666666666666\narch: {type: crammed-bert, hidden_size: 128, num_layers: 4}\n"
        "data: {name: moby-dick, seq_length: 128, tokenizer: {vocab_size: 8192}}\nimpl: {microbatch_size: 64}\n"
        "train: {optim: {type: adamw, lr: 0.001}, schedule: {type: budget-triangle2, base: 0.25, falloff: 0.25},"
        " batch_size: 64, batch_ramp: 0.0}\n")
    lines = [{"kind": "train", "step": s, "t": t, "elapsed": 60 * t, "tokens": 8192 * s, "loss": 9 - t, "batch_size": 64,
              "lr": 1e-3 * min(0.25 + t, (1 - t) / 0.25), "tokens_per_second": 3000} for s, t in ((1, 0.06), (10, 0.5), (20, 0.91))]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    (folder / "summary.json").write_text(json.dumps(SUMMARY))

    def results(values, untrained):
        return {"untrained": untrained, "results": [{"task": k, "metric": m, "score": v, "best": v, "majority": maj, "seeds": [{}],
                                                     "train_examples": 2000, "dev_examples": 500}
                                                    for k, (m, v, maj) in values.items()]}

    (folder / "eval.json").write_text(json.dumps(results(scores, False)))
    if twin is not None:
        (folder / "eval-untrained.json").write_text(json.dumps(results({k: (scores[k][0], v, scores[k][2]) for k, v in twin.items()}, True)))
    stages = {s: {"status": "done", "seconds": 1.0, "finished": "2026-01-01T00:00:00+00:00"} for s in ("data", "pretrain", "eval")}
    started = datetime.now(timezone.utc) - timedelta(seconds=2)
    stages["report"] = {"status": "running", "started": started.isoformat(timespec="seconds")}
    (folder / "pipeline.json").write_text(json.dumps({"name": "r", "stages": stages}))
    return folder


def section(html: str, title: str) -> str:
    return re.search(rf"<h2>{re.escape(title)}</h2>(.*?)(?=<h2>|</body>)", html, re.S).group(1)


def first_column(table_html: str) -> list[str]:
    return re.findall(r"<tr><td>([^<]*)</td>", table_html)


def test_a_run_still_training_says_where_it_stands_and_what_it_reached_so_far(tmp_path):
    """Without summary.json (a run training, or stopped before its end) the runs table says so and gives its
    steps, tokens, budget used, time and train loss from the last logged line, each "so far"; a run stopped by
    a signal names the signal and the checkpoint it resumes from. A finished run has no status row."""
    folder = demo_like_run(tmp_path / "r", {"sst": ("accuracy", 0.608, 0.556)})
    assert "<td>Status</td>" not in section(write_report(folder).read_text(), "Runs")
    (folder / "summary.json").unlink()
    (folder / "eval.json").unlink()
    rows = dict(re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td>", section(write_report(folder).read_text(), "Runs")))
    assert rows["Status"].startswith("not finished: last logged step 20, 91 % of the budget (metrics.jsonl written ")
    assert rows["Optimizer steps"] == "20 so far" and rows["Tokens trained on"] == "163,840 so far"
    assert rows["Budget used"] == "91 % so far" and rows["Training time (counted)"] == "54.6 s so far"
    assert rows["Train loss, first → last logged (nats per token)"] == "8.940 → 8.090 so far"
    assert rows["Throughput"] == "3,000 tokens/s (the last logged window)"

    with (folder / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"kind": "event", "event": "interrupted", "step": 20, "signal": "SIGTERM",
                            "checkpoint": str(folder / "checkpoints" / "step-00000020")}) + "\n")
    rows = dict(re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td>", section(write_report(folder).read_text(), "Runs")))
    assert rows["Status"] == ("stopped at step 20, 91 % of the budget (SIGTERM; checkpoint step-00000020): not finished, "
                              "--resume auto continues")

    def status_after(*lines) -> str:
        with (folder / "metrics.jsonl").open("a") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
        return dict(re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td>", section(write_report(folder).read_text(), "Runs")))["Status"]

    assert status_after({"kind": "event", "event": "resumed", "step": 20}, {"kind": "train", "step": 25, "t": 0.95, "loss": 8.0},
                        {"kind": "event", "event": "failed", "step": 25, "error": "RuntimeError: boom"}) == (
        "failed at step 25, 95 % of the budget: RuntimeError: boom")
    assert status_after({"kind": "event", "event": "resumed", "step": 25}, {"kind": "train", "step": 27, "t": 1.0, "loss": 8.0},
                        {"kind": "finished", "step": 27}).startswith("trained to its end (step 27, 100 % of the budget); "
                                                                     "its summary.json was not written")
    (folder / "metrics.jsonl").write_text(json.dumps({"kind": "event", "event": "failed", "step": 0, "error": "OSError: disk"}) + "\n")
    assert status_after() == "failed at step 0: OSError: disk"  # before its first train line


def test_beside_an_unfinished_run_a_finished_one_says_finished(tmp_path):
    done = demo_like_run(tmp_path / "done", {"sst": ("accuracy", 0.608, 0.556)})
    going = demo_like_run(tmp_path / "going", {"sst": ("accuracy", 0.608, 0.556)})
    (going / "summary.json").unlink()
    runs = section(write_report(done, going, out=tmp_path / "cmp").read_text(), "Runs")
    status = re.search(r"<tr><td>Status</td><td>([^<]*)</td><td>([^<]*)</td>", runs)
    assert status[1] == "finished" and status[2].startswith("not finished: last logged step 20")


def test_a_finished_run_extended_and_cut_off_is_not_finished(tmp_path):
    """A finished run resumed with a larger budget and killed keeps its old summary.json: the log trained past
    it, so the run is not finished, its values are the log's "so far" and the old summary is named. A damaged
    summary.json (not JSON, or not an object) is an error naming the file, not a run whose summary was not written."""
    import click

    folder = demo_like_run(tmp_path / "r", {"sst": ("accuracy", 0.608, 0.556)})
    steps = json.loads((folder / "summary.json").read_text())["steps"]
    log = (folder / "metrics.jsonl").read_text()

    def logged(*lines) -> None:
        (folder / "metrics.jsonl").write_text(log + "".join(json.dumps(line) + "\n" for line in lines))

    # resumed at its own budget (to write a summary again) and cut off after re-validating: no step trained past it
    logged({"kind": "finished", "step": steps}, {"kind": "event", "event": "resumed", "step": steps},
           {"kind": "val", "step": steps, "val_loss": 7.5})
    assert load_run_data(folder).summary["steps"] == steps and not load_run_data(folder).stale_summary
    # extended, trained to its new end, and its new summary not written (the save stopped)
    logged({"kind": "finished", "step": steps}, {"kind": "train", "step": steps + 5, "t": 1.0, "loss": 7.0},
           {"kind": "finished", "step": steps + 5})
    rows = dict(re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td>", section(write_report(folder).read_text(), "Runs")))
    assert rows["Status"].startswith(f"trained to its end (step {steps + 5}, 100 % of the budget); its summary.json was not written")
    assert rows["Status"].endswith(f"the one there is of step {steps:,}")
    # extended and cut off
    logged({"kind": "finished", "step": steps}, {"kind": "event", "event": "resumed", "step": steps},
           {"kind": "train", "step": steps + 12, "t": 0.4, "loss": 7.0, "tokens": 999_999})
    rows = dict(re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td>", section(write_report(folder).read_text(), "Runs")))
    assert rows["Status"].startswith(f"not finished: last logged step {steps + 12}, 40 % of the budget")
    assert rows["Status"].endswith(f"its summary.json, of step {steps:,}, is from before it trained on")
    assert rows["Optimizer steps"] == f"{steps + 12} so far" and rows["Tokens trained on"] == "999,999 so far"
    assert load_run_data(folder).stale_summary["steps"] == steps and not load_run_data(folder).summary
    for damaged in ('{"steps": 3', "[1, 2]"):
        (folder / "summary.json").write_text(damaged)
        with pytest.raises((ValueError, click.ClickException), match="summary.json: .*the file is damaged"):
            write_report(folder)


def test_runs_table_has_labels_and_units_not_raw_keys(tmp_path):
    run = demo_like_run(tmp_path / "r", {"sst": ("accuracy", 0.608, 0.556)})
    html = write_report(run).read_text()
    runs = section(html, "Runs")
    table, raw = runs.split("<details>", 1)
    labels = first_column(table)
    assert labels and not [k for k in labels if re.search(r"[a-z]_[a-z]", k) or k in SUMMARY or k == "t"], labels
    assert len([k for k in labels if "loss" in k.lower()]) == len(set(k for k in labels if "loss" in k.lower()))
    for shown in ("<td>1m of training</td>", "<td>180,224</td>", "<td>1,723,137</td>", "<td>2,917 tokens/s</td>",
                  "<td>39.8 % of 46.3 GFLOP/s (measured fp32 GEMM, 2 threads)</td>", "<td>62.8 s (1m 3s)</td>",
                  "<td>105 %</td>", "<td>9.071 → 7.605</td>", "<td>7.476</td>"):
        assert shown in table, shown
    assert "0.01667" not in table and "budget (hours)" not in html
    assert '"peak_source": "measured fp32 GEMM, 2 threads"' in raw.replace("&quot;", '"')  # the raw JSON stays, collapsed


def test_duration_formats_budgets_as_people_write_them():
    from cramlm.report.html import duration

    assert [duration(s) for s in (36, 60, 90, 3600, 5400, 86400)] == ["36s", "1m", "1m 30s", "1h", "1h 30m", "24h"]


def test_pipeline_table_marks_the_report_done(tmp_path):
    run = demo_like_run(tmp_path / "r", {"sst": ("accuracy", 0.608, 0.556)})
    stages = section(write_report(run).read_text(), "Pipeline stages")
    assert re.search(r"<td>report</td><td>done</td><td>[0-9.]+</td>", stages), stages
    assert "running" not in stages


def test_eval_table_in_percent_with_untrained_twin_and_margin(tmp_path):
    run = demo_like_run(tmp_path / "r", {"sst": ("accuracy", 0.608, 0.556), "cola": ("matthews", 0.2, 0.0)},
                        twin={"sst": 0.734, "cola": 0.1})
    evaluation = section(write_report(run).read_text(), "Evaluation (dev scores, %)")
    header = re.findall(r"<th>([^<]*)</th>", evaluation)
    assert header[:6] == ["task", "metric", "pretrained", "untrained twin", "margin", "majority class"]
    assert re.search(r"<td>sst</td><td>accuracy</td><td>60.8</td><td>73.4</td><td class=\"neg\">-12.6</td><td>55.6</td>", evaluation)
    assert re.search(r"<td>cola</td><td>matthews</td><td>20.0</td><td>10.0</td><td class=\"pos\">\+10.0</td><td>0.0</td>", evaluation)
    assert "0.556" not in evaluation  # the majority column in the same unit as the scores
    assert ("Pretraining did not pay (yet): ahead of the untrained twin by &gt;= 2 points on 1 of 2 tasks (cola), "
            "behind by more than 1 point on 1 (sst)") in evaluation


@pytest.mark.parametrize("cola", [0.0, -0.05])
def test_harmonic_mean_is_undefined_with_a_score_at_or_below_zero(tmp_path, cola):
    run = demo_like_run(tmp_path / "r", {"sst": ("accuracy", 0.608, 0.556), "cola": ("matthews", cola, 0.0)})
    html = write_report(run).read_text()
    harmonic = re.search(r"<td>harmonic mean</td><td></td><td>([^<]*)</td>", section(html, "Evaluation (dev scores, %)")).group(1)
    assert harmonic == "undefined"
    assert "<td>undefined (a score ≤ 0)</td>" in section(html, "Runs")
    # with every score above 0 it is the harmonic mean of the percentages
    run = demo_like_run(tmp_path / "ok", {"sst": ("accuracy", 0.6, 0.556), "cola": ("matthews", 0.2, 0.0)})
    assert "<td>harmonic mean</td><td></td><td>30.0</td>" in write_report(run).read_text()  # 2 / (1/60 + 1/20)


def test_schedule_curves_come_from_the_schedule_and_batch_plan(tmp_path):
    """The lr line is train.schedules' function on a dense grid: budget-triangle2 peaks at t = 0.75,
    where joining the demo's three logged points put the peak at the middle one (t = 0.5 here)."""
    from cramlm.report.curves import batch_curve, lr_curve

    run = load_run_data(demo_like_run(tmp_path / "r", {"sst": ("accuracy", 0.6, 0.5)}))
    t, lr = lr_curve(run.config)
    assert t[lr.argmax()] == pytest.approx(0.75) and lr.max() == pytest.approx(1e-3)
    assert lr[0] == pytest.approx(0.25e-3) and lr[-1] == pytest.approx(0.0)
    logged_t, logged_lr = run.series("t", "lr")
    assert logged_t[logged_lr.index(max(logged_lr))] != pytest.approx(0.75)  # what the old plot drew
    # the batch ramp of the trainer's BatchPlan: one microbatch up to batch_size over train.batch_ramp of t
    config = {**run.config, "train": {**run.config["train"], "batch_size": 512, "batch_ramp": 0.5}}
    t, batch = batch_curve(config)
    assert batch[0] == 64 and batch[t.searchsorted(0.25)] == 256 and batch[t.searchsorted(0.5)] == 512 and batch[-1] == 512
    assert lr_curve({"train": {"schedule": {"type": "no-such-schedule"}, "optim": {"lr": 1}}}) is None


def test_eval_chart_has_twin_and_majority_reference_lines(tmp_path, monkeypatch):
    from matplotlib.collections import LineCollection

    from cramlm.report import plots

    run = load_run_data(demo_like_run(tmp_path / "r", {"sst": ("accuracy", 0.608, 0.556), "cola": ("matthews", 0.2, 0.0)},
                                      twin={"sst": 0.734, "cola": 0.1}))
    drawn = {}
    monkeypatch.setattr(plots, "save", lambda fig, path: drawn.setdefault("fig", fig) and path)
    plots.eval_figure([run], tmp_path / "eval.png")
    ax = drawn["fig"].axes[0]
    levels = sorted(round(float(seg[0][1]), 1) for c in ax.collections if isinstance(c, LineCollection) for seg in c.get_segments())
    assert levels == [0.0, 10.0, 55.6, 73.4]  # majority 55.6 and 0; twin 73.4 and 10
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["pretrained", "untrained twin", "majority class"]


def test_budget_cell_says_whichever_only_for_several_budgets(tmp_path):
    from cramlm.report.html import _budget

    cells = {}
    for name, config in {"steps": "budget: null\ntrain: {budget: {steps: 40}}\n",
                         "clock": "budget: 0.016666666666666666\n",
                         "both": "budget: 0.016666666666666666\ntrain: {budget: {steps: 40}}\n"}.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.yaml").write_text(f"name: {name}\n{config}")
        (folder / "summary.json").write_text(json.dumps({"name": name, "steps": 40}))
        cells[name] = _budget(load_run_data(folder))
    assert cells == {"steps": "40 steps of training", "clock": "1m of training",
                     "both": "1m or 40 steps, whichever is spent first"}


def test_mfu_is_drawn_in_percent_as_the_table_states_it(tmp_path, monkeypatch):
    from cramlm.report import plots

    run = load_run_data(fake_run(tmp_path / "a", "a", 9.0, with_extras=True))  # mfu 0.3 logged
    drawn = {}
    monkeypatch.setattr(plots, "save", lambda fig, path: drawn.setdefault("fig", fig) and path)
    plots.throughput_figure([run], tmp_path / "throughput.png")
    ax = drawn["fig"].axes[1]
    assert ax.get_ylabel() == "MFU (%)"
    assert list(ax.get_lines()[0].get_ydata()) == pytest.approx([30.0] * 30)
@pytest.mark.parametrize("damaged", ["metrics.jsonl", "summary.json", "config.yaml"])
def test_garbage_bytes_in_a_run_file_name_the_file(tmp_path, damaged):
    """Issue 20 item 11: not 'utf-8 codec can't decode byte 0xff' with no file name."""
    run = fake_run(tmp_path / "r", "r", 5.0, False)
    path = run / damaged
    path.write_bytes(path.read_bytes()[:40] + b"\xff\xfe garbage \x80" + path.read_bytes()[40:])
    res = CliRunner().invoke(main, ["report", str(run)])
    assert res.exit_code == 1, res.output
    assert f"Error: {path}: not UTF-8 text" in res.output, res.output


# ------------------------------------------------------- what the screenshots showed (issue 22.5)


def test_every_loss_row_names_its_unit_and_the_precision_is_shown(tmp_path):
    run = demo_like_run(tmp_path / "r", {"sst": ("accuracy", 0.608, 0.556)})
    (run / "summary.json").write_text(json.dumps({**SUMMARY, "precision": "bf16"}))
    table = section(write_report(run).read_text(), "Runs").split("<details>", 1)[0]
    labels = first_column(table)
    loss_rows = [k for k in labels if "loss" in k.lower()]
    assert loss_rows and all("(nats per token)" in k for k in loss_rows), loss_rows
    assert "<tr><td>Training precision</td><td>bf16</td></tr>" in table


def test_runs_with_the_same_schedule_stay_visible_in_a_comparison(tmp_path, monkeypatch):
    """Two runs with one schedule draw on the same points: the first is drawn wider (lines) and
    larger (markers) than the second, so neither hides the other; the note says so."""
    from cramlm.report import plots

    a = demo_like_run(tmp_path / "a", {"sst": ("accuracy", 0.6, 0.5)})
    b = demo_like_run(tmp_path / "b", {"sst": ("accuracy", 0.6, 0.5)})
    for folder in (a, b):  # two names, one config otherwise
        config = folder / "config.yaml"
        config.write_text(config.read_text().replace("name: r\n", f"name: {folder.name}\n"))
    runs = [load_run_data(a), load_run_data(b)]
    assert [r.name for r in runs] == ["a", "b"]
    drawn = {}
    monkeypatch.setattr(plots, "save", lambda fig, path: drawn.setdefault("fig", fig) and path)
    plots.schedule_figure(runs, tmp_path / "schedule.png")
    for ax in drawn["fig"].axes:
        lines = {line.get_label(): line for line in ax.get_lines()}
        planned = [lines[f"{r.name} planned"] for r in runs]
        logged = [lines[f"{r.name} logged"] for r in runs]
        assert list(planned[0].get_ydata()) == pytest.approx(list(planned[1].get_ydata()))  # the same curve
        assert planned[0].get_linewidth() > planned[1].get_linewidth()
        assert logged[0].get_markersize() > logged[1].get_markersize()
    assert plots.overlap_sizes(1) == [(1.5, 4.0)]  # one run: as before
    assert max(lw for lw, _ in plots.overlap_sizes(12)) < 8
    monkeypatch.undo()  # the pages below draw their figures for real
    html = write_report(a, b, out=tmp_path / "cmp").read_text()
    assert "narrower than the one before it" in html
    assert "narrower than the one before it" not in write_report(a).read_text()


def test_a_margin_is_coloured_and_signed_as_printed():
    """A margin that rounds to zero prints +0.0 uncoloured, never a red -0.0 (a tie rate 0.00% against 0.01%)."""
    from cramlm.report.html import Margin, _cell

    assert _cell(Margin(-0.01)) == '<td class="">+0.0</td>'
    assert _cell(Margin(0.06)) == '<td class="pos">+0.1</td>' and _cell(Margin(-2.34)) == '<td class="neg">-2.3</td>'


def zero_shot(paradigms: dict[str, int], right: float) -> dict:
    """eval.json's minimal_pairs: ``right`` of each paradigm's pairs scored the acceptable sentence higher."""
    from cramlm.eval.pairs import Pair, accuracy

    pairs = [Pair(f"g{i}", f"b{i}", name, "phen-" + name) for name, n in paradigms.items() for i in range(n)]
    good = [-1.0 if i < right * n else -3.0 for n in paradigms.values() for i in range(n)]
    return {"kind": "mlm", "headline": "pll-word-l2r", "scores": {"pll-word-l2r": accuracy(pairs, good, [-2.0] * len(good))}}


def with_zero_shot(folder: Path, pairs: dict | None, twin: dict | None = None) -> Path:
    demo_like_run(folder, {"sst": ("accuracy", 0.6, 0.5)}, {"sst": 0.55})
    for name, block in (("eval.json", pairs), ("eval-untrained.json", twin)):
        data = json.loads((folder / name).read_text())
        (folder / name).write_text(json.dumps({**data, "minimal_pairs": block}))
    return folder


def test_two_runs_of_one_name_each_show_their_own_zero_shot(tmp_path):
    """Two runs named alike (the same point of two sweeps): each column its own numbers (the zero-shot table
    showed the second run's under both), each named by its folder."""
    a = with_zero_shot(tmp_path / "x" / "r", zero_shot({"p": 4}, 1.0), zero_shot({"p": 4}, 0.5))
    b = with_zero_shot(tmp_path / "y" / "r", zero_shot({"p": 4}, 0.25), zero_shot({"p": 4}, 0.5))
    table = section(write_report(a, b, out=tmp_path / "cmp").read_text(), "Zero-shot minimal pairs (accuracy, %)")
    assert re.search(r"<td>macro average \(paradigms\)</td><td>100.0</td><td>50.0</td><td[^>]*>\+50.0</td>"
                     r"<td>25.0</td><td>50.0</td><td[^>]*>-25.0</td>", table), table
    assert "r (x/r) (pll-word-l2r)" in table and "r (y/r) (pll-word-l2r)" in table


def test_zero_shot_that_does_not_compare_or_was_refused_is_said(tmp_path):
    """Runs scored on other pairs than each other are said not to compare; a recorded refusal (the run's or
    the twin's) and a run not scored are named with the run, never silently left out of the table."""
    a = with_zero_shot(tmp_path / "a", zero_shot({"p": 4, "q": 4}, 0.75), {"skipped": "the twin's head is random"})
    b = with_zero_shot(tmp_path / "b", zero_shot({"p": 2, "q": 4}, 0.75))
    c = with_zero_shot(tmp_path / "c", {"skipped": "c: no trained masked-LM head"})
    d = with_zero_shot(tmp_path / "d", None)
    for folder in (a, b, c, d):
        config = folder / "config.yaml"
        config.write_text(config.read_text().replace("name: r\n", f"name: {folder.name}\n"))
    html = section(write_report(a, b, c, d, out=tmp_path / "cmp").read_text(), "Zero-shot minimal pairs (accuracy, %)")
    assert "different pairs (a 8 in 2 paradigms, b 6 in 2 paradigms): their columns do not compare" in html
    assert "a: the untrained twin&#x27;s minimal pairs were not scored: the twin&#x27;s head is random" in html
    assert "c: minimal pairs not scored: c: no trained masked-LM head" in html and "d: not scored on minimal pairs" in html
    assert "different pairs" not in write_report(a, a, out=tmp_path / "same").read_text()
    alone = section(write_report(c).read_text(), "Zero-shot minimal pairs (accuracy, %)")  # the section, with why
    assert "minimal pairs not scored: c: no trained masked-LM head" in alone and "<table>" not in alone


@pytest.mark.parametrize("damage, key", [
    (lambda rec: rec.pop("phenomena"), "phenomena"),
    (lambda rec: rec["paradigms"]["p"].pop("pairs"), "paradigms.p"),
    (lambda rec: rec.update(accuracy=None), "accuracy"),
])
def test_a_damaged_zero_shot_record_is_an_error_naming_file_and_key(tmp_path, damage, key):
    """A zero-shot record the tables cannot read (hand-edited, truncated by hand) was a KeyError traceback."""
    block = zero_shot({"p": 4, "q": 4}, 0.75)
    damage(block["scores"]["pll-word-l2r"])
    run = with_zero_shot(tmp_path / "r", zero_shot({"p": 4, "q": 4}, 0.75), block)
    result = CliRunner().invoke(main, ["report", str(run)])
    assert result.exit_code == 1 and result.output.startswith("Error: ") and len(result.output.splitlines()) == 1
    assert f"{run / 'eval-untrained.json'}: minimal_pairs.scores.pll-word-l2r: {key} missing" in result.output


def test_a_run_evaluated_zero_shot_alone_gets_its_verdict(tmp_path):
    """eval.tasks=[] (a sweep's points, a zero-shot evaluation): the verdict on what pretraining bought was
    only written under the fine-tuning table, so such a report had none."""
    run = with_zero_shot(tmp_path / "r", zero_shot({"p": 40, "q": 40}, 0.9), zero_shot({"p": 40, "q": 40}, 0.5))
    for name in ("eval.json", "eval-untrained.json"):
        data = json.loads((run / name).read_text())
        (run / name).write_text(json.dumps({**data, "results": []}))
    html = write_report(run).read_text()
    assert "<h2>Evaluation" not in html
    said = section(html, "Zero-shot minimal pairs (accuracy, %)")
    assert re.search(r'<p class="verdict">Zero-shot, pretraining paid: .* on 2 of 2 paradigms', said), said


def test_segments_say_which_ran_where_and_what_a_cut_off_cost(tmp_path):
    """A log with segment lines (a SIGTERM stop, then a cut-off whose next segment resumed three
    steps back) and one from before them (split at its resumed events): each segment's steps, its
    machine and how it ended; the page shows them; a run trained in one go by old code shows none."""
    from cramlm.report.segments import segments

    here = {"host": "vm", "boot": "0123abcd", "cpu": "AMD EPYC (family 25, model 17)", "accelerator": None, "torch": "2.13.0"}

    def segment(step, wall):
        return {"kind": "segment", "step": step, "wall": wall, "pid": 1, "world_size": 1, "threads": 1, "budget_seconds": float(step),
                "machine": here, "code": {"version": "0.1.0", "commit": "abc123", "dirty": False}}

    def train(a, b):
        return [{"kind": "train", "step": s, "elapsed": float(s), "loss": 5.0} for s in range(a, b + 1)]

    run = fake_run(tmp_path / "new", "new", 8.0, with_extras=False)
    lines = [segment(0, "2026-12-06T10:00:00+00:00"), *train(1, 10),
             {"kind": "event", "event": "interrupted", "step": 10, "wall": "2026-12-06T10:05:00+00:00", "signal": "SIGTERM"},
             segment(10, "2026-12-06T11:00:00+00:00"), {"kind": "event", "event": "resumed", "step": 10, "from": "ckpt/step-00000010"},
             *train(11, 20), segment(17, "2026-12-06T12:00:00+00:00"), {"kind": "event", "event": "resumed", "step": 17, "from": "c"},
             *train(18, 30), {"kind": "finished", "step": 30, "wall": "2026-12-06T12:30:00+00:00", "checkpoint": "ckpt/step-00000030"},
             segment(30, "2026-12-06T13:00:00+00:00"), *train(31, 35), {"kind": "event", "event": "failed", "step": 35, "error": "OSError: disk"}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    a, b, c, d = segs = segments([json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()], 30)
    assert [(s.start, s.end) for s in segs] == [(0, 10), (10, 20), (17, 30), (30, 35)]
    assert a.ended == "stopped by SIGTERM after step 10, checkpoint written" and a.wall_end == "2026-12-06T10:05:00+00:00"
    assert b.ended == "cut off after step 20 (last logged); the next resumed from step 17: at least 3 steps trained again" and b.retrained == 3
    assert b.wall_end == "~2026-12-06T11:00:10+00:00" and b.resumed_from == "ckpt/step-00000010"
    assert c.ended == "done at step 30; the next segment went on from step 30 (extended)" and c.wall_end == "2026-12-06T12:30:00+00:00"
    assert d.ended == "failed after step 35: OSError: disk"  # summary.json's steps are an older finish's: not read for new logs
    assert a.machine == "vm (boot 0123abcd), AMD EPYC (family 25, model 17), torch 2.13.0" and a.code == "cramlm 0.1.0 @ abc123"
    table = section(write_report(run).read_text(), "Segments (which ran where)")
    assert table.count("<tr><td>") == 4 and "3 steps trained again" in table and "0123abcd" in table
    assert "<td>2026-12-06 10:05:00</td>" in table and "<td>~2026-12-06 11:00:10</td>" in table  # UTC, as people read it

    two = {**segment(0, None), "world_size": 4, "machines": [{**here, "host": "vm2", "boot": "4567cdef", "ranks": [1, 3]}]}
    assert segments([two])[0].machine == ("ranks 0, 2: vm (boot 0123abcd), AMD EPYC (family 25, model 17), torch 2.13.0; "
                                          "ranks 1, 3: vm2 (boot 4567cdef), AMD EPYC (family 25, model 17), torch 2.13.0")
    sparse = [segment(0, None), *[{"kind": "train", "step": s} for s in (1, 100)], segment(150, None), *train(170, 200)]
    e, f = segments(sparse)  # logged every 100 steps, killed after its checkpoint at 150: it reached 150 at least
    assert (e.end, e.retrained, f.start) == (150, 0, 150) and e.ended == "cut off after step 100 (last logged); the next resumed from step 150"
    stopped = [segment(0, None), *train(1, 8), {"kind": "event", "event": "interrupted", "step": 8, "signal": "SIGTERM", "checkpoint": "None"},
               segment(5, None), *train(6, 9)]
    g, _ = segments(stopped)  # a stop whose checkpoint could not be written (a full disk): the next went back to 5
    assert g.ended == "stopped by SIGTERM after step 8, no checkpoint written; the next resumed from step 5: at least 3 steps trained again"

    old = [*train(1, 5), {"kind": "event", "event": "resumed", "step": 4, "from": "x"}, *train(5, 9)]
    x, y = segments(old, None)  # from before segment lines: split at the resume, no machine
    assert (x.start, x.end, x.retrained, x.machine, y.start, y.end) == (0, 5, 1, None, 4, 9)
    assert segments(old, 9)[-1].ended == "done at step 9"  # such a log's finish: from summary.json
    assert y.ended == "running, or cut off after step 9 (last logged)"
    legacy = fake_run(tmp_path / "old", "old", 8.0, with_extras=False)
    (legacy / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    table = section(write_report(legacy).read_text(), "Segments (which ran where)")
    assert "<th>machine</th>" not in table and "<th>ended</th>" in table and "at least 1 step trained again" in table
    assert "Segments (which ran where)" not in write_report(fake_run(tmp_path / "plain", "plain", 8.0, with_extras=False)).read_text()

    # the curves read the run as it stands: the steps a cut-off segment logged past the next one's start are not drawn twice
    current = load_run_data(run)
    steps = [m["step"] for m in current.metrics if m.get("kind") == "train"]
    assert steps == list(range(1, 36)) and len(current.log) == len(lines)
    assert current.series("step", "loss")[0] == [float(s) for s in range(1, 36)]
    assert [m["step"] for m in load_run_data(legacy).metrics if m.get("kind") == "train"] == list(range(1, 10))


def test_code_version_names_a_commit_only_where_git_tracks_the_package(tmp_path):
    """A segment line's code: this checkout's commit, but never that of a repository which merely
    holds an installed copy (a project with its .venv inside)."""
    import os
    import shutil
    import subprocess
    import sys

    from cramlm.train.hardware import code_version

    if shutil.which("git") is None:
        pytest.skip("git not installed")
    src = Path(__file__).resolve().parents[2] / "src" / "cramlm"
    head = subprocess.run(["git", "-C", str(src), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert code_version()["commit"] == head.stdout.strip()
    ident = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@b"}
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    shutil.copytree(src, tmp_path / "venv" / "cramlm", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "-C", str(tmp_path), "commit", "-q", "--allow-empty", "-m", "theirs"], check=True, env={**os.environ, **ident})
    out = subprocess.run([sys.executable, "-c", "import cramlm.train.hardware as h; print(h.__file__, h.code_version())"],
                         cwd=tmp_path / "venv", capture_output=True, text=True, check=True).stdout
    assert out.startswith(str(tmp_path / "venv" / "cramlm")) and "'commit': None" in out, out


def test_a_line_cut_by_a_kill_does_not_swallow_the_next_segment_line(tmp_path):
    from types import SimpleNamespace

    from cramlm.report.rundata import read_metrics
    from cramlm.train.metrics import MetricsLog

    (tmp_path / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n{"kind": "train", "st')
    log = MetricsLog(tmp_path, SimpleNamespace(tensorboard=False, wandb=False), {}, append=True)
    log.write({"kind": "segment", "step": 1, "wall": "2026-12-07T00:00:00+00:00"})
    log.close()
    assert [r["kind"] for r in read_metrics(tmp_path / "metrics.jsonl")] == ["train", "segment"]


def test_a_run_still_training_is_named_by_its_configured_objective(tmp_path):
    """Before summary.json exists the report reads the objective from config.yaml: a hybrid or
    ELECTRA run is not titled an MLM, a causal architecture's default objective is clm."""
    run = fake_run(tmp_path / "r", "r", 8.0, with_extras=False)
    (run / "summary.json").unlink()
    for arch, trained, expected in [("crammed-bert", "hybrid", "hybrid"), ("crammed-bert", "rtd", "rtd"),
                                    ("gpt2", "mlm", "clm"), ("crammed-bert", None, "mlm"), ("no-such-arch", None, "mlm")]:
        train = f"\ntrain: {{objective: {trained}}}" if trained else ""
        (run / "config.yaml").write_text(f"name: r\narch: {{type: {arch}}}{train}\n")
        assert load_run_data(run).objective == expected, (arch, trained)
    (run / "config.yaml").write_text("name: r\narch: {type: crammed-bert}\ntrain: {objective: hybrid}\n")
    (run / "pipeline.json").write_text(json.dumps({"stages": {"data": {"status": "done", "seconds": 19.26,
                                                                        "finished": "2026-12-06T14:30:55+00:00"}}}))
    page = write_report(run).read_text()
    assert "<td>hybrid (GPT-BERT" in page
    assert "<td>2026-12-06 14:30:55</td>" in page  # stage times in UTC as the segments table writes them


def test_a_full_disk_leaves_no_half_written_plot_and_says_so_in_one_line(tmp_path, monkeypatch):
    """matplotlib wrote a PNG under its final name, so a full disk left an empty loss_vs_tokens.png
    and a bare "[Errno 28]": now each figure is written beside its name and renamed."""
    import errno

    from matplotlib.figure import Figure

    run = fake_run(tmp_path / "r", "r", 8.0, with_extras=False)

    def full(self, fname, **kwargs):
        Path(fname).write_bytes(b"\x89PNG half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full)
    with pytest.raises(ValueError, match=r"r: disk full while writing the report \([\d,.]+ MB free on that disk\); no file of it"):
        write_report(run)
    assert not [p for p in (run / "plots").iterdir()] and not (run / "report.html").exists()


def test_checkpoints_evaluated_are_a_table_against_tokens_beside_the_end(tmp_path):
    """`cramlm eval checkpoint=<run>/checkpoints/step-N` writes eval-step-N.json into the run folder: the report
    lists them in step order with the tokens, the compute and the held-out loss, zero-shot and task mean each reached, the
    run's own eval.json last, and draws them against compute where there are two or more; a damaged zero-shot record
    in one is an error naming that file."""
    run = fake_run(tmp_path / "r", "r", 9.0, with_extras=False)
    for step, loss, right in ((20, 4.5, 0.75), (10, 5.0, 0.5)):
        (run / f"eval-step-{step:08d}.json").write_text(json.dumps({
            "heldout": {"loss": loss}, "minimal_pairs": zero_shot({"p": 4, "q": 4}, right),
            "results": [{"task": "sst", "metric": "accuracy", "score": right}],
            # the checkpoint's training as eval records it (step 10's results from before it did: the log's tokens)
            **({"trained": {"steps": 20, "tokens": 163840, "flops": 2.5e12}} if step == 20 else {})}))
    page = write_report(run).read_text()
    table = section(page, "Checkpoints evaluated")
    assert 'data-plot="along"' in table and page.count('data-plot="along"') == 1  # drawn there, not among the plots
    rows = re.findall(r"<tr><td>(.*?)</td></tr>", table)
    assert [re.split(r"</td><td[^>]*>", r) for r in rows] == [
        ["10", "eval-step-00000010.json", "81.9 k", "", "5.000", "50.0 (pll-word-l2r)", "50.0"],
        ["20", "eval-step-00000020.json", "164 k", "2.5 TFLOPs", "4.500", "75.0 (pll-word-l2r)", "75.0"],
        ["30", "end of training (eval.json)", "246 k", "", "", "", "65.0"]], rows
    assert 'data-plot="along"' not in (compared := write_report(run, run, out=tmp_path / "cmp").read_text())
    assert "Checkpoints evaluated" not in compared  # one run's page
    (run / "eval-step-00000020.json").unlink()  # one checkpoint and the end: two points
    assert 'data-plot="along"' in write_report(run).read_text()
    (run / "eval.json").unlink()  # one point alone: a table, no line
    assert 'data-plot="along"' not in section(write_report(run).read_text(), "Checkpoints evaluated")
    (run / "eval-step-00000010.json").write_text(json.dumps({"minimal_pairs": {"headline": "x", "scores": {"x": {}}}}))
    result = CliRunner().invoke(main, ["report", str(run)])
    assert result.exit_code == 1 and result.output.startswith(f"Error: {run / 'eval-step-00000010.json'}: minimal_pairs")


def test_the_checkpoints_figure_joins_only_comparable_evaluations(tmp_path):
    """along_lines (what the figure draws): a zero-shot line joins the evaluations scored like the last one
    (its scorer, its pairs), a task-mean line those with its tasks and protocol, and the twin stands beside
    only where it is comparable; an eval.json from before the run went on keeps its own step; two evaluations
    at one compute are no line; a headline that is not a scorer's name is an error naming the file."""
    from cramlm.report.plots import _along_drawn, along_lines

    run = fake_run(tmp_path / "r", "r", 9.0, with_extras=False)
    other_scorer = zero_shot({"p": 4, "q": 4}, 0.25)
    other_scorer = {**other_scorer, "headline": "pll-original", "scores": {"pll-original": other_scorer["scores"]["pll-word-l2r"]}}
    sst, stsb = ({"task": "sst", "metric": "accuracy", "score": s} for s in (0.6, 0.7)), None
    evaluations = {  # file -> (flops, held-out loss, minimal pairs, task rows)
        "eval-step-00000010.json": (1e12, 5.0, zero_shot({"p": 4, "q": 4}, 0.5), [next(sst)]),
        "eval-step-00000020.json": (2e12, 4.5, other_scorer,
                                    [next(sst), {"task": "stsb", "metric": "pearson", "median": 0.4}]),
        "eval.json": (3e12, 4.0, zero_shot({"p": 4, "q": 4}, 1.0),
                      json.loads((run / "eval.json").read_text())["results"]),  # sst 80, stsb 50
        "eval-untrained.json": (None, 9.0, zero_shot({"p": 4}, 0.5),  # the twin on other pairs: not beside
                                [{"task": "sst", "metric": "accuracy", "score": 0.6},
                                 {"task": "stsb", "metric": "pearson", "median": 0.3}]),
    }
    for name, (flops, loss, pairs, rows) in evaluations.items():
        trained = {"trained": {"steps": int(flops / 1e11), "tokens": 8192 * int(flops / 1e11), "flops": flops}} if flops else {}
        (run / name).write_text(json.dumps({"heldout": {"loss": loss}, "minimal_pairs": pairs, "results": rows, **trained}))
    xlabel, lines, twins = along_lines(load_run_data(run))
    assert xlabel == "training compute (FLOPs)" and lines == {
        "heldout": [(1e12, 5.0), (2e12, 4.5), (3e12, 4.0)],
        "zero_shot": [(1e12, 50.0), (3e12, 100.0)],  # step 20 scored by another scorer
        "task_mean": [(2e12, 55.0), (3e12, 65.0)]}  # step 10 fine-tuned on sst alone
    assert twins == {"task_mean": 45.0}
    assert 'data-plot="along"' in write_report(run).read_text()

    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "steps": 40}))  # the run went on after its eval.json
    rows = re.findall(r"<tr><td>(.*?)</td></tr>", section(write_report(run).read_text(), "Checkpoints evaluated"))
    assert [re.split(r"</td><td[^>]*>", r)[:2] for r in rows][-1] == ["30", "eval.json (before the run went on)"]

    (run / "eval-step-00000020.json").unlink()
    step_10 = json.loads((run / "eval-step-00000010.json").read_text())
    (run / "eval-step-00000010.json").write_text(json.dumps({**step_10, "trained": {"steps": 30, "flops": 3e12}}))
    assert not _along_drawn([load_run_data(run)])  # the end's compute twice: no line against compute

    (run / "eval-step-00000010.json").write_text(json.dumps({"minimal_pairs": {**step_10["minimal_pairs"], "headline": [1]}}))
    result = CliRunner().invoke(main, ["report", str(run)])
    assert result.exit_code == 1 and result.output.startswith(
        f"Error: {run / 'eval-step-00000010.json'}: minimal_pairs.headline is [1], not a scorer's name"), result.output


def test_train_losses_of_another_masking_rate_are_labelled_and_said_not_to_compare(tmp_path, monkeypatch):
    """Two MLM runs at 40 % and 15 % masking share a loss panel (their held-out losses compare), but their
    train losses measure different tasks: each train curve names its rate, and a note says so. A rate left
    at its default equals the same rate written out."""
    from cramlm.report import plots

    runs = {}
    for name, rate in (("m40", "0.4"), ("m15", "0.15"), ("m25", None), ("m25b", "0.25")):
        folder = demo_like_run(tmp_path / name, {"sst": ("accuracy", 0.6, 0.5)})
        config = folder / "config.yaml"
        text = config.read_text().replace("name: r\n", f"name: {name}\n")
        runs[name] = folder
        config.write_text(text.replace("batch_ramp: 0.0}", f"batch_ramp: 0.0, mlm_probability: {rate}}}") if rate else text)
    assert load_run_data(runs["m40"]).train_task == {"mlm_probability": 0.4}
    assert load_run_data(runs["m25"]).train_task == {"mlm_probability": 0.25}  # the default

    drawn = {}
    save = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, path: drawn.setdefault(path.stem, fig) and save(fig, path))
    html = write_report(runs["m40"], runs["m15"], out=tmp_path / "cmp").read_text()
    (ax,) = drawn["loss_vs_tokens"].axes  # one objective and tokenizer: one panel
    labels = [line.get_label() for line in ax.get_lines()]
    assert "m40 train (mlm_probability 0.4)" in labels and "m15 train (mlm_probability 0.15)" in labels
    assert "train on different tasks (m40 mlm_probability 0.4; m15 mlm_probability 0.15)" in html

    drawn.clear()
    html = write_report(runs["m25"], runs["m25b"], out=tmp_path / "same").read_text()
    assert "train on different tasks" not in html
    assert [line.get_label() for line in drawn["loss_vs_tokens"].axes[0].get_lines()] == ["m25 train", "m25b train"]


def test_an_electra_run_draws_its_generator_mlm_on_the_generator_mlm_axis(tmp_path, monkeypatch):
    """ELECTRA minimises generator MLM + 50 x detector BCE (~22 nats when the generator's MLM is ~4): the
    panel of the held-out "RTD generator MLM" loss draws the logged generator MLM (mlm_loss) as the train
    curve, and the runs table names the sum it states. A run without mlm_loss lines draws its loss, and
    its label says it is the sum."""
    from cramlm.report import plots

    folder = demo_like_run(tmp_path / "e", {"sst": ("accuracy", 0.6, 0.5)})
    config = folder / "config.yaml"
    config.write_text(config.read_text().replace("batch_ramp: 0.0}", "batch_ramp: 0.0, objective: rtd, rtd: {rtd_weight: 40.0}}"))
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    for line in lines:
        line.update(mlm_loss=line["loss"] - 4, rtd_loss=0.4, loss=line["loss"] - 4 + 40 * 0.4)
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    run = load_run_data(folder)
    assert run.objective == "rtd" and run.train_task == {"mlm_probability": 0.25, "rtd.rtd_weight": 40.0}
    default = demo_like_run(tmp_path / "d", {"sst": ("accuracy", 0.6, 0.5)})
    (default / "config.yaml").write_text((default / "config.yaml").read_text().replace("batch_ramp: 0.0}", "batch_ramp: 0.0, objective: rtd}"))
    assert load_run_data(default).train_task == {"mlm_probability": 0.25, "rtd.rtd_weight": 50.0}  # ELECTRA's default

    drawn = {}
    save = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, path: drawn.setdefault(path.stem, fig) and save(fig, path))
    html = write_report(folder).read_text()
    (ax,) = drawn["loss_vs_tokens"].axes
    (train,) = ax.get_lines()
    assert ax.get_ylabel() == "RTD generator MLM loss (nats per token)"
    assert train.get_label() == "train (generator MLM)" and list(train.get_ydata()) == [line["mlm_loss"] for line in lines]
    row = next(r for r in html.split("<tr>") if r.startswith("<td>Train loss, first"))
    assert "(generator MLM + 40 x detector BCE)" in row

    for line in lines:
        del line["mlm_loss"]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    drawn.clear()
    write_report(folder)
    (train,) = drawn["loss_vs_tokens"].axes[0].get_lines()
    assert train.get_label() == "train (generator MLM + 40 x detector BCE)"
    assert list(train.get_ydata()) == [line["loss"] for line in lines]
    # rtd_weight changed on a resume (50 to step 4, 40 after): the words keep the key's name, not a number
    segment = {"train": {"objective": "rtd", "rtd": {"rtd_weight": 50.0}}}
    (folder / "config-history.jsonl").write_text("\n".join(json.dumps(line) for line in [
        {"step": 0, "changes": {}, "config": segment},
        {"step": 4, "changes": {"train.rtd.rtd_weight": [50.0, 40.0]}, "config": {"train": {"objective": "rtd", "rtd": {"rtd_weight": 40.0}}}}]))
    run = load_run_data(folder)
    assert run.train_task["rtd.rtd_weight"] == "50 → 40 at step 4"
    assert run.train_loss_words == "generator MLM + rtd_weight x detector BCE"


def electra_run(folder: Path, name: str, weight: str | None) -> Path:
    """A demo-like ELECTRA run logging its generator's MLM (mlm_loss) beside the sum it minimises."""
    folder = demo_like_run(folder, {"sst": ("accuracy", 0.6, 0.5)})
    config = folder / "config.yaml"
    text = config.read_text().replace("name: r\n", f"name: {name}\n")
    config.write_text(text.replace("batch_ramp: 0.0}", "batch_ramp: 0.0, objective: rtd" + (f", rtd: {{rtd_weight: {weight}}}" if weight else "") + "}"))
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    for line in lines:
        line.update(mlm_loss=line["loss"], rtd_loss=0.4, loss=line["loss"] + 20)
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return folder


def test_electra_runs_differing_in_rtd_weight_share_their_train_curves_not_their_sums(tmp_path, monkeypatch):
    """ELECTRA's drawn train curve is its generator's MLM, which rtd_weight does not change: runs at two
    weights draw unlabelled curves, and the note says that only the sums they minimised do not compare.
    A weight written as an integer is the default 50.0, not another task."""
    from cramlm.report import plots

    a, b, c = (electra_run(tmp_path / n, n, w) for n, w in (("w10", "10"), ("w50", "50"), ("default", None)))
    assert load_run_data(b).train_task["rtd.rtd_weight"] == 50 and load_run_data(c).train_task["rtd.rtd_weight"] == 50.0
    assert train_task_differences([load_run_data(b), load_run_data(c)]) == []
    assert train_task_differences([load_run_data(a), load_run_data(c)]) == ["rtd.rtd_weight"]
    assert train_task_differences([load_run_data(a), load_run_data(c)], curve=True) == []

    drawn = {}
    save = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, path: drawn.setdefault(path.stem, fig) and save(fig, path))
    html = write_report(a, c, out=tmp_path / "cmp").read_text()
    assert [line.get_label() for line in drawn["loss_vs_tokens"].axes[0].get_lines()] == [
        "w10 train (generator MLM)", "default train (generator MLM)"]
    assert ("train on different tasks (w10 rtd.rtd_weight 10; default rtd.rtd_weight 50), so the losses they minimised "
            "(the runs table's train loss) do not compare; their train curves (generator MLM) do") in html
    assert "(generator MLM + 10 x detector BCE)" in html and "(generator MLM + 50 x detector BCE)" in html
    drawn.clear()
    assert "train on different tasks" not in write_report(b, c, out=tmp_path / "same").read_text()


def test_a_masking_rate_changed_on_a_resume_labels_the_run_with_both(tmp_path, monkeypatch):
    """A run resumed with --allow-change train.mlm_probability (config-history.jsonl: 0.15 from step 0, 0.4
    from step 1,200) trained two tasks: its train task says so, and it differs from a run at 0.4 throughout."""
    from cramlm.report import plots

    runs = {}
    for name in ("changed", "m40"):
        folder = demo_like_run(tmp_path / name, {"sst": ("accuracy", 0.6, 0.5)})
        config = folder / "config.yaml"
        text = config.read_text().replace("name: r\n", f"name: {name}\n")
        config.write_text(text.replace("batch_ramp: 0.0}", "batch_ramp: 0.0, mlm_probability: 0.4}"))
        runs[name] = folder
    segment = {"name": "changed", "train": {"mlm_probability": 0.15}}
    (runs["changed"] / "config-history.jsonl").write_text("\n".join(json.dumps(line) for line in [
        {"step": 0, "changes": {}, "config": segment},
        {"step": 1200, "changes": {"train.mlm_probability": [0.15, 0.4]}, "config": {**segment, "train": {"mlm_probability": 0.4}}},
        {"step": 1800, "changes": {"impl.threads": [1, 2]}, "config": {**segment, "train": {"mlm_probability": 0.4}}},
    ]) + "\n{torn")
    assert load_run_data(runs["changed"]).train_task == {"mlm_probability": "0.15 → 0.4 at step 1,200"}
    history = (runs["changed"] / "config-history.jsonl").read_text()
    went_back = {"step": 800.0, "changes": {}, "config": segment}  # resumed from step 800, before the change: it goes
    (runs["changed"] / "config-history.jsonl").write_text(history.replace("\n{torn", "\n" + json.dumps(went_back) + "\n"))
    (runs["changed"] / "config.yaml").write_text((runs["changed"] / "config.yaml").read_text().replace("0.4", "0.15"))
    assert load_run_data(runs["changed"]).train_task == {"mlm_probability": 0.15}
    again = {"step": 1500.0, "changes": {"train.mlm_probability": [0.15, 0.4]}, "config": {**segment, "train": {"mlm_probability": 0.4}}}
    (runs["changed"] / "config-history.jsonl").write_text(history.replace("\n{torn", "\n" + json.dumps(went_back) + "\n" + json.dumps(again)))
    (runs["changed"] / "config.yaml").write_text((runs["changed"] / "config.yaml").read_text().replace("0.15", "0.4"))
    assert load_run_data(runs["changed"]).train_task == {"mlm_probability": "0.15 → 0.4 at step 1,500"}
    for step in ("x", None, True, -5):  # a hand-edited step: that line is no segment, the others stand
        odd = {"step": step, "changes": {}, "config": {**segment, "train": {"mlm_probability": 0.4}}}
        (runs["changed"] / "config-history.jsonl").write_text(history.replace("\n{torn", "\n" + json.dumps(odd)))
        assert load_run_data(runs["changed"]).train_task == {"mlm_probability": "0.15 → 0.4 at step 1,200"}, step
    (runs["changed"] / "config-history.jsonl").write_text(history)
    assert load_run_data(runs["m40"]).train_task == {"mlm_probability": 0.4}  # no history: its config.yaml
    config, text = runs["m40"] / "config.yaml", (runs["m40"] / "config.yaml").read_text()
    for damaged, key in (("arch: 5", "arch"), ("train: [1, 2]", "train"), ("train: {optim: 0.1}", "train.optim")):
        config.write_text(damaged + "\n")
        with pytest.raises(ValueError, match=rf"config.yaml: {key} is .*, not a mapping of its settings"):
            load_run_data(runs["m40"])
    config.write_text(text)

    drawn = {}
    save = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, path: drawn.setdefault(path.stem, fig) and save(fig, path))
    html = write_report(runs["changed"], runs["m40"], out=tmp_path / "cmp").read_text()
    assert "changed train (mlm_probability 0.15 → 0.4 at step 1,200)" in [
        line.get_label() for line in drawn["loss_vs_tokens"].axes[0].get_lines()]
    assert "train on different tasks (changed mlm_probability 0.15 → 0.4 at step 1,200; m40 mlm_probability 0.4)" in html


def test_a_hybrid_runs_train_curve_says_it_mixes_the_causal_rows_in(tmp_path):
    """The hybrid minimises the masked next-token and causal losses weighted by their shares of the rows, and
    its held-out loss is masked next-token alone: its train curve says what it is."""
    folder = demo_like_run(tmp_path / "h", {"sst": ("accuracy", 0.6, 0.5)})
    (folder / "config.yaml").write_text((folder / "config.yaml").read_text().replace(
        "batch_ramp: 0.0}", "batch_ramp: 0.0, objective: hybrid, hybrid: {causal_fraction: 0.125}}"))
    run = load_run_data(folder)
    assert run.train_curve == ("loss", "masked next-token + causal shares")
    assert run.train_task == {"mlm_probability": 0.25, "hybrid.causal_fraction": 0.125}


def test_a_number_past_floats_range_in_a_run_file_is_not_a_number_and_the_report_is_written(tmp_path):
    """A hand-edited summary.json or config with 10**400 (valid JSON and YAML): the row is left out, no
    OverflowError."""
    from cramlm.report.rundata import is_number

    assert not is_number(10**400) and not is_number(True) and not is_number(float("nan")) and is_number(3)
    folder = demo_like_run(tmp_path / "r", {"sst": ("accuracy", 0.608, 0.556)})
    summary = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps({**summary, "tokens_per_second": 10**400, "val_loss": 10**400}))
    config = folder / "config.yaml"
    config.write_text(config.read_text().replace("batch_ramp: 0.0}", f"batch_ramp: 0.0, mlm_probability: {10**400}}}"))
    rows = dict(re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td>", section(write_report(folder).read_text(), "Runs")))
    assert "Throughput" not in rows and "Optimizer steps" in rows
