"""What an encoder's frozen representations hold for a task, pretrained against untrained.

For each checkpoint (anything `cramlm eval checkpoint=` takes, `-untrained` included) and each
pooling (first token, mean over tokens), on one task's train and dev sentences:

- ``sent_cos``: mean pairwise cosine similarity of the pooled sentence embeddings (dev). Near 1:
  every sentence maps to about the same vector (anisotropy / collapse).
- ``sent_erank``: effective rank (exp of the entropy of the normalised singular values; Roy &
  Vetterli 2007) of the centred pooled dev embeddings, out of the hidden size.
- ``tok_cos``, ``tok_erank``: the same over token states (up to 4,000 non-padding tokens of dev).
- ``probe``: dev accuracy of a logistic regression on the standardised frozen pooled features
  (C chosen by 5-fold cross-validation on train). Low probe = the representations are worse;
  high probe but low fine-tuned score = fine-tuning loses what they hold.
- per layer (cramlm runs): ``probe`` of the mean-pooled output of the embeddings and every block.

Plus, per tokenizer, ``emb_cos``: mean cosine between the input-embedding rows of the tokens that
occur in the task (the tied MLM decoder pushes rarely-predicted rows one way: Gao et al. 2019),
and a bag-of-words baseline (logistic regression on token counts).

    python benchmarks/representation_probe.py outputs/demo outputs/demo-untrained \\
        --task pkg://tasks/rotten_tomatoes_small [--base-dir outputs] [--json out.json]

Prints one JSON line per checkpoint, then a table.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import numpy as np
import torch

from cramlm.eval.checkpoints import load_checkpoint
from cramlm.eval.finetune import pad_batch
from cramlm.eval.tasks import load_task
from cramlm.models.heads import pool


def effective_rank(x: np.ndarray) -> float:
    """exp(entropy of the singular-value distribution) of the centred rows of ``x`` (N, H)."""
    s = np.linalg.svd(x - x.mean(0, keepdims=True), compute_uv=False)
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def mean_cosine(x: np.ndarray, rng: np.random.Generator, max_rows: int = 2000) -> float:
    """Mean cosine similarity over all distinct pairs of (a sample of) the rows of ``x``."""
    if len(x) > max_rows:
        x = x[rng.choice(len(x), max_rows, replace=False)]
    u = x / np.linalg.norm(x, axis=1, keepdims=True).clip(min=1e-12)
    g = u @ u.T
    n = len(u)
    return float((g.sum() - np.trace(g)) / (n * (n - 1)))


def linear_probe(xtr: np.ndarray, ytr: np.ndarray, xdev: np.ndarray, ydev: np.ndarray) -> float:
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = make_pipeline(StandardScaler(), LogisticRegressionCV(Cs=[0.01, 0.1, 1.0, 10.0], cv=5, max_iter=2000))
    clf.fit(xtr, ytr)
    return float((clf.predict(xdev) == ydev).mean())


@torch.inference_mode()
def encode_all(ckpt, ids: list[list[int]], batch_size: int = 128) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Hidden states of every layer for each sequence: ([embeddings, block 1..L, final], masks).
    Layers other than the final are taken with hooks where the encoder has a cramlm trunk."""
    enc = ckpt.encoder.eval()
    trunk = getattr(enc, "trunk", None)
    taps = [] if trunk is None else [trunk.embedding_dropout, *trunk.blocks]
    layers: list[list[torch.Tensor]] = [[] for _ in range(len(taps) + 1)]
    masks = []
    pad = ckpt.tokenizer.pad_id
    for start in range(0, len(ids), batch_size):
        batch = pad_batch(ids[start : start + batch_size], pad)
        width = 128  # pad every batch to one width so the states can be stacked
        grabbed = []
        hooks = [m.register_forward_hook(lambda _m, _i, out: grabbed.append(out)) for m in taps]
        try:
            final = enc.encode(batch["input_ids"], batch["attention_mask"])
        finally:
            for h in hooks:
                h.remove()
        for i, h in enumerate([*grabbed, final]):
            layers[i].append(torch.nn.functional.pad(h.float(), (0, 0, 0, width - h.shape[1])))
        masks.append(torch.nn.functional.pad(batch["attention_mask"], (0, width - batch["attention_mask"].shape[1])))
    return [torch.cat(x) for x in layers], torch.cat(masks)


def probe_checkpoint(spec: str, task_spec: str, base_dir: str, max_len: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    task = load_task(task_spec)
    if task.is_regression:
        raise SystemExit(f"Error: {task.name} is a regression task; the probe needs class labels")
    ckpt = load_checkpoint(spec, base_dir, seed=seed)
    dev_split = next(iter(task.dev))
    max_len = min(max_len, ckpt.max_length)
    tr_ids = ckpt.tokenizer.encode(task.train, max_len)
    dev_ids = ckpt.tokenizer.encode(task.dev[dev_split], max_len)
    ytr = np.asarray([e.label for e in task.train])
    ydev = np.asarray([e.label for e in task.dev[dev_split]])
    start = time.perf_counter()
    tr_layers, tr_mask = encode_all(ckpt, tr_ids)
    dev_layers, dev_mask = encode_all(ckpt, dev_ids)

    out: dict = {"checkpoint": ckpt.label, "task": task.name, "hidden": ckpt.encoder.hidden_size}
    final_dev, final_tr = dev_layers[-1], tr_layers[-1]
    for how in ("first", "mean"):
        xdev = pool(final_dev, dev_mask, how).numpy()
        xtr = pool(final_tr, tr_mask, how).numpy()
        out[how] = {
            "sent_cos": round(mean_cosine(xdev, rng), 4),
            "sent_erank": round(effective_rank(xdev), 1),
            "probe": round(100 * linear_probe(xtr, ytr, xdev, ydev), 2),
        }
    tokens = final_dev[dev_mask.bool()].numpy()  # (N tokens, H)
    tokens = tokens[rng.choice(len(tokens), min(4000, len(tokens)), replace=False)]
    out["tok_cos"] = round(mean_cosine(tokens, rng), 4)
    out["tok_erank"] = round(effective_rank(tokens), 1)
    if len(dev_layers) > 1:  # per-layer mean-pool probe: where the task information sits
        out["layer_probe"] = [
            round(100 * linear_probe(pool(t, tr_mask, "mean").numpy(), ytr, pool(d, dev_mask, "mean").numpy(), ydev), 2)
            for t, d in zip(tr_layers, dev_layers)
        ]
    emb = getattr(ckpt.encoder, "tokens", None)
    if emb is not None:  # input embeddings of the tokens this task uses
        used = np.unique(np.concatenate([np.asarray(x) for x in tr_ids]))
        rows = emb.weight.detach().float().numpy()[used]
        out["emb_cos"] = round(mean_cosine(rows, rng), 4)
        out["emb_erank"] = round(effective_rank(rows), 1)
        out["emb_rows"] = int(len(used))
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def bag_of_words(spec: str, task_spec: str, base_dir: str, max_len: int) -> float:
    """Dev accuracy of a logistic regression on token counts (this checkpoint's tokenizer)."""
    from scipy.sparse import csr_matrix

    task = load_task(task_spec)
    ckpt = load_checkpoint(spec, base_dir)
    dev = task.dev[next(iter(task.dev))]
    tr_ids, dev_ids = ckpt.tokenizer.encode(task.train, max_len), ckpt.tokenizer.encode(dev, max_len)
    width = max(max(x) for x in tr_ids + dev_ids) + 1

    def counts(ids):
        rows = np.repeat(np.arange(len(ids)), [len(x) for x in ids])
        return csr_matrix((np.ones(len(rows)), (rows, np.concatenate(ids))), shape=(len(ids), width))

    from sklearn.linear_model import LogisticRegressionCV

    clf = LogisticRegressionCV(Cs=[0.01, 0.1, 1.0, 10.0], cv=5, max_iter=2000).fit(counts(tr_ids), [e.label for e in task.train])
    return round(100 * float((clf.predict(counts(dev_ids)) == np.asarray([e.label for e in dev])).mean()), 2)


def table(rows: list[dict], bow: float | None) -> str:
    lines = [
        "| checkpoint | probe first | probe mean | sent cos first | sent cos mean | sent erank first | sent erank mean | tok cos | tok erank | emb cos | per-layer mean probe |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        f, m = r["first"], r["mean"]
        layers = " ".join(f"{x:.1f}" for x in r.get("layer_probe", []))
        lines.append(
            f"| {r['checkpoint']} | {f['probe']:.2f} | {m['probe']:.2f} | {f['sent_cos']:.3f} | {m['sent_cos']:.3f} | "
            f"{f['sent_erank']:.1f} | {m['sent_erank']:.1f} | {r['tok_cos']:.3f} | {r['tok_erank']:.1f} | "
            f"{r.get('emb_cos', float('nan')):.3f} | {layers} |"
        )
    if bow is not None:
        lines.append(f"\nbag of words (logistic regression on token counts, first checkpoint's tokenizer): {bow:.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+", help="run names/folders, HF folders; suffix -untrained for random weights")
    parser.add_argument("--task", default="pkg://tasks/rotten_tomatoes_small")
    parser.add_argument("--base-dir", default="outputs")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-bow", action="store_true", help="skip the bag-of-words baseline")
    parser.add_argument("--json", help="also write all rows to this file")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)  # scikit-learn's notices of coming defaults
    torch.manual_seed(args.seed)
    results = []
    for spec in args.checkpoints:
        row = probe_checkpoint(spec, args.task, args.base_dir, args.max_length, args.seed)
        print(json.dumps(row), flush=True)
        results.append(row)
    bow = None if args.no_bow else bag_of_words(args.checkpoints[0], args.task, args.base_dir, args.max_length)
    print(table(results, bow))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"task": args.task, "rows": results, "bag_of_words": bow}, f, indent=1)
