"""Why single-sentence tasks do not pay: the fine-tuning protocol, the encoder's states and the
corpus's domain, separated for each model beside its untrained twin.

For each model (a cramlm run, an export or a transformers folder; ``--twin`` adds each cramlm run's
untrained twin) and task (default: the shared single-sentence tasks rotten_tomatoes and spam, with
the pair task epistemic_nli as the control where pretraining does pay):

1. **Protocol, selected on training data only.** The capped training split (4,000 examples, as the
   bridge evaluates) is cut once into 80% to train and 20% to select (a fixed seed, the same rows for
   every model). Every grid configuration (lr x epochs x pooling, fine-tuning everything; and a probe,
   ``eval.freeze_encoder``, which trains the pooler and classifier on the states as pretrained) is
   trained on the 80% with seed 0 and scored on the 20%. The best fine-tuning configuration and the
   best probe by that score are then trained on the whole capped split with 3 seeds and scored on
   dev, beside the recipe's own protocol (``default``: lr 1e-3, 3 epochs, mean pooling). Dev is never
   used to choose.
2. **The states.** The probe's dev score against the twin's: what pretraining put in the encoder's
   states, before fine-tuning can learn the task into the encoder (or wash it out).
3. **A reference with no pretraining**: a bag of words (tf-idf of word 1-2 grams, logistic regression,
   its C chosen on the same 20%), what lexical cues alone give on the capped split.
4. **Domain and tokenizer.** Per task: word tokens never seen in the pretraining corpus (the run's
   own data sources; the shared corpus for a checkpoint that is not a cramlm run) as a share of the
   task's training text, tokens per word (the run's tokenizer), beside the same for the corpus's
   every 50th document, left out of the word list for this (in-domain text the list has not seen).

    python benchmarks/single_sentence.py --model rtd=outputs/bridge/own-rtd-s0-1x --twin \\
        --out benchmarks/results/single_sentence.json

Every finished fine-tuning is written to ``--out`` at once (a rerun skips it), so a stopped run
continues where it was; ``--grid small`` trains 6 configurations instead of 14. One thread
(``--threads``); pin the process with taskset for figures beside other work.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

from cramlm.eval.config import SelectConfig

TASKS = ["rotten_tomatoes", "spam", "epistemic_nli"]
SELECT_FRACTION, SELECT_SEED = SelectConfig().fraction, SelectConfig().seed  # eval.select's: the same rows
SEEDS = (0, 1, 2)
# the recipe's own fine-tuning (eval preset `default`, GLUE-sane's optimizer at lr 1e-3), capped as the bridge evaluates
BASE = {"lr": 1e-3, "epochs": 3, "pooling": "mean", "max_train_examples": 4000, "max_dev_examples": None}


def grid(size: str) -> list[dict]:
    """Fine-tuning configurations (lr x epochs x pooling), then the probes (frozen encoder)."""
    lrs, epochs, poolings = ((3e-4, 1e-3, 3e-3), (3, 10), ("mean", "first")) if size == "full" else ((3e-4, 1e-3, 3e-3), (3, 10), ("mean",))
    tune = [{"lr": lr, "epochs": ep, "pooling": pool, "freeze_encoder": False}
            for lr, ep, pool in itertools.product(lrs, epochs, poolings)]
    probes = [{"lr": lr, "epochs": 10, "pooling": "mean", "freeze_encoder": True} for lr in ((1e-3, 1e-2) if size == "full" else (1e-2,))]
    return tune + probes


def key(cfg: dict) -> str:
    return ",".join(f"{k}={cfg[k]}" for k in sorted(cfg))


def split_for_selection(task):
    """The capped training split cut into 80% to train and 20% to select (file order kept in each)."""
    from cramlm.eval.tasks import Task, hold_out, sample

    keep, select = hold_out(sample(task.train, BASE["max_train_examples"]), SELECT_FRACTION, SELECT_SEED)
    return Task(task.name, task.labels, task.metrics, keep, {"select": select})


def corpus_words(ckpt, data_dir: Path) -> tuple[set[str], list[str], str]:
    """The pretraining corpus's word types (lowercased letters) without every 50th document, those
    documents' text (an in-domain sample whose words are counted as a task's are) and what the
    corpus is: the run's own data sources where the checkpoint is a cramlm run, else the shared corpus."""
    from cramlm.config.registry import build
    from cramlm.data.sources import SkipReport

    config = getattr(ckpt.lm, "config", None) if ckpt.lm is not None else None
    if config is not None:
        texts, name = (t for s in config.data.sources for t in build("source", s, SkipReport())), config.data.name
    else:
        def shared():
            for path in sorted((data_dir / "corpus").glob("*.jsonl.gz")):
                with gzip.open(path, "rt", encoding="utf-8") as f:
                    yield from (json.loads(line)["text"] for line in f)
        texts, name = shared(), f"{data_dir}/corpus"
    words, sample_docs = set(), []
    for i, text in enumerate(texts):
        if i % 50 == 0:
            sample_docs.append(text[:4000])
        else:
            words.update(WORD.findall(text.lower()))
    return words, sample_docs, name


WORD = re.compile(r"[a-z]+")


def bag_of_words(task) -> dict:
    """A reference with no pretraining and no network: tf-idf of word unigrams and bigrams, logistic
    regression with C chosen on the select split (fitted on the other 80%), then fitted on the
    whole capped split and scored on dev. Pair tasks read both texts joined (no cross features)."""
    import numpy as np
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    from cramlm.eval.metrics import score
    from cramlm.eval.tasks import sample

    def text(e) -> str:
        return e.text_a + (" " + e.text_b if e.text_b else "")

    def fit_score(train, test, c: float) -> float:
        vec = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True)
        x = vec.fit_transform([text(e) for e in train])
        model = LogisticRegression(C=c, max_iter=2000).fit(x, [e.label for e in train])
        pred = model.predict(vec.transform([text(e) for e in test]))
        return score(task.metric, np.asarray(pred), np.asarray([e.label for e in test]))

    selection = split_for_selection(task)
    chosen = {c: fit_score(selection.train, selection.dev["select"], c) for c in (0.3, 1.0, 3.0, 10.0, 30.0)}
    c = max(chosen, key=chosen.get)  # the first of equals
    dev = next(iter(task.dev.values()))
    return {"C": c, "select": chosen[c], "dev": fit_score(sample(task.train, BASE["max_train_examples"]), dev, c)}


def text_stats(texts: list[str], tokenizer, corpus: set[str]) -> dict:
    from cramlm.eval.tasks import Example

    tokens = words = unseen = 0
    for text in texts:
        found = WORD.findall(text.lower())
        words += len(found)
        unseen += sum(w not in corpus for w in found)
        tokens += len(tokenizer.encode([Example(text, None, 0)], 10**6)[0]) - 2  # without [CLS] and [SEP]
    return {"texts": len(texts), "words": words, "unseen_word_share": unseen / max(1, words),
            "tokens_per_word": tokens / max(1, words)}


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", required=True, metavar="LABEL=CHECKPOINT")
    ap.add_argument("--twin", action="store_true", help="add each cramlm run's untrained twin")
    ap.add_argument("--tasks", nargs="+", default=TASKS)
    ap.add_argument("--data-dir", type=Path, default=Path(os.environ.get("CRAMLM_DATA_DIR", "../shared/data")))
    ap.add_argument("--grid", choices=["full", "small"], default="full")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-train", type=int, default=BASE["max_train_examples"], help="the training cap (4,000 as the bridge)")
    ap.add_argument("--max-dev", type=int, default=None, help="score a fixed sample of this many dev examples (default all)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/single_sentence.json"))
    args = ap.parse_args(argv)

    import torch

    from cramlm.eval.checkpoints import load_checkpoint
    from cramlm.eval.config import Hparams
    from cramlm.eval.finetune import finetune
    from cramlm.eval.tasks import load_tasks
    from cramlm.io import write_json, write_result
    from cramlm.train.impl import ImplConfig

    torch.set_num_threads(args.threads)
    BASE.update(max_train_examples=args.max_train, max_dev_examples=args.max_dev)
    impl = ImplConfig(progress=False, precision="fp32", threads=args.threads)
    device = torch.device("cpu")
    tasks = load_tasks([str(args.data_dir / "tasks" / t) for t in args.tasks])
    result = json.loads(args.out.read_text()) if args.out.is_file() else {}
    result.setdefault("protocol", {"base": BASE, "grid": grid(args.grid), "select_fraction": SELECT_FRACTION,
                                   "select_seed": SELECT_SEED, "seeds": list(SEEDS), "precision": "fp32",
                                   "threads": args.threads})
    models = result.setdefault("models", {})

    def save() -> None:  # after every fine-tuning run: a stopped measurement continues where it was
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_json(args.out, result, indent=1)

    specs = []
    for spec in args.model:
        label, _, path = spec.partition("=")
        specs.append((label, path, False))
        if args.twin and (Path(path) / "config.yaml").is_file():
            specs.append((f"{label}-twin", path, True))
    for task in tasks:
        if task.name not in result.setdefault("bag_of_words", {}):
            result["bag_of_words"][task.name] = bag_of_words(task)
            save()
    for label, path, untrained in specs:
        ckpt = load_checkpoint(path, ".", untrained=untrained)
        corpus, corpus_docs, corpus_name = corpus_words(ckpt, args.data_dir)
        entry = models.setdefault(label, {"checkpoint": path, "untrained": untrained, "tasks": {}})
        entry["corpus"] = corpus_name
        entry["corpus_text"] = text_stats(corpus_docs, ckpt.tokenizer, corpus)
        for task in tasks:
            t = entry["tasks"].setdefault(task.name, {"select": {}, "dev": {}})
            t["text"] = text_stats([e.text_a + (" " + e.text_b if e.text_b else "") for e in task.train[:2000]],
                                   ckpt.tokenizer, corpus)
            selection = split_for_selection(task)
            for cfg in grid(args.grid):
                k = key(cfg)
                if k not in t["select"]:
                    start = time.perf_counter()
                    run = finetune(ckpt, selection, Hparams(**{**BASE, **cfg}), 0, impl, device)
                    t["select"][k] = {"config": cfg, "score": run["epochs"][-1]["select"][task.metric],
                                      "seconds": round(time.perf_counter() - start, 1)}
                    print(f"{label} {task.name} select {k}: {100 * t['select'][k]['score']:.1f}", flush=True)
                    save()
            chosen = {"default": {"freeze_encoder": False}}
            for name, frozen in (("selected", False), ("probe", True)):
                rows = [r for r in t["select"].values() if r["config"]["freeze_encoder"] is frozen]
                chosen[name] = max(rows, key=lambda r: r["score"])["config"]  # the first of equals
            for name, cfg in chosen.items():
                hp = Hparams(**{**BASE, **cfg})
                d = t["dev"].setdefault(name, {"config": cfg, "seeds": {}})
                if d["config"] != cfg:  # the grid grew: a new choice is trained again
                    d.update(config=cfg, seeds={})
                for seed in SEEDS:
                    if str(seed) not in d["seeds"]:
                        run = finetune(ckpt, task, hp, seed, impl, device)
                        d["seeds"][str(seed)] = {split: scores[task.metric] for split, scores in run["epochs"][-1].items()}
                        save()
                d["median"] = statistics.median(next(iter(s.values())) for s in d["seeds"].values())
                print(f"{label} {task.name} dev {name} ({key(cfg)}): {100 * d['median']:.1f}", flush=True)
                save()
    print(json.dumps(result))
    print(table(result))
    write_result(args.out, result, table(result))


def table(result: dict) -> str:
    lines = ["| model | task | default protocol | selected fine-tuning | its configuration | probe (frozen) | "
             "unseen words | tokens/word |", "|---|---|---:|---:|---|---:|---:|---:|"]
    for label, entry in result["models"].items():
        for task, t in entry["tasks"].items():
            dev = t.get("dev", {})

            def cell(name: str) -> str:
                return f"{100 * dev[name]['median']:.1f}" if "median" in dev.get(name, {}) else "-"

            cfg = dev.get("selected", {}).get("config", {})
            lines.append(f"| {label} | {task} | {cell('default')} | {cell('selected')} | "
                         + (f"lr {cfg['lr']:g}, {cfg['epochs']} ep, {cfg['pooling']}" if cfg else "-")
                         + f" | {cell('probe')} | {100 * t['text']['unseen_word_share']:.1f}% | {t['text']['tokens_per_word']:.2f} |")
    for task, b in result.get("bag_of_words", {}).items():
        lines.append(f"| bag of words (tf-idf 1-2 grams, logistic regression, C {b['C']:g}) | {task} | - | {100 * b['dev']:.1f} | - | - | - | - |")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
