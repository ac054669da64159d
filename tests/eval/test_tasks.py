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
    # ... also after the config is dumped and validated again (config.yaml; `cramlm run`'s eval stage):
    # only the given keys travel, never the other keys' defaults over the folder's task.json
    from cramlm.eval.config import EvalConfig

    again = EvalConfig.model_validate(EvalConfig(tasks=[{"path": str(csv_task), "metric": "f1"}]).model_dump(mode="json"))
    assert again.model_dump(mode="json")["tasks"] == [{"path": str(csv_task), "metric": "f1"}]
    task = load_task(again.tasks[0])
    assert (task.name, task.labels, task.metrics, task.train[0].text_a) == ("csvtask", ["neg", "pos"], ["f1"], "good, really")


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
    # metrics a task cannot have: refused on loading, not after the first epoch's training (sklearn's error)
    mixed = _write(tmp_path / "mixed", good, {"metric": ["pearson", "accuracy"]})
    with pytest.raises(TaskError, match=r"metric accuracy needs classes, but pearson \(the first\) makes this a regression task"):
        load_task(str(mixed))
    three = _write(tmp_path / "three", {"train.tsv": "sentence\tlabel\nx\ta\ny\tb\nw\tc\n", "dev.tsv": "sentence\tlabel\nz\ta\n"},
                   {"metric": "f1"})
    with pytest.raises(TaskError, match=r"metric f1 is binary F1 \(the second label positive\), but the task has 3 labels"):
        load_task(str(three))
    # skip_malformed: a malformed row's fields are no label (was: 'fun' a class, and binary F1 on the wrong one)
    skipping = _write(tmp_path / "skipping", {"train.tsv": "sentence\tlabel\ngood film\tpos\nbad film\tneg\ngreat\tfun\tpos\n"
                                                           "broken row\nawful\tneg\n", "dev.tsv": "sentence\tlabel\nz\tpos\n"},
                      {"metric": "f1", "skip_malformed": True})
    task = load_task(str(skipping))
    assert task.labels == ["neg", "pos"] and len(task.train) == 3
    latin1 = _write(tmp_path / "latin1", good)
    (latin1 / "dev.tsv").write_bytes(b"\xef\xbb\xbfsentence\tlabel\nz\t0\ncaf\xe9\t1\n")  # a BOM, then Latin-1 on line 3
    with pytest.raises(TaskError, match=r"latin1/dev.tsv:3: not UTF-8 text \(byte 0xe9: "):
        load_task(str(latin1))


def test_headerless_mrpc_and_stsb_load_in_the_official_order(tmp_path, capsys):
    """Issue 16.5: MRPC and STS-B copies without a header row stopped the evaluation with
    "columns.sentence1 '#1 String' is not in the header"; they read as the official layout."""
    glue = write_glue(tmp_path / "glue", headerless=("MRPC", "STS-B"))
    assert not (glue / "MRPC" / "train.tsv").read_text().startswith(("\ufeffQuality", "Quality"))
    for name in ("mrpc", "stsb"):
        task = load_task(f"glue:{name}", str(glue))
        n_train, dev_sizes, labels, (a, b, label) = EXPECTED[name]
        assert len(task.train) == n_train and {s: len(e) for s, e in task.dev.items()} == dev_sizes
        assert task.labels == labels and (task.train[0].text_a, task.train[0].text_b, task.train[0].label) == (a, b, label)
        assert len(task.notes) == 2 and all("no header row" in n for n in task.notes)
    assert "no header row" in capsys.readouterr().err  # the log says which layout was assumed
    assert load_task("glue:rte", str(glue)).notes == []  # files with a header: nothing guessed


@pytest.mark.parametrize("name", sorted(set(GLUE) - {"cola"}))
def test_every_glue_layout_also_reads_without_its_header(tmp_path, name):
    with_header = load_task(f"glue:{name}", str(write_glue(tmp_path / "a")))
    folder = GLUE[name].folder
    without = load_task(f"glue:{name}", str(write_glue(tmp_path / "b", headerless=(folder,))))
    assert without.train == with_header.train and without.dev == with_header.dev and without.labels == with_header.labels


def test_a_first_row_that_is_neither_header_nor_data_is_a_clear_error(tmp_path):
    glue = write_glue(tmp_path / "glue", headerless=("MRPC",))
    (glue / "MRPC" / "dev.tsv").write_text("1\tonly three\tfields\n")  # wrong field count
    with pytest.raises(TaskError, match=r"MRPC/dev.tsv:1: the first row is neither a header .* \(5 fields.* it has 3 fields"):
        load_task("glue:mrpc", str(glue))
    (glue / "MRPC" / "dev.tsv").write_text("yes\t1\t2\ta\tb\n")  # right count, not a label
    with pytest.raises(TaskError, match=r"MRPC/dev.tsv:1: "):
        load_task("glue:mrpc", str(glue))


def test_all_bad_tasks_are_named_in_one_error(tmp_path):
    from cramlm.eval.tasks import load_tasks

    glue = write_glue(tmp_path / "glue")
    (glue / "MRPC" / "dev.tsv").write_text("junk\n")
    (glue / "RTE" / "train.tsv").unlink()
    with pytest.raises(TaskError) as err:
        load_tasks(["glue:sst2", "glue:mrpc", "glue:rte"], str(glue))
    message = str(err.value)
    assert message.startswith("2 of 3 tasks cannot be loaded")
    assert "glue:mrpc: " in message and "MRPC/dev.tsv:1" in message and "glue:rte: " in message and "RTE" in message
    assert [t.name for t in load_tasks(["glue:sst2", "glue:cola"], str(glue))] == ["sst2", "cola"]


GOOD = {"train.tsv": "sentence\tlabel\nx\t0\ny\t1\n", "dev.tsv": "sentence\tlabel\nz\t0\n"}


@pytest.mark.parametrize("key, value", [
    ("train", "../../x.tsv"), ("train", "/etc/passwd"), ("train", "../../../../etc/passwd"),
    ("train", "sub/../../outside/train.tsv"), ("dev", "../dev.tsv"), ("dev.m", "../../../../etc/passwd"),
])
def test_task_json_paths_stay_inside_the_task_folder(tmp_path, key, value):
    """Issue 12.5: task.json could name any file (`../../../../etc/passwd` was read and printed)."""
    outside = _write(tmp_path / "outside", GOOD)  # readable files one level up: refused all the same
    (outside / "x.tsv").write_text(GOOD["train.tsv"])
    meta = {"labels": ["0", "1"], **({"dev": {"m": value}} if key == "dev.m" else {key: value})}
    folder = _write(tmp_path / "a" / "b" / "task", GOOD, meta)
    with pytest.raises(TaskError) as err:
        load_task(str(folder))
    message = str(err.value)
    assert message.startswith(str(folder / "task.json")) and f"{key} '" in message and "outside the task folder" in message
    assert "root:" not in message


def test_task_files_in_subfolders_are_fine(tmp_path):
    folder = _write(tmp_path / "task", {}, {"train": "data/../data/train.tsv", "dev": {"dev": "./data/dev.tsv"}})
    _write(folder / "data", GOOD)
    task = load_task(str(folder))
    assert len(task.train) == 2 and len(task.dev["dev"]) == 1


def test_errors_show_only_a_few_values_of_a_file(tmp_path):
    many = "".join(f"row {i}\tlabel-{i}\n" for i in range(50))
    folder = _write(tmp_path / "t", {"train.tsv": many, "dev.tsv": "z\tunknown\n"},
                    {"header": False, "columns": {"sentence1": 0, "label": 1}})
    with pytest.raises(TaskError) as err:
        load_task(str(folder))
    message = str(err.value)
    assert "label 'unknown' is not one of" in message and "... (45 more)" in message and "label-30" not in message
    long_label = _write(tmp_path / "u", {"train.tsv": GOOD["train.tsv"], "dev.tsv": "sentence\tlabel\nz\t" + "x" * 5000 + "\n"},
                        {"labels": ["0", "1"]})
    with pytest.raises(TaskError, match=r"\(5000 characters\)") as err:
        load_task(str(long_label))
    assert len(str(err.value)) < 400


@pytest.mark.parametrize("secret,declared", [
    ("root:x:0:0:SECRET-PASSWD-LINE:/root:/bin/bash\n", None),  # the header error: first line of the file
    ("sentence\tlabel\nhello\tSECRET-LABEL\n", ["pos", "neg"]),  # a label error: a value of the file
    ("sentence\tlabel\nhello\tSECRET-ONLY-LABEL\n", None),  # too few distinct labels
])
def test_a_symlinked_task_file_elsewhere_is_never_echoed(tmp_path, secret, declared):
    """Issue 20 item 8: a task folder whose train file links to a file outside it (the system's user
    database, say) may fail, but the error shows only what the task declares."""
    outside = tmp_path / "elsewhere" / "passwd"
    outside.parent.mkdir()
    outside.write_text(secret)
    task = tmp_path / "task"
    task.mkdir()
    (task / "train.tsv").symlink_to(outside)
    (task / "dev.tsv").write_text("sentence\tlabel\nok\tpos\n")
    spec = {"columns": {"sentence1": "sentence", "label": "label"}}
    if declared:
        spec["labels"] = declared
    (task / "task.json").write_text(json.dumps(spec))
    with pytest.raises(TaskError) as e:
        load_task(str(task))
    message = str(e.value)
    assert "SECRET" not in message and "not shown" in message, message
    assert str(task / "train.tsv") in message


def test_a_file_without_a_header_keeps_its_first_rows_field_count(tmp_path):
    """header: false: a row with another field count than the first is malformed, as against a header:
    an error naming the line, or skipped and counted with skip_malformed (never read shifted)."""
    rows = "a sentence\tx\t0\nshort\t1\nlong\tx\t1\textra\nfine\tx\t1\n"
    meta = {"header": False, "columns": {"sentence1": 0, "label": 2}, "labels": ["0", "1"]}
    folder = _write(tmp_path / "headerless", {"train.tsv": rows, "dev.tsv": "z\tx\t0\n"}, meta)
    with pytest.raises(TaskError, match=r"headerless/train.tsv:2: 2 fields, the first row has 3"):
        load_task(str(folder))
    task = load_task({"path": str(folder), "skip_malformed": True})
    assert [e.text_a for e in task.train] == ["a sentence", "fine"] and sum(task.skipped.values()) == 2


def test_gzipped_task_files_are_found_and_read_as_their_plain_twins(tmp_path):
    import gzip

    plain = _write(tmp_path / "plain", {"train.tsv": "sentence\tlabel\nx\tb\ny\ta\n", "dev.tsv": "sentence\tlabel\nz\ta\n"})
    zipped = tmp_path / "zipped"
    zipped.mkdir()
    for name in ("train.tsv", "dev.tsv"):
        (zipped / f"{name}.gz").write_bytes(gzip.compress((plain / name).read_bytes()))
    a, b = load_task(str(plain)), load_task(str(zipped))
    assert [(x.text_a, x.label) for x in b.train] == [(x.text_a, x.label) for x in a.train] and b.labels == a.labels
    (zipped / "train.tsv.gz").write_bytes((zipped / "train.tsv.gz").read_bytes()[:-6])  # cut short
    with pytest.raises(TaskError, match=r"train.tsv.gz: not a complete gzip file \(\S"):
        load_task(str(zipped))
    (zipped / "train.tsv.gz").unlink()
    with pytest.raises(TaskError, match=r"no train file \(looked for .*train.tsv.* \(or .gz\)"):
        load_task(str(zipped))
