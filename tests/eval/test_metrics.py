"""Metric values against hand-computed cases; the median over seeds; best vs last epoch; means."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cramlm.eval.metrics import harmonic_mean, score, score_all
from cramlm.eval.tables import markdown, means, task_rows, to_csv, verdict, versus, versus_text
from cramlm.eval.tasks import Example, Task

PRED = np.array([1, 1, 1, 0, 0, 1])
GOLD = np.array([1, 1, 0, 0, 1, 1])
# TP = 3, FP = 1, TN = 1, FN = 1


def test_classification_metrics_by_hand():
    assert score("accuracy", PRED, GOLD) == pytest.approx(4 / 6)
    precision, recall = 3 / 4, 3 / 4
    assert score("f1", PRED, GOLD) == pytest.approx(2 * precision * recall / (precision + recall))
    mcc = (3 * 1 - 1 * 1) / math.sqrt((3 + 1) * (3 + 1) * (1 + 1) * (1 + 1))  # (TP TN - FP FN) / sqrt(...)
    assert score("matthews", PRED, GOLD) == pytest.approx(mcc)  # = 0.25
    assert score("f1", np.zeros(4), np.array([0, 1, 0, 1])) == 0.0  # no positive prediction: 0, no warning


def test_regression_metrics_by_hand():
    pred, gold = np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 3.0, 2.0, 5.0])
    # Pearson: deviations (-1.5, -.5, .5, 1.5) and (-1.75, .25, -.75, 2.25); cov 5.5 / sqrt(5 * 8.75)
    assert score("pearson", pred, gold) == pytest.approx(5.5 / math.sqrt(5 * 8.75))
    # Spearman: ranks (1,2,3,4) vs (1,3,2,4): 1 - 6 * sum d^2 / (n (n^2 - 1)) = 1 - 6 * 2 / 60
    assert score("spearman", pred, gold) == pytest.approx(0.8)
    assert score("pearson", np.ones(4), gold) == 0.0  # constant predictions: defined as 0
    assert score_all(["pearson", "spearman"], pred, gold)["spearman"] == pytest.approx(0.8)
    with pytest.raises(ValueError, match="unknown metric"):
        score("auc", pred, gold)


def test_harmonic_mean():
    assert harmonic_mean([0.5, 1.0]) == pytest.approx(2 / (1 / 0.5 + 1 / 1.0))
    # undefined (None), not 0: a Matthews correlation can be 0 or negative, an accuracy 0
    assert harmonic_mean([0.5, -0.1]) is None and harmonic_mean([0.5, 0.0]) is None and harmonic_mean([]) is None


def test_undefined_harmonic_mean_in_tables():
    rows = task_rows(_task(), [_run(0, [0.5, 0.8])]) + task_rows(_task(), [_run(0, [0.4, 0.0])])
    mean = means(rows)
    assert mean["last"]["harmonic"] is None and mean["best"]["harmonic"] == pytest.approx(2 / (1 / 0.8 + 1 / 0.4))
    assert "| **harmonic mean** | | undefined | 53.33 |" in markdown(rows, mean, "title")
    assert to_csv(rows, mean).splitlines()[-1].startswith("harmonic_mean,,undefined,0.533333")


def test_versus_pairs_pretrained_with_the_untrained_twin():
    pretrained = {"results": [{"task": "a", "metric": "accuracy", "score": 0.61, "majority": 0.556},
                              {"task": "b", "metric": "f1", "score": 0.9}],
                  "mean": {"last": {"arithmetic": 0.755}}, "heldout": {"objective": "mlm", "loss": 7.59}}
    untrained = {"results": [{"task": "a", "metric": "accuracy", "score": 0.734}],
                 "mean": {"last": {"arithmetic": 0.734}}, "heldout": {"objective": "mlm", "loss": 9.05}}
    rows = versus(pretrained, untrained)
    assert rows[0]["margin"] == pytest.approx(-0.124) and rows[1]["untrained"] is None and rows[1]["margin"] is None
    text = versus_text(pretrained, untrained)
    assert text.splitlines()[0].split() == ["task", "metric", "pretrained", "untrained", "margin", "majority"]
    assert text.splitlines()[1].split() == ["a", "accuracy", "61.00", "73.40", "-12.40", "55.60"]
    assert "held-out MLM loss" in text and "-1.460" in text
    assert "untrained" in versus_text(pretrained, None) and versus_text(pretrained, None).splitlines()[1].split()[3] == "-"


def test_no_margin_against_a_twin_fine_tuned_by_another_protocol():
    """`cramlm eval` run twice by hand with other settings for the twin: the margin would measure the
    protocols (was: shown); hyperparameters eval.select chose for each model apart may differ."""
    hp = {"lr": 1e-3, "epochs": 3, "batch_size": 16}
    row = {"task": "a", "metric": "accuracy", "score": 0.7, "train_examples": 100, "dev_examples": 50, "hparams": hp}
    for other in ({"hparams": {**hp, "lr": 5e-5}}, {"train_examples": 80}, {"metric": "f1"}):
        twin_row = {**row, "score": 0.6, **other}
        assert versus({"results": [row]}, {"results": [twin_row]})[0]["margin"] is None, other
    same = versus({"results": [row]}, {"results": [{**row, "score": 0.6}]})[0]
    assert same["margin"] == pytest.approx(0.1)
    chose = {**row, "hparams": {**hp, "lr": 3e-3}, "selected": {"lr": 3e-3, "epochs": 3}}
    assert versus({"results": [chose]}, {"results": [{**row, "score": 0.6, "selected": {"lr": 1e-3, "epochs": 3}}]})[0]["margin"] \
        == pytest.approx(0.1)


def _task(splits=("dev",), metrics=("f1", "accuracy")):
    ex = [Example("a", None, 0)]
    return Task("t", ["0", "1"], list(metrics), ex, {s: ex for s in splits})


def _run(seed, f1s, accs=None, split="dev"):
    accs = accs or f1s
    return {"seed": seed, "epochs": [{split: {"f1": f, "accuracy": a}} for f, a in zip(f1s, accs)],
            "train_examples": 10, "dev_examples": {split: 5}, "seconds": 1.0}


def test_median_over_seeds_last_and_best_epoch():
    runs = [_run(0, [0.5, 0.9, 0.6]), _run(1, [0.1, 0.2, 0.3]), _run(2, [0.7, 0.4, 0.8], [0.1, 0.2, 0.35])]
    (row,) = task_rows(_task(), runs)
    assert row["score"] == pytest.approx(0.6)  # median of last epochs 0.6, 0.3, 0.8
    assert row["best"] == pytest.approx(0.8)  # median of bests 0.9, 0.3, 0.8
    assert row["last_metrics"]["accuracy"] == pytest.approx(0.35)  # median of 0.6, 0.3, 0.35
    assert [s["best_epoch"] for s in row["seeds"]] == [2, 3, 3]
    # even number of seeds: the mean of the middle two
    (row,) = task_rows(_task(), runs[:2])
    assert row["score"] == pytest.approx(0.45)


def test_table_outputs_and_means():
    rows = task_rows(_task(), [_run(0, [0.5, 0.8])]) + task_rows(_task(), [_run(0, [0.4, 0.2])])
    mean = means(rows)
    assert mean["last"]["arithmetic"] == pytest.approx(0.5)
    assert mean["best"]["harmonic"] == pytest.approx(2 / (1 / 0.8 + 1 / 0.4))
    md = markdown(rows, mean, "title")
    assert "| t | f1 | 80.00 | 80.00 | accuracy 80.00 | 1 | 10 | 5 | - |" in md
    assert "| **harmonic mean** | | 32.00 |" in md
    csv_text = to_csv(rows, mean)
    assert csv_text.splitlines()[1].startswith("t,f1,0.800000,0.800000,accuracy=0.800000,1,10,5,1.0,")
    assert csv_text.splitlines()[-2].startswith("arithmetic_mean,,0.500000,0.600000")


def test_mnli_style_splits_become_rows():
    runs = [{"seed": 0, "epochs": [{"m": {"accuracy": 0.6}, "mm": {"accuracy": 0.7}}], "train_examples": 3,
             "dev_examples": {"m": 2, "mm": 4}, "seconds": 1.0}]
    rows = task_rows(_task(("m", "mm"), ("accuracy",)), runs)
    assert [(r["task"], r["score"], r["dev_examples"]) for r in rows] == [("t-m", 0.6, 2), ("t-mm", 0.7, 4)]


def test_majority_class_floor():
    from cramlm.eval.tables import majority_scores

    train = [Example("a", None, y) for y in (1, 1, 0)]
    dev = [Example("a", None, y) for y in (1, 0, 0, 1)]
    task = Task("t", ["0", "1"], ["accuracy"], train, {"dev": dev})
    assert majority_scores(task) == {"dev": 0.5} and majority_scores(task, 1) == {"dev": 1.0}
    rows = task_rows(task, [_run(0, [0.6])], majority_scores(task))
    assert rows[0]["majority"] == 0.5 and "| 50.00 |" in markdown(rows, means(rows), "x")
    reg = Task("r", [], ["pearson"], [Example("a", None, 1.0)], {"dev": [Example("b", None, 2.0), Example("c", None, 3.0)]})
    assert majority_scores(reg) == {"dev": 0.0}


def _scored(task: str, score: float, seeds: list[float]) -> dict:
    return {"task": task, "metric": "accuracy", "score": score,
            "seeds": [{"seed": i, "last": {"accuracy": s}} for i, s in enumerate(seeds)]}


def test_verdict_counts_gains_losses_and_seed_noise():
    lm = {"objective": "mlm", "loss": 5.1}
    twin_lm = {"objective": "mlm", "loss": 9.0}
    twin = {"results": [_scored("a", 0.70, [0.69, 0.70, 0.71]), _scored("b", 0.80, [0.80, 0.80, 0.80]),
                        _scored("c", 0.60, [0.6, 0.6, 0.6])], "heldout": twin_lm}
    paid = {"results": [_scored("a", 0.75, [0.74, 0.75, 0.76]), _scored("b", 0.83, [0.83, 0.83, 0.83]),
                        _scored("c", 0.60, [0.6, 0.6, 0.6])], "heldout": lm}
    said = verdict(paid, twin)
    assert said.startswith("pretraining paid: ahead of the untrained twin by >= 2 points on 2 of 3 tasks (a, b), behind by more than 1 point on 0")
    assert "5.10 against the twin's 9.00" in said and "within the fine-tuning seeds' spread on 1" in said
    # level within the seeds' spread on one task, behind on another: did not pay, and says where
    lost = {"results": [_scored("a", 0.71, [0.60, 0.71, 0.80]), _scored("b", 0.70, [0.70, 0.70, 0.70]),
                        _scored("c", 0.61, [0.61, 0.61, 0.61])], "heldout": lm}
    said = verdict(lost, twin)
    assert said.startswith("pretraining did not pay (yet): ahead of the untrained twin by >= 2 points on 0 of 3 tasks, "
                           "behind by more than 1 point on 1 (b)")
    assert "not yet features these fine-tuned tasks need" in said
    assert verdict(paid, None) is None
    # one seed: no spread to be within; a row without a score (hand-made eval.json) is left out
    one = {"results": [_scored("a", 0.70, [0.70]), {"task": "b", "metric": "accuracy", "median": 0.8, "seeds": 3}]}
    said = verdict(one, {"results": [_scored("a", 0.70, [0.70]), _scored("b", 0.7, [0.7])]})
    assert said == "pretraining did not pay (yet): ahead of the untrained twin by >= 2 points on 0 of 1 task, behind by more than 1 point on 0."
    assert verdict({"results": [_scored("a", 0.82, [0.82])]}, {"results": [_scored("a", 0.80, [0.80])]}).startswith(
        "pretraining paid: ahead of the untrained twin by >= 2 points on 1 of 1 task")  # 0.82 - 0.80 counts as 2 points


def _pairs(accuracies: dict[str, float], pairs: int = 300) -> dict:
    paradigms = {name: {"accuracy": a, "ties": 0.0, "pairs": pairs, "phenomenon": name} for name, a in accuracies.items()}
    return {"headline": "log-probability", "scores": {"log-probability": {"paradigms": paradigms}}}


def test_zero_shot_verdict_counts_paradigms_beyond_two_standard_errors():
    from cramlm.eval.pairs import pairs_verdict
    from cramlm.eval.tables import verdict

    twin = _pairs({"swap": 0.50, "replace": 0.52, "shuffle": 0.50})
    # 300 pairs a side: two standard errors of a margin near 50% are ~8 points; 5 points is level
    said = pairs_verdict(_pairs({"swap": 0.78, "replace": 0.57, "shuffle": 0.86}), twin)
    assert said.startswith("zero-shot, pretraining paid: it prefers the acceptable sentence of a minimal pair more often "
                           "than the untrained twin, by more than two standard errors, on 2 of 3 paradigms, less often on 0 "
                           "(swap 78.0 against 50.0, replace 57.0 against 52.0")
    assert pairs_verdict(_pairs({"swap": 0.78, "replace": 0.40, "shuffle": 0.86}), twin).startswith(
        "zero-shot, pretraining did not pay (yet)")  # behind on one
    assert pairs_verdict(_pairs({"swap": 0.78}), None) is None and pairs_verdict(None, twin) is None
    # in the whole verdict: what paid first (here zero-shot), each kind named, then the held-out loss
    lm, twin_lm = {"objective": "hybrid", "loss": 5.9}, {"objective": "hybrid", "loss": 9.0}
    pretrained = {"results": [_scored("a", 0.70, [0.70, 0.71])], "heldout": lm, "minimal_pairs": _pairs({"swap": 0.78})}
    untrained = {"results": [_scored("a", 0.73, [0.73, 0.72])], "heldout": twin_lm, "minimal_pairs": _pairs({"swap": 0.5})}
    said = verdict(pretrained, untrained)
    assert said.startswith("zero-shot, pretraining paid: it prefers the acceptable sentence of a minimal pair more often "
                           "than the untrained twin, by more than two standard errors, on 1 of 1 paradigm, less often on 0 "
                           "(swap 78.0 against 50.0; % by log-probability). Fine-tuned, pretraining did not pay (yet): "
                           "ahead of the untrained twin by >= 2 points on 0 of 1 task, behind by more than 1 point on 1 (a). "
                           "Held-out hybrid masked next-token loss 5.90"), said
    # neither paid: the fine-tuned sentence first, as when there are no pairs
    behind = {**pretrained, "minimal_pairs": _pairs({"swap": 0.52})}
    assert verdict(behind, untrained).startswith("fine-tuned, pretraining did not pay (yet): ahead of the untrained twin "
                                                 "by >= 2 points on 0 of 1 task, behind by more than 1 point on 1 (a). "
                                                 "Zero-shot, pretraining did not pay (yet)")
    assert "a minute pays zero-shot on word order in held-out text and on no fine-tuned task" in said
    # zero-shot pairs alone still get a verdict
    assert verdict({"results": [], "minimal_pairs": _pairs({"swap": 0.78})}, {"minimal_pairs": _pairs({"swap": 0.5})}).startswith(
        "zero-shot, pretraining paid")


def test_a_held_out_loss_is_named_as_its_objective_names_it():
    """The objective component's own words (its loss_title): an RTD run's loss is its generator's MLM,
    the hybrid's a masked next-token loss; a name no component registers is shown as given."""
    from cramlm.eval.tables import objective_label

    assert [objective_label(o) for o in ("mlm", "clm", "rtd", "hybrid", "someone-elses")] == [
        "MLM", "causal LM", "RTD generator MLM", "hybrid masked next-token", "someone-elses"]
    twin = {"results": [], "mean": {"last": {"arithmetic": 0.5}}, "heldout": {"objective": "hybrid", "loss": 9.0}}
    run = {**twin, "heldout": {"objective": "hybrid", "loss": 6.0}}
    assert "held-out hybrid masked next-token loss" in versus_text(run, twin)


def test_a_twin_of_another_objective_is_not_set_against_the_runs_held_out_loss():
    """A twin scored as an MLM beside a hybrid run (a twin left from another objective): its held-out
    loss measures another task, so neither the table nor the verdict compares the two."""
    twin = {"results": [], "mean": {"last": {"arithmetic": 0.5}}, "heldout": {"objective": "mlm", "loss": 9.0},
            "minimal_pairs": _pairs({"swap": 0.5})}
    run = {**twin, "heldout": {"objective": "hybrid", "loss": 6.0}, "minimal_pairs": _pairs({"swap": 0.78})}
    row = next(line for line in versus_text(run, twin).splitlines() if line.startswith("held-out"))
    assert row.split()[-2:] == ["-", "-"], row  # the twin's column and the margin
    assert "against the twin's" not in verdict(run, twin)
    same = {**twin, "heldout": {"objective": "hybrid", "loss": 9.0}}
    assert "loss 6.00 against the twin's 9.00" in verdict(run, same)
