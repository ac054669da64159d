"""A sentence's score under a language model, one function per objective kind, batched: what
minimal pairs compare (eval/pairs.py). Each takes the sentences already tokenized as the model saw
text in pretraining (:class:`Sentence`) and a callable into the model, so that cramlm models,
transformers models call the same code (a cramlm run's objective names its scorers: models/objectives/):

- ``clm_scores``: a causal LM's summed log-probability of the sentence's tokens, each given the
  tokens before it (the prefix, e.g. the end-of-document token that precedes a document in
  pretraining, is given, not scored); lm-evaluation-harness's loglikelihood with an empty context.
- ``pll_scores``: a masked LM's pseudo-log-likelihood (Salazar et al. 2020): for each scored token,
  a copy of the sentence with it masked, and the log-probability of the true token there, summed.
  Variant ``original``: the token alone is masked. Variant ``word-l2r`` (Kauf & Ivanova 2023): the
  token and the rest of its word (the following tokens with the same word index) are masked, so a
  word split into pieces is not predicted from its own other pieces. The copies of every sentence
  are batched together (sorted by length, ``batch_tokens`` padded tokens per forward); a copy both
  variants share (the last piece of a word, a one-piece word) is scored once.
- ``rtd_scores``: ELECTRA's discriminator: the summed log-probability, from the replaced-token
  detector, that each scored token is the original (log sigmoid(-z) of its logit z).

All sums are in float32 from float32 log-softmaxes; a sentence's score does not depend on the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F

MAX_LOGITS = 2**26  # floats of (B, T, V) logits one forward may produce (256 MiB): caps the batch of full-logit models


@dataclass
class Sentence:
    """One sentence as the model's input: ``ids`` (special tokens and prefix included), ``scored``
    the positions whose tokens count, ``words`` a word index per position (-1: special or prefix)."""

    ids: list[int]
    scored: list[int]
    words: list[int]


# predict(input_ids (B, T), attention_mask (B, T), where (B,)) -> (B, V) logits at position where[b] of row b
Predict = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# logits(input_ids (B, T), attention_mask (B, T)) -> (B, T, V) next-token logits (causal) or (B, T) detector logits (rtd)
Logits = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def batches(lengths: list[int], batch_tokens: int, row_cap: int | None = None) -> Iterator[np.ndarray]:
    """Indices of items grouped into batches of at most ``batch_tokens`` padded tokens (and
    ``row_cap`` rows), shortest first (little padding)."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order):
            rows = end + 1 - start
            if rows * lengths[order[end]] > batch_tokens or (row_cap and rows > row_cap):
                break
            end += 1
        yield order[start:end]
        start = end


def padded(sentences: list[Sentence], pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, words, lengths) as (N, T) arrays padded with ``pad_id`` / -1, and (N,) lengths."""
    lengths = np.array([len(s.ids) for s in sentences])
    T = int(lengths.max()) if len(sentences) else 0
    ids = np.full((len(sentences), T), pad_id, dtype=np.int64)
    words = np.full((len(sentences), T), -1, dtype=np.int64)
    for i, s in enumerate(sentences):
        ids[i, : len(s.ids)] = s.ids
        words[i, : len(s.words)] = s.words
    return ids, words, lengths


def pll_copies(sentences: list[Sentence], variants: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """The distinct masked copies the variants need: (sentence index, target position, l2r flag)
    per copy, and per variant the copy index of each (sentence, scored token) in order. A copy with
    the l2r flag masks the target and the rest of its word; one without masks the target alone."""
    sent, pos, l2r, key = [], [], [], {}
    use = {v: [] for v in dict.fromkeys(variants)}  # each variant once, however often listed
    for i, s in enumerate(sentences):
        for t in s.scored:
            more = t + 1 < len(s.words) and s.words[t] >= 0 and s.words[t + 1] == s.words[t]  # the word goes on
            for v in use:
                flag = v == "word-l2r" and more
                k = (i, t, flag)
                if k not in key:
                    key[k] = len(sent)
                    sent.append(i), pos.append(t), l2r.append(flag)
                use[v].append(key[k])
    return np.array(sent, dtype=np.int64), np.array(pos, dtype=np.int64), np.array(l2r, dtype=bool), \
        {v: np.array(c, dtype=np.int64) for v, c in use.items()}


@torch.inference_mode()
def pll_scores(predict: Predict, sentences: list[Sentence], mask_id: int, pad_id: int, variants: list[str],
               batch_tokens: int = 8192, vocab_size: int | None = None, device="cpu", progress=None) -> dict[str, np.ndarray]:
    """Per variant, the (N,) pseudo-log-likelihoods of ``sentences`` (see the module docstring).
    ``vocab_size``: given when ``predict`` computes full (B, T, V) logits, to cap the batch."""
    ids, words, lengths = padded(sentences, pad_id)
    sent, pos, l2r, use = pll_copies(sentences, variants)
    logp = np.zeros(len(sent), dtype=np.float32)
    cap = max(1, MAX_LOGITS // (vocab_size * int(lengths.max()))) if vocab_size and len(sentences) else None
    for chunk in batches(lengths[sent].tolist(), batch_tokens, cap):
        T = int(lengths[sent[chunk]].max())
        rows, where = ids[sent[chunk], :T].copy(), pos[chunk]  # (B, T), (B,)
        w = words[sent[chunk], :T]
        at = np.arange(T)[None, :]
        masked = at == where[:, None]
        target_word = w[np.arange(len(chunk)), where][:, None]
        masked |= l2r[chunk, None] & (at > where[:, None]) & (w == target_word)
        targets = rows[np.arange(len(chunk)), where]
        rows[masked] = mask_id
        attention = (at < lengths[sent[chunk], None]).astype(np.int64)
        logits = predict(torch.from_numpy(rows).to(device), torch.from_numpy(attention).to(device),
                         torch.from_numpy(where).to(device))  # (B, V)
        picked = F.log_softmax(logits.float(), dim=-1).gather(1, torch.from_numpy(targets).to(device)[:, None])
        logp[chunk] = picked[:, 0].cpu().numpy()
        if progress:
            progress(len(chunk))
    return {v: _sums(logp[c], sentences) for v, c in use.items()}


def _sums(per_token: np.ndarray, sentences: list[Sentence]) -> np.ndarray:
    """(N,) sums of consecutive runs of ``per_token``, one run of len(scored) per sentence."""
    counts = np.array([len(s.scored) for s in sentences])
    ends = np.cumsum(counts)
    totals = np.concatenate([[0.0], np.cumsum(per_token.astype(np.float64))])
    return (totals[ends] - totals[ends - counts]).astype(np.float64)


def _forward_batches(fn: Logits, sentences: list[Sentence], pad_id: int, batch_tokens: int, vocab_size: int | None, device):
    """(indices, rows, attention, output) per batch of whole sentences."""
    ids, _, lengths = padded(sentences, pad_id)
    cap = max(1, MAX_LOGITS // (vocab_size * int(lengths.max()))) if vocab_size and len(sentences) else None
    for chunk in batches(lengths.tolist(), batch_tokens, cap):
        T = int(lengths[chunk].max())
        rows = ids[chunk, :T]
        attention = (np.arange(T)[None, :] < lengths[chunk, None]).astype(np.int64)
        yield chunk, rows, fn(torch.from_numpy(rows).to(device), torch.from_numpy(attention).to(device))


@torch.inference_mode()
def clm_scores(logits_fn: Logits, sentences: list[Sentence], pad_id: int, batch_tokens: int = 8192,
               vocab_size: int | None = None, device="cpu", progress=None) -> np.ndarray:
    """(N,) summed log-probabilities: each scored token (never position 0) given the tokens before it."""
    out = np.zeros(len(sentences), dtype=np.float64)
    for chunk, rows, logits in _forward_batches(logits_fn, sentences, pad_id, batch_tokens, vocab_size, device):
        logp = F.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, T-1, V): position t predicts token t + 1
        nxt = torch.from_numpy(rows[:, 1:]).to(logp.device)
        token = logp.gather(2, nxt[..., None])[..., 0].cpu().numpy()  # (B, T-1)
        for b, i in enumerate(chunk):
            out[i] = float(np.sum(token[b, np.asarray(sentences[i].scored) - 1], dtype=np.float64))
        if progress:
            progress(len(chunk))
    return out


@torch.inference_mode()
def rtd_scores(detector_fn: Logits, sentences: list[Sentence], pad_id: int, batch_tokens: int = 8192,
               device="cpu", progress=None) -> np.ndarray:
    """(N,) summed log-probabilities that each scored token is the original (ELECTRA's detector)."""
    out = np.zeros(len(sentences), dtype=np.float64)
    for chunk, _, z in _forward_batches(detector_fn, sentences, pad_id, batch_tokens, None, device):
        original = F.logsigmoid(-z.float()).cpu().numpy()  # (B, T): log P(original)
        for b, i in enumerate(chunk):
            out[i] = float(np.sum(original[b, sentences[i].scored], dtype=np.float64))
        if progress:
            progress(len(chunk))
    return out


def score_sentences(kind: str, fn, sentences: list[Sentence], pad_id: int, mask_id: int | None, variants: list[str],
                    batch_tokens: int = 8192, vocab_size: int | None = None, device="cpu", progress=None) -> dict[str, np.ndarray]:
    """The scores of ``sentences`` under the scorer of objective ``kind``, by method name:
    mlm ``pll-<variant>`` per variant, clm ``log-probability``, rtd ``detector``."""
    if kind == "mlm":
        got = pll_scores(fn, sentences, mask_id, pad_id, variants, batch_tokens, vocab_size, device, progress)
        return {f"pll-{v}": s for v, s in got.items()}
    if kind == "clm":
        return {"log-probability": clm_scores(fn, sentences, pad_id, batch_tokens, vocab_size, device, progress)}
    if kind == "rtd":
        return {"detector": rtd_scores(fn, sentences, pad_id, batch_tokens, device, progress)}
    raise ValueError(f"unknown objective kind '{kind}' (mlm, clm or rtd)")
