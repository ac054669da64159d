"""benchmarks/single_sentence.py: the selection split (drawn from the capped training split only, the
same rows for every model, disjoint) and the corpus its domain figures compare against (a cramlm
run's own data sources; the shared corpus otherwise)."""

import gzip
import json
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import single_sentence as ss  # noqa: E402

from cramlm.data.prepare import DataConfig  # noqa: E402
from cramlm.eval.tasks import Example, Task  # noqa: E402


def test_selection_is_a_fixed_fifth_of_the_capped_training_split_and_never_dev():
    train = [Example(f"text {i}", None, i % 2) for i in range(5000)]
    task = Task("t", ["0", "1"], ["accuracy"], train, {"dev": [Example("dev", None, 0)]})
    first, again = ss.split_for_selection(task), ss.split_for_selection(task)
    kept, chosen = [e.text_a for e in first.train], [e.text_a for e in first.dev["select"]]
    assert (len(kept), len(chosen)) == (3200, 800) and not set(kept) & set(chosen)
    assert set(kept) | set(chosen) <= {e.text_a for e in train} and "dev" not in kept + chosen
    assert [e.text_a for e in again.dev["select"]] == chosen  # the same rows for every model


def test_the_corpus_is_the_runs_own_sources_else_the_shared_corpus(tmp_path):
    (tmp_path / "own.txt").write_text("Zebras graze.\n\nQuietly zebras sleep.\n")
    data = DataConfig(name="own", sources=[{"type": "text", "split": "blank-line", "path": str(tmp_path / "own.txt")}])
    run = SimpleNamespace(lm=SimpleNamespace(config=SimpleNamespace(data=data)))
    words, docs, name = ss.corpus_words(run, tmp_path)  # the first document is the sample, not in the words
    assert (words, docs, name) == ({"zebras", "quietly", "sleep"}, ["Zebras graze."], "own")
    (tmp_path / "corpus").mkdir()
    with gzip.open(tmp_path / "corpus" / "a.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "Ships sail"}) + "\n" + json.dumps({"text": "Boats sail"}) + "\n")
    words, docs, name = ss.corpus_words(SimpleNamespace(lm=None), tmp_path)
    assert (words, docs, name) == ({"boats", "sail"}, ["Ships sail"], f"{tmp_path}/corpus")


def test_the_bag_of_words_reference_learns_lexical_cues_and_chooses_c_on_the_select_split():
    words = ["good", "fine", "great", "bad", "awful", "poor"]
    train = [Example(f"the film was {words[i % 6]} and long {i}", None, int(i % 6 < 3)) for i in range(600)]
    dev = [Example(f"a {words[i % 6]} day", None, int(i % 6 < 3)) for i in range(60)]
    result = ss.bag_of_words(Task("t", ["0", "1"], ["accuracy"], train, {"dev": dev}))
    assert result["C"] in (0.3, 1.0, 3.0, 10.0, 30.0) and result["select"] == 1.0 and result["dev"] == 1.0
