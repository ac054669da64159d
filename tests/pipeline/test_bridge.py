"""benchmarks/bridge.py: the long run's and the branches' commands (each budget's warm-up the same
in absolute terms, the branch's changes allowed), which checkpoint a branch starts from, and the
summary table read from finished run folders."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bridge  # noqa: E402


def _checkpoint(run: Path, step: int, flops: float) -> None:
    folder = run / "checkpoints" / f"step-{step:08d}"
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps({"usage": {"flops": flops}}))


def test_warmup_is_the_same_in_absolute_terms_and_a_branch_may_change_only_its_budget_and_warmup(tmp_path):
    long = bridge.long_cmd(tmp_path, "rtd", 0)
    assert "train.schedule.warmup=0.00625" in long and f"train.budget.flops={8 * bridge.HOUR:.6g}" in long
    branch = bridge.branch_cmd(tmp_path, "adamw", 1, 2, tmp_path / "ckpt")
    assert "train.schedule.warmup=0.025" in branch and "seed=1" in branch and "train.optim.type=adamw" in branch
    assert branch[branch.index("--resume") + 1] == str(tmp_path / "ckpt")
    allowed = [branch[i + 1] for i, a in enumerate(branch) if a == "--allow-change"]
    assert allowed == ["train.budget.flops", "train.schedule.warmup"]


def test_a_branch_starts_from_the_newest_checkpoint_before_its_decay_once_the_long_run_passed_it(tmp_path):
    run = tmp_path / "wsd-rtd-s0"
    decay_starts = (1 - bridge.DECAY) * bridge.HOUR
    _checkpoint(run, 200, 0.5 * decay_starts)
    _checkpoint(run, 400, 0.99 * decay_starts)
    assert bridge.branch_point(run, 1) is None  # the long run may still write a closer one
    _checkpoint(run, 600, 1.2 * decay_starts)
    assert bridge.branch_point(run, 1).name == "step-00000400"


def test_summary_table_has_each_point_its_twin_and_zero_shot(tmp_path):
    run = tmp_path / "wsd-rtd-s0-1x"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"steps": 10, "tokens": 1, "flops": bridge.HOUR, "val_loss": 4.2,
                                                  "objective": "rtd"}))
    ev = {"mean": {"last": {"arithmetic": 0.7}}, "heldout": {"loss": 4.1},
          "results": [{"task": "spam", "metric": "f1", "score": 0.9, "seeds": [{"last": {"f1": 0.9}}]}],
          "minimal_pairs": {"headline": "detector", "scores": {
              "detector": {"accuracy": 0.61, "phenomena": {}, "paradigms": {  # one paradigm passed outright, one a coin
                  "a": {"accuracy": 0.72, "pairs": 300}, "b": {"accuracy": 0.5, "pairs": 300}}},
              "generator word-l2r": {"accuracy": 0.55}}}}  # a record without its paradigms: no count
    (run / "eval.json").write_text(json.dumps(ev))
    (run / "eval-untrained.json").write_text(json.dumps({**ev, "minimal_pairs": None, "heldout": None}))
    (run / "pipeline.json").write_text(json.dumps({"stages": {"pretrain": {"status": "done", "finished": "2026-12-07T14:10:51+00:00"}}}))
    machine = {"host": "vm", "boot_id": "b090b6c3", "cpu": "AMD EPYC", "x86_family": 25}
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in [
        {"kind": "segment", "step": 0, "wall": "2026-12-07T12:09:52Z", "machine": machine},
        {"kind": "train", "step": 10, "loss": 4.0}]) + "\n")
    result = bridge.summarize(tmp_path)
    assert result["points"]["wsd-rtd-s0-1x"]["multiple"] == 1 and set(result["twins"]) == {"rtd"}
    ran = result["points"]["wsd-rtd-s0-1x"]["ran"]
    assert ran["trained"] == "2026-12-07T14:10:51+00:00" and ran["evaluated"].endswith("+00:00")
    assert len(ran["machines"]) == 1 and "AMD EPYC" in ran["machines"][0]
    text = bridge.table(result)
    assert "| wsd-rtd-s0-1x | 1 | 4.100 | 90.0 | 70.0 | 61.0 (detector; 1 / 0) |" in text
    assert "| untrained twin (rtd) | 0 | - | 90.0 | 70.0 | - |" in text


def test_a_second_untrained_twin_for_a_line_is_refused_not_silently_swapped(tmp_path):
    ev = {"mean": {"last": {"arithmetic": 0.7}}, "results": [], "minimal_pairs": None}
    for seed in (0, 1):
        run = tmp_path / f"own-rtd-s{seed}-1x"
        run.mkdir()
        (run / "summary.json").write_text(json.dumps({"steps": 10, "tokens": 1, "flops": bridge.HOUR, "val_loss": 4.2}))
        (run / "eval-untrained.json").write_text(json.dumps(ev))
    with pytest.raises(SystemExit, match=r"own-rtd-s1-1x/eval-untrained.json: a second untrained twin for line rtd"):
        bridge.summarize(tmp_path)


def test_summary_keeps_an_earlier_summarys_rows_made_by_other_code_beside_and_replaces_its_own(tmp_path):
    out = tmp_path / "bridge"
    run = out / "wsd-rtd-s0-1x"
    run.mkdir(parents=True)
    (out / "COMMIT").write_text("70188c8 (git archive), fp32\n")
    (run / "summary.json").write_text(json.dumps({"steps": 10, "tokens": 1, "flops": bridge.HOUR, "val_loss": 4.2}))
    earlier = {"points": {"wsd-rtd-s0-1x": {"multiple": 1, "val_loss": 5.0, "eval": None, "code": "e58c713-bf16"},
                          "wsd-rtd-s0-2x": {"multiple": 2, "val_loss": 4.9, "eval": None}},
               "twins": {}}
    (tmp_path / "points.json").write_text(json.dumps(earlier))
    result = bridge.summarize(out, tmp_path / "points.json")
    assert result["points"]["wsd-rtd-s0-1x"]["code"] == "70188c8"
    assert set(result["points"]) == {"wsd-rtd-s0-1x", "wsd-rtd-s0-1x@e58c713-bf16", "wsd-rtd-s0-2x@earlier"}
    (tmp_path / "points.json").write_text(json.dumps(result))
    assert bridge.summarize(out, tmp_path / "points.json") == result  # merging its own summary changes nothing
    other = out / "own-prose-s0-1x"
    other.mkdir()
    (other / "summary.json").write_text(json.dumps({"steps": 10, "tokens": 1, "flops": bridge.HOUR, "val_loss": 4.0}))
    (out / "COMMIT.own-prose-s0-1x").write_text("abc1234\n")
    assert bridge.summarize(out)["points"]["own-prose-s0-1x"]["code"] == "abc1234"
    assert "| wsd-rtd-s0-1x@e58c713-bf16 | 1 | 5.000 |" in bridge.table(result)
    import shutil

    shutil.rmtree(run)  # its machine lost: the row, made by this code, keeps its name (not NAME@70188c8)
    assert set(bridge.summarize(out, tmp_path / "points.json")["points"]) == set(result["points"]) | {"own-prose-s0-1x"}


def test_the_plot_has_a_panel_per_task_and_zero_shot(tmp_path):
    ev = {"tasks": {"spam": {"median": 0.9}}, "mean": 0.9, "zero_shot": {"detector": 0.52}, "zero_shot_headline": "detector"}
    result = {"points": {"wsd-rtd-s0-1x": {"multiple": 1, "eval": ev, "code": "a"},
                         "wsd-rtd-s0-2x@b": {"multiple": 2, "eval": ev, "code": "b"},
                         "own-hybrid-s1-4x": {"multiple": 4, "eval": None}},
              "twins": {"rtd": ev, "adamw@b": ev}}
    assert bridge.parse("wsd-rtd-s0-2x@b") == {"schedule": "wsd", "line": "rtd", "seed": 0, "code": "b"}
    assert bridge.parse("own-rtd-s1-1x-nsf32") == {"schedule": "own", "line": "rtd+nsf32", "seed": 1, "code": None}
    bridge.plot(result, tmp_path / "points.png")
    assert (tmp_path / "points.png").read_bytes()[:4] == b"\x89PNG"


def test_a_lines_points_from_different_code_are_one_line_per_precision():
    ev = {"tasks": {}}
    points = {"wsd-rtd-s0-1x@70188c8": {"multiple": 1, "eval": ev}, "wsd-rtd-s0-4x": {"multiple": 4, "eval": ev, "code": "af07c0f"},
              "wsd-rtd-s0-2x@e58c713-bf16": {"multiple": 2, "eval": ev}, "own-rtd-s1-1x-nsf32": {"multiple": 1, "eval": ev, "code": "bb8e3bb"}}
    groups = bridge.plot_groups(points)
    assert sorted(groups) == [("own", "rtd+nsf32", "fp32"), ("wsd", "rtd", "bf16"), ("wsd", "rtd", "fp32")]
    assert sorted(m for m, _, _ in groups[("wsd", "rtd", "fp32")]) == [1, 4]


def _ev(median: float, seeds: list[float], macro: float, phen: dict[str, float]) -> dict:
    return {"tasks": {"spam": {"median": median, "seeds": seeds}}, "zero_shot": {"detector": macro},
            "zero_shot_headline": "detector", "zero_shot_pairs": 1200, "phenomena": phen,
            "phenomenon_pairs": {k: 600 for k in phen}}


def test_where_a_line_leaves_its_twin_by_the_median_and_the_pairs_rule():
    twin = _ev(0.80, [0.79, 0.80, 0.60], 0.50, {"agreement": 0.50, "islands": 0.50})
    points = {  # the 1x point twice: the fp32 one is taken, the bf16 one only where alone (2x)
        "wsd-rtd-s0-1x@old-bf16": {"multiple": 1, "eval": _ev(0.99, [0.99] * 3, 0.50, {"agreement": 0.50, "islands": 0.5})},
        "wsd-rtd-s0-1x": {"multiple": 1, "code": "new", "eval": _ev(0.795, [0.70, 0.795, 0.99], 0.51, {"agreement": 0.53, "islands": 0.45})},
        "wsd-rtd-s0-2x@old-bf16": {"multiple": 2, "eval": _ev(0.81, [0.70, 0.81, 0.82], 0.55, {"agreement": 0.60, "islands": 0.40})},
        "wsd-rtd-s0-4x": {"multiple": 4, "code": "new", "eval": _ev(0.85, [0.5, 0.85, 0.9], 0.52, {"agreement": 0.65, "islands": 0.49})},
        "own-gpt2-s0-1x": {"multiple": 1, "code": "new", "eval": _ev(0.9, [0.9] * 3, 0.6, {})},  # no twin of its line: no rows
    }
    rows = {r["what"]: r for r in bridge.versus({"points": points, "twins": {"rtd@old-bf16": twin}})}
    assert set(rows) == {"spam", "macro (detector)", "agreement", "islands"}
    spam = rows["spam"]["cells"]
    assert spam[1][1:] == (0, False) and abs(spam[1][0] + 0.005) < 1e-9  # within the twin's seeds, fp32 point taken
    assert spam[2][1:] == (1, True) and spam[4][1] == 1  # the median above every twin seed: one collapsed seed moves nothing
    assert rows["spam"]["leaves"] == "2x"
    # zero-shot, 1,200 pairs: 1 point is within the noise, 5 beyond; 600 pairs a phenomenon: 3 points within, 10 beyond
    assert [rows["macro (detector)"]["cells"][k][1] for k in (1, 2, 4)] == [0, 1, 0]
    assert rows["macro (detector)"]["leaves"] == "not by 4x"
    assert [rows["agreement"]["cells"][k][1] for k in (1, 2, 4)] == [0, 1, 1] and rows["agreement"]["leaves"] == "2x"
    assert [rows["islands"]["cells"][k][1] for k in (1, 2, 4)] == [0, -1, 0]
    text = bridge.versus_table({"points": points, "twins": {"rtd@old-bf16": twin}})
    assert "| rtd (wsd, seed 0) | spam | -0.5 | **+1.0†** | **+5.0** | - | 2x |" in text
    assert "| rtd (wsd, seed 0) | islands | -5.0 | *-10.0†* | -1.0 | - | not by 4x |" in text


def test_the_half_line_is_judged_against_the_rtd_twin():
    """data.train_subset keeps the tokenizer and the model: half's untrained twin is rtd's."""
    twin = _ev(0.80, [0.79, 0.80, 0.78], 0.50, {})
    points = {"own-half-s0-1x": {"multiple": 1, "code": "new", "eval": _ev(0.85, [0.85] * 3, 0.50, {})}}
    rows = bridge.versus({"points": points, "twins": {"rtd@old-bf16": twin}})
    assert [(r["line"], r["what"], r["cells"][1][1]) for r in rows if r["kind"] == "task"] == [("half (own, seed 0)", "spam", 1)]


def test_the_masking_rates_are_judged_against_the_masked_lms_twin():
    """train.mlm_probability changes neither the model nor its random weights: mlm15's twin is mlm25's."""
    twin = _ev(0.80, [0.79, 0.80, 0.78], 0.50, {})
    points = {f"own-mlm{p}-s0-1x": {"multiple": 1, "code": "new", "eval": _ev(0.85, [0.85] * 3, 0.50, {})} for p in (15, 40)}
    rows = bridge.versus({"points": points, "twins": {"mlm25@twin-pairs": twin}})
    assert {r["line"] for r in rows if r["kind"] == "task"} == {"mlm15 (own, seed 0)", "mlm40 (own, seed 0)"}


def test_zero_shot_only_twins_stand_for_lines_without_one(tmp_path):
    pairs = {"headline": "log-probability", "scores": {"log-probability": {"accuracy": 0.5, "pairs": 600, "phenomena": {"agreement": 0.5},
             "paradigms": {"p1": {"accuracy": 0.5, "pairs": 600, "phenomenon": "agreement"}}}}}
    untrained = {"results": [], "mean": {"last": {"arithmetic": None}}, "heldout": None, "minimal_pairs": pairs}
    twins = tmp_path / "twin-pairs"
    twins.mkdir()
    for run_name in ("own-gpt2-s0-1x", "own-rtd-s0-1x"):
        (twins / f"{run_name}-untrained.json").write_text(json.dumps(untrained))
    out = tmp_path / "bridge"
    run = out / "own-gpt2-s0-1x"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"steps": 10, "tokens": 1, "flops": bridge.HOUR, "val_loss": 4.0}))
    trained = {**untrained, "results": [{"task": "spam", "metric": "f1", "score": 0.9, "seeds": [{"last": {"f1": 0.9}}]}],
               "mean": {"last": {"arithmetic": 0.9}}, "minimal_pairs": json.loads(json.dumps(pairs).replace("0.5", "0.6"))}
    (run / "eval.json").write_text(json.dumps(trained))
    earlier = {"points": {}, "twins": {"rtd@abc": {"tasks": {}, "zero_shot": {}}}}
    (tmp_path / "points.json").write_text(json.dumps(earlier))
    result = bridge.summarize(out, tmp_path / "points.json", twins)
    assert set(result["twins"]) == {"rtd@abc", "gpt2@twin-pairs"}  # rtd has its twin already
    rows = bridge.versus(result)
    assert [(r["kind"], r["what"], r["cells"][1][1]) for r in rows] == [("zero-shot", "macro (log-probability)", 1),
                                                                        ("zero-shot", "agreement", 1)]
    assert "| untrained twin (gpt2@twin-pairs) | 0 | - | - | - | 50.0 (log-probability; 0 / 0) |" in bridge.table(result)


def test_segments_table_reads_every_run_folder_two_levels_down(tmp_path):
    for rel, lines in {"own-rtd-s0-1x": [{"kind": "train", "step": 1}, {"kind": "train", "step": 2}],
                       "r37/adamw-s0": [{"kind": "train", "step": 1}, {"kind": "event", "event": "interrupted", "step": 1, "signal": "SIGTERM"},
                                        {"kind": "event", "event": "resumed", "step": 1, "from": "c"}, {"kind": "train", "step": 2}]}.items():
        (tmp_path / rel).mkdir(parents=True)
        (tmp_path / rel / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (tmp_path / "r37" / "adamw-s0" / "summary.json").write_text(json.dumps({"steps": 2}))
    rows = bridge.segments_markdown(tmp_path).splitlines()[2:]
    assert [r.split(" | ")[:3] for r in rows] == [["| own-rtd-s0-1x", "1", "0-2"], ["| r37/adamw-s0", "1", "0-1"], ["| r37/adamw-s0", "2", "1-2"]]
    assert rows[0].endswith("running, or cut off after step 2 (last logged) |") and rows[2].endswith("done at step 2 |")
    assert "stopped by SIGTERM after step 1" in rows[1]


def test_status_shows_each_unfinished_runs_rate_and_end_and_each_queues_next_lines(tmp_path):
    """A run at 40% of its budget, 20 steps a minute over its last ten minutes (a cut-off's lines
    trained again not counted), ends in 15 minutes; a finished run is not listed; a queue's notes are not lines."""
    import os
    import time

    run = tmp_path / "own-x-s0-4x"
    run.mkdir()
    lines = [{"kind": "segment", "step": 0}]
    lines += [{"kind": "train", "step": s, "t": s / 500, "elapsed": 3.0 * s} for s in range(10, 210, 10)]
    lines += [{"kind": "segment", "step": 150}]  # resumed from step 150: 160-200 trained again
    lines += [{"kind": "train", "step": s, "t": s / 500, "elapsed": 3.0 * s} for s in range(160, 210, 10)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    done = tmp_path / "own-y-s0-1x"
    done.mkdir()
    (done / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 5, "t": 1.0, "elapsed": 9.0}) + "\n")
    (done / "summary.json").write_text("{}")
    (tmp_path / "queue-0.txt").write_text("# a note\nfirst command\n\nsecond command\n")
    now = time.time()
    os.utime(run / "metrics.jsonl", (now, now))
    text = bridge.status(tmp_path, now)
    (row,) = [x for x in text.splitlines() if x.startswith("| own-")]
    ends = time.strftime("%Y-%m-%d %H:%M", time.gmtime(now + 0.6 / (0.4 / 600)))[:-1]
    assert row.startswith("| own-x-s0-4x | 200 of ~500 | 40.0% | 20 | " + ends), row
    assert "queue-0.txt: 2 lines to run\n  1. first command\n  2. second command" in text
    os.utime(run / "metrics.jsonl", (now - 3600, now - 3600))
    assert "stopped (60 min since its last line)" in bridge.status(tmp_path, now)
