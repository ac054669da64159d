"""GLUE: the nine tasks, from a local folder in the official layout or from HF ``datasets``.

Local layout (as the GLUE download script writes it): ``<glue_dir>/<Folder>/train.tsv`` and
``dev.tsv`` (MNLI: ``dev_matched.tsv``, ``dev_mismatched.tsv``), TAB-separated, no quoting, with
each task's own columns::

    CoLA   no header: source, label, original label mark, sentence
    SST-2  sentence, label
    MRPC   Quality, #1 ID, #2 ID, #1 String, #2 String          (label first; file starts with a BOM)
    QQP    id, qid1, qid2, question1, question2, is_duplicate   (a few malformed rows are skipped)
    STS-B  index, genre, filename, year, old_index, source1, source2, sentence1, sentence2, score
    MNLI   index, promptID, pairID, genre, 4 parse columns, sentence1, sentence2, label1, [label2-5,]
           gold_label
    QNLI   index, question, sentence, label
    RTE    index, sentence1, sentence2, label
    WNLI   index, sentence1, sentence2, label

Copies found in public repositories often lack the header row (MRPC, STS-B, ...): a first row that
is not a header but has the official field count and a valid label is read as headerless in the
official column order (:data:`LAYOUTS`), and a note says so.

Metrics as cramming reports them: CoLA Matthews, MRPC and QQP F1 (and accuracy beside it), STS-B
Pearson (and Spearman), the others accuracy; MNLI is scored on matched and mismatched dev sets.
``glue_dir=hf`` loads the same tasks with ``datasets.load_dataset("glue", name)`` (online).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cramlm.eval.tasks import PREFIXES, Columns, Example, Task, TaskError, TaskSpec, build_task


@dataclass(frozen=True)
class GlueTask:
    folder: str  # folder name in the GLUE download
    spec: TaskSpec  # how to read the local files
    hf_columns: tuple[str, str | None]  # text columns in HF datasets' "glue" config
    hf_dev: dict[str, str]  # split name here -> HF split

    @property
    def layouts(self) -> list[list[str]]:
        """The official column names of its files, for files without the header row."""
        return [list(names) for names in LAYOUTS.get(self.folder, ())]


def _spec(name: str, s1, s2, label, labels, metric, **kw) -> TaskSpec:
    return TaskSpec(
        name=name,
        format="tsv",
        columns=Columns(sentence1=s1, sentence2=s2, label=label),
        labels=labels,
        metric=metric,
        **kw,
    )


MNLI_TRAIN = ("index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
              "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label")
# folder -> the official columns of its files (one tuple per distinct layout), as in the docstring
LAYOUTS: dict[str, tuple[tuple[str, ...], ...]] = {
    "SST-2": (("sentence", "label"),),
    "MRPC": (("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"),),
    "QQP": (("id", "qid1", "qid2", "question1", "question2", "is_duplicate"),),
    "STS-B": (("index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2", "score"),),
    "MNLI": (MNLI_TRAIN, MNLI_TRAIN[:-1] + ("label2", "label3", "label4", "label5", "gold_label")),
    "QNLI": (("index", "question", "sentence", "label"),),
    "RTE": (("index", "sentence1", "sentence2", "label"),),
    "WNLI": (("index", "sentence1", "sentence2", "label"),),
}

BINARY = ["0", "1"]
NLI2 = ["entailment", "not_entailment"]
NLI3 = ["entailment", "neutral", "contradiction"]  # HF datasets' label order
DEV = {"dev": "validation"}

GLUE: dict[str, GlueTask] = {
    "cola": GlueTask("CoLA", _spec("cola", 3, None, 1, BINARY, "matthews", header=False), ("sentence", None), DEV),
    "sst2": GlueTask("SST-2", _spec("sst2", "sentence", None, "label", BINARY, "accuracy"), ("sentence", None), DEV),
    "mrpc": GlueTask(
        "MRPC", _spec("mrpc", "#1 String", "#2 String", "Quality", BINARY, ["f1", "accuracy"]), ("sentence1", "sentence2"), DEV
    ),
    "qqp": GlueTask(
        "QQP",
        _spec("qqp", "question1", "question2", "is_duplicate", BINARY, ["f1", "accuracy"], skip_malformed=True),
        ("question1", "question2"),
        DEV,
    ),
    "stsb": GlueTask(
        "STS-B", _spec("stsb", "sentence1", "sentence2", "score", None, ["pearson", "spearman"]), ("sentence1", "sentence2"), DEV
    ),
    "mnli": GlueTask(
        "MNLI",
        _spec(
            "mnli", "sentence1", "sentence2", "gold_label", NLI3, "accuracy",
            dev={"m": "dev_matched.tsv", "mm": "dev_mismatched.tsv"},
        ),
        ("premise", "hypothesis"),
        {"m": "validation_matched", "mm": "validation_mismatched"},
    ),
    "qnli": GlueTask("QNLI", _spec("qnli", "question", "sentence", "label", NLI2, "accuracy"), ("question", "sentence"), DEV),
    "rte": GlueTask("RTE", _spec("rte", "sentence1", "sentence2", "label", NLI2, "accuracy"), ("sentence1", "sentence2"), DEV),
    "wnli": GlueTask("WNLI", _spec("wnli", "sentence1", "sentence2", "label", BINARY, "accuracy"), ("sentence1", "sentence2"), DEV),
}
ALIASES = {"sst-2": "sst2", "sts-b": "stsb", "mnli-m": "mnli", "mnli-mm": "mnli"}
GLUE_SANE = ["cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst2", "stsb"]  # cramming leaves out WNLI


def glue_task(name: str) -> tuple[str, GlueTask]:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in GLUE:
        raise TaskError(f"glue:{name}: unknown GLUE task; known: {', '.join(GLUE)}")
    return key, GLUE[key]


def load_glue(name: str, glue_dir: str | None) -> Task:
    key, task = glue_task(name)
    if glue_dir in (None, ""):
        raise TaskError(
            f"glue:{name}: set eval.glue_dir to a folder in the GLUE layout (<dir>/{task.folder}/train.tsv), "
            "or eval.glue_dir=hf to download with `datasets` (online)"
        )
    if glue_dir == "hf":
        return load_glue_hf(key, task)
    folder = Path(glue_dir).expanduser() / task.folder
    if not folder.is_dir():
        raise TaskError(f"glue:{name}: no folder {folder} (expected the GLUE layout <glue_dir>/{task.folder}/train.tsv)")
    return build_task(task.spec, folder, f"glue:{key}", task.layouts)


def load_glue_hf(key: str, task: GlueTask) -> Task:
    """The same task from the hub's ``glue`` dataset (needs network and `pip install datasets`)."""
    try:
        from datasets import load_dataset
    except ImportError:
        raise TaskError("eval.glue_dir=hf needs the `datasets` package: pip install 'cramlm[glue]'") from None
    data = load_dataset("glue", key)
    a, b = task.hf_columns
    regression = task.spec.labels is None

    def examples(split: str) -> list[Example]:
        rows = data[split]
        return [
            Example(r[a], r[b] if b else None, float(r["label"]) if regression else int(r["label"]))
            for r in rows
        ]

    return Task(
        name=key,
        labels=[] if regression else list(task.spec.labels or []),
        metrics=task.spec.metrics,
        train=examples("train"),
        dev={split: examples(hf) for split, hf in task.hf_dev.items()},
    )


PREFIXES["glue"] = load_glue  # load_task("glue:<name>", glue_dir)
