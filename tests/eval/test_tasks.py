"""Task loading: every GLUE task's official layout, custom TSV/CSV/JSONL tasks, clear errors."""

from __future__ import annotations

import json

import pytest

from cramlm.eval.glue import GLUE, glue_task
from cramlm.eval.tasks import TaskError, load_task
from tests.eval.glue_fixtures import write_glue


@pytest.fixture
def glue_dir(tmp_path):
    return write_glue(tmp_path / "glue_data")


# name -> (train size, {split: dev size}, labels, first train example (a, b, label))
EXPECTED = {
    "cola": (3, {"dev": 2}, ["0", "1"], ("Our friends won't buy this analysis.", None, 1)),
    "sst2": (3, {"dev": 2}, ["0", "1"], ("hide new secretions from the parental units ", None, 0)),
    "mrpc": (2, {"dev": 2}, ["0", "1"], ("Amrozi accused his brother .", "Referring to him , Amrozi accused his brother .", 1)),
    "qqp": (2, {"dev": 2}, ["0", "1"], ("How is the life of a math student?", "Which level of prepration is enough?", 0)),
    "stsb": (2, {"dev": 2}, [], ("A plane is taking off.", "An air plane is taking off.", 5.0)),
    "mnli": (3, {"m": 1, "mm": 2}, ["entailment", "neutral", "contradiction"],
             ("Conceptually cream skimming has two dimensions.", "Product and geography are what make it work.", 1)),
    "qnli": (2, {"dev": 1}, ["entailment", "not_entailment"],
             ("When did the third Digimon series begin?", "Unlike the two seasons before it, Digimon Tamers takes a darker turn.", 1)),
    "rte": (2, {"dev": 1}, ["entailment", "not_entailment"],
            ("No Weapons of Mass Destruction Found in Iraq Yet.", "Weapons of Mass Destruction Found in Iraq.", 1)),
    "wnli": (2, {"dev": 1}, ["0", "1"],
             ("I stuck a pin through a carrot. When I pulled the pin out, it had a hole.", "The carrot had a hole.", 1)),
}


@pytest.mark.parametrize("name", sorted(GLUE))
def test_each_glue_layout_parses(glue_dir, name):
    task = load_task(f"glue:{name}", str(glue_dir))
    n_train, dev_sizes, labels, (a, b, label) = EXPECTED[name]
    assert task.name == name
    assert len(task.train) == n_train
    assert {split: len(exs) for split, exs in task.dev.items()} == dev_sizes
    assert task.labels == labels
    first = task.train[0]
    assert (first.text_a, first.text_b, first.label) == (a, b, label)


def test_glue_metrics_as_cramming_reports(glue_dir):
    assert load_task("glue:cola", str(glue_dir)).metrics == ["matthews"]
    assert load_task("glue:mrpc", str(glue_dir)).metrics == ["f1", "accuracy"]
    assert load_task("glue:qqp", str(glue_dir)).metrics == ["f1", "accuracy"]
    stsb = load_task("glue:stsb", str(glue_dir))
    assert stsb.metrics == ["pearson", "spearman"] and stsb.is_regression and stsb.num_outputs == 1
    assert load_task("glue:sst-2", str(glue_dir)).metric == "accuracy"  # alias
    mnli = load_task("glue:mnli", str(glue_dir))
    assert mnli.dev["mm"][0].label == 2  # contradiction, read from gold_label (the last column)


def test_qqp_skips_malformed_rows_and_says_so(glue_dir):
    task = load_task("glue:qqp", str(glue_dir))
    assert list(task.skipped.values()) == [1]


def test_glue_errors(glue_dir, tmp_path):
    with pytest.raises(TaskError, match="eval.glue_dir"):
        load_task("glue:cola", None)
    with pytest.raises(TaskError, match="unknown GLUE task"):
        glue_task("colaa")
    with pytest.raises(TaskError, match="RTE"):
        load_task("glue:rte", str(tmp_path))
    (glue_dir / "CoLA" / "dev.tsv").write_text("gj04\t1\t\tfine.\ngj04\t2\t*\tbad label.\n")
    with pytest.raises(TaskError, match=r"CoLA/dev.tsv:2: label '2' is not one of"):
        load_task("glue:cola", str(glue_dir))


def test_shared_tasks_load(shared_data):
    for folder in sorted((shared_data / "tasks").iterdir()):
        meta = json.loads((folder / "task.json").read_text())
        task = load_task(str(folder))
        assert task.name == meta["name"]
        assert len(task.train) == meta["num_train"]
        assert len(task.dev["dev"]) == meta["num_dev"]
        assert task.labels == meta["labels"]
        assert task.metric == meta["metric"]


def _write(folder, files: dict[str, str], meta: dict | None = None):
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    if meta is not None:
        (folder / "task.json").write_text(json.dumps(meta))
    return folder


def test_custom_csv_jsonl_and_inline(tmp_path):
    csv_task = _write(
        tmp_path / "csvtask",
        {"train.csv": 'text,y\n"good, really",pos\nbad,neg\n', "dev.csv": "text,y\nfine,pos\n"},
        {"columns": {"sentence1": "text", "label": "y"}, "labels": ["neg", "pos"], "metric": ["accuracy", "f1"]},
    )
    task = load_task(str(csv_task))
    assert task.name == "csvtask" and task.train[0].text_a == "good, really" and task.train[0].label == 1
    assert task.metrics == ["accuracy", "f1"]

    jsonl = _write(
        tmp_path / "jl",
        {
            "train.jsonl": '{"q": "a?", "p": "b", "score": 1.5}\n{"q": "c?", "p": "d", "score": 0}\n',
            "dev.jsonl": '{"q": "e?", "p": "f", "score": 2}\n',
        },
    )
    spec = {"path": str(jsonl), "name": "sim", "columns": {"sentence1": "q", "sentence2": "p", "label": "score"}, "metric": "spearman"}
    task = load_task(spec)
    assert task.is_regression and task.train[1].label == 0.0 and task.dev["dev"][0].text_b == "f"

    # a folder without task.json: columns found by name, labels = sorted distinct training labels
    plain = _write(tmp_path / "plain", {"train.tsv": "sentence\tlabel\nx\tb\ny\ta\n", "dev.tsv": "sentence\tlabel\nz\ta\n"})
    task = load_task(str(plain))
    assert task.labels == ["a", "b"] and task.train[0].label == 1
    # inline keys refine a folder's task.json
    task = load_task({"path": str(csv_task), "name": "renamed"})
    assert task.name == "renamed" and task.labels == ["neg", "pos"]


def test_errors_name_file_and_line(tmp_path):
    good = {"train.tsv": "sentence\tlabel\nx\t0\ny\t1\n", "dev.tsv": "sentence\tlabel\nz\t0\n"}
    with pytest.raises(TaskError, match="no such task folder"):
        load_task(str(tmp_path / "nope"))
    missing = _write(tmp_path / "missing", {"train.tsv": good["train.tsv"]})
    with pytest.raises(TaskError, match=r"missing: no dev file"):
        load_task(str(missing))
    ragged = _write(tmp_path / "ragged", {**good, "dev.tsv": "sentence\tlabel\nz\t0\nw\t1\textra\n"})
    with pytest.raises(TaskError, match=r"ragged/dev.tsv:3: 3 fields, the header has 2"):
        load_task(str(ragged))
    bad_json = _write(tmp_path / "badjson", good)
    (bad_json / "task.json").write_text('{"name": "x",\n "metric": }')
    with pytest.raises(TaskError, match=r"badjson/task.json:2: invalid JSON"):
        load_task(str(bad_json))
    typo = _write(tmp_path / "typo", good, {"metrc": "f1", "labels": ["0", "1"]})
    with pytest.raises(TaskError, match=r"metrc: unknown key\. Did you mean 'metric'\?"):
        load_task(str(typo))
    col = _write(tmp_path / "col", good, {"columns": {"sentence1": "sentense", "label": "label"}, "labels": ["0", "1"]})
    with pytest.raises(TaskError, match=r"col/train.tsv:1: columns.sentence1 'sentense' is not in the header.*'sentence'"):
        load_task(str(col))
    metric = _write(tmp_path / "metric", good, {"metric": "auc", "labels": ["0", "1"]})
    with pytest.raises(TaskError, match="unknown metric 'auc'"):
        load_task(str(metric))
    regr = _write(tmp_path / "regr", {**good, "dev.tsv": "sentence\tlabel\nz\thigh\n"}, {"metric": "pearson"})
    with pytest.raises(TaskError, match=r"regr/dev.tsv:2: regression label 'high' is not a number"):
        load_task(str(regr))
    jl = _write(tmp_path / "jl", {"train.jsonl": '{"sentence": "a", "label": 0}\n{"sentence": "b"\n', "dev.jsonl": ""})
    with pytest.raises(TaskError, match=r"jl/train.jsonl:2: invalid JSON"):
        load_task(str(jl))
    empty = _write(tmp_path / "empty", {**good, "dev.tsv": "sentence\tlabel\n"})
    with pytest.raises(TaskError, match=r"empty/dev.tsv: no examples"):
        load_task(str(empty))
