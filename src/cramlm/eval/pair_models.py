"""Every checkpoint ``cramlm eval`` loads, as the sentence scorers of minimal pairs see it: which
objective kind scores it (mlm, clm, rtd: eval/sentence_scores.py), a callable into its trained head,
and its text given as in pretraining.

- cramlm runs. Masked LMs: ``[CLS] text [SEP]`` (a document at the start of a pretraining block,
  which starts with [CLS]; documents end with the separator); causal LMs: the separator, then the
  text (pretraining's token stream puts the end-of-document token before every document but the
  first). The run's objective names its scorers (models/objectives/: ``scorers``): ELECTRA runs the
  discriminator's detector on the masked-LM input and the generator's pseudo-log-likelihood beside it
  (never the discriminator's MLM head, which RTD does not train); hybrid runs the causal
  log-probability and the masked mode's pseudo-log-likelihood.
- transformers checkpoints. Masked LMs: the tokenizer's own special tokens; causal LMs: the BOS
  token (else EOS) before the text, as lm-evaluation-harness gives an empty context; a cramlm
  ELECTRA export: its detector, and its ``generator/`` folder's pseudo-log-likelihood; a cramlm hybrid
  export: as its run (the causal log-probability, the masked LM's PLL beside). A masked or
  causal LM whose LM head is not in the checkpoint is refused (its head would be random).
- the untrained twin: the same, with the random weights the twin has (heads included).
"""

from __future__ import annotations

import copy
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from cramlm.eval.sentence_scores import Sentence


@dataclass
class PairModel:
    """One scorer of sentences: ``kind`` mlm (``fn`` a Predict), clm or rtd (``fn`` a Logits);
    ``encode`` tokenizes texts as the model saw text in pretraining (described by ``input``)."""

    name: str  # its name in tables: pll, log-probability, detector, generator
    kind: str  # "mlm" | "clm" | "rtd"
    fn: Callable
    encode: Callable[[list[str]], list[Sentence]]
    pad_id: int
    mask_id: int | None
    input: str
    full_logits_vocab: int | None = None  # the vocabulary when fn computes (B, T, V) logits (caps the batch)


class PairsUnavailable(ValueError):
    """The checkpoint cannot score minimal pairs (e.g. its LM head was never trained); says why."""


def pair_models(ckpt, device) -> list[PairModel]:
    """The scorers of ``ckpt`` (eval/checkpoints.py), the headline first."""
    if ckpt.lm is not None:
        return cramlm_pair_models(ckpt, device)
    if ckpt.hf_source:
        return hf_pair_models(ckpt, device)
    raise PairsUnavailable(f"{ckpt.label}: no language-model head to score sentences with")


# ------------------------------------------------------------------------------ cramlm runs


def cramlm_encoder(tok, prefix: list[int], suffix: list[int]) -> Callable[[list[str]], list[Sentence]]:
    """Texts -> Sentences: ``prefix`` + the text's tokens (no template) + ``suffix``; the text's tokens are
    scored. Nothing is cut: score_pairs refuses a sentence longer than the model's positions."""

    def encode(texts: list[str]) -> list[Sentence]:
        out = []
        for enc in tok.encode_batch(texts, add_special_tokens=False):
            ids = prefix + enc.ids + suffix
            words = [-1] * len(prefix) + [-1 if w is None else w for w in enc.word_ids] + [-1] * len(suffix)
            out.append(Sentence(ids, list(range(len(prefix), len(prefix) + len(enc.ids))), words))
        return out

    return encode


def cramlm_pair_models(ckpt, device) -> list[PairModel]:
    from cramlm.data.tokenizer import CLS_ID, MASK_ID, PAD_ID, separator_id
    from cramlm.models.objectives.base import build_objective

    lm = ckpt.lm
    tok, cfg = copy.deepcopy(ckpt.tokenizer.tok), lm.config
    tok.no_truncation()  # a sentence too long is refused, never cut
    sep = separator_id(tok, cfg.data.tokenizer.separator)
    sep_token = tok.id_to_token(sep)
    objective = build_objective(cfg)
    if lm.model is None:
        raise PairsUnavailable(f"{ckpt.label}: {objective.config.parts_title} are not in the run folder (no "
                               f"{objective.trained_parts}, no checkpoint); its MLM head was never trained")
    model = lm.model.to(device).eval()
    if objective.config.arch_kind == "clm":
        encode = cramlm_encoder(tok, [sep], [])
        text = f"{sep_token} + text (the end-of-document token before it, as in pretraining)"
    else:
        encode = cramlm_encoder(tok, [CLS_ID], [sep])
        text = f"[CLS] text {sep_token} (a document at the start of a pretraining block)"
    return [PairModel(s.name, s.kind, s.fn, encode, PAD_ID, MASK_ID if s.kind != "clm" else None, text,
                      model.vocab_size if s.full_logits else None) for s in objective.scorers(model)]


# ------------------------------------------------------------------------------ transformers


def hf_encoder(tok, kind: str) -> tuple[Callable[[list[str]], list[Sentence]], str]:
    """Texts -> Sentences for a transformers tokenizer, and the input in words (nothing cut, as cramlm_encoder)."""
    fast = getattr(tok, "is_fast", False)
    if kind == "clm":
        prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        if prefix is None:
            raise PairsUnavailable("a causal LM whose tokenizer has neither a BOS nor an EOS token to condition the first word on")
        name = tok.convert_ids_to_tokens(prefix)

        def encode(texts: list[str]) -> list[Sentence]:
            batch = tok(texts, add_special_tokens=False)
            return [Sentence([prefix] + ids, list(range(1, len(ids) + 1)), [-1] + _words(batch, i, len(ids), fast))
                    for i, ids in enumerate(batch["input_ids"])]

        return encode, f"{name} + text (an empty context, as lm-evaluation-harness gives it)"

    def encode(texts: list[str]) -> list[Sentence]:
        batch = tok(texts, return_special_tokens_mask=True)
        out = []
        for i, ids in enumerate(batch["input_ids"]):
            special = batch["special_tokens_mask"][i]
            out.append(Sentence(list(ids), [t for t, s in enumerate(special) if not s], _words(batch, i, len(ids), fast)))
        return out

    return encode, "the tokenizer's own special tokens around the text" + (
        "" if fast else " (a slow tokenizer: no word boundaries, so PLL word-l2r is the original PLL)")


def _words(batch, i: int, n: int, fast: bool) -> list[int]:
    """Word indices of row ``i`` (-1 for special tokens); a slow tokenizer knows none: one word per
    token (then word-l2r is the original PLL; ``input`` says so)."""
    if not fast:
        return list(range(n))
    return [-1 if w is None else w for w in batch.word_ids(i)]


def hf_kind(config) -> str:
    """mlm, clm, rtd or hybrid: a cramlm ELECTRA export or an ELECTRA discriminator is rtd, a cramlm
    hybrid (GPT-BERT) export, a masked and a causal LM over the same weights, hybrid."""
    from cramlm.eval.checkpoints import is_causal

    archs = getattr(config, "architectures", None) or []
    if getattr(config, "objective", None) == "hybrid":
        return "hybrid"
    if getattr(config, "objective", None) == "rtd" or (config.model_type == "electra" and any("PreTraining" in a for a in archs)):
        return "rtd"
    return "clm" if is_causal(config) else "mlm"


def load_hf_lm(source: str, kind: str, untrained: bool, remote: bool, seed: int):
    """The transformers LM model of ``source`` for ``kind``; refused when its head is not in the checkpoint."""
    import transformers

    auto = {"mlm": transformers.AutoModelForMaskedLM, "clm": transformers.AutoModelForCausalLM,
            "rtd": transformers.AutoModelForPreTraining}[kind]
    if untrained:
        torch.manual_seed(seed)
        config = transformers.AutoConfig.from_pretrained(source, trust_remote_code=remote)
        from cramlm.eval.checkpoints import untrained_as_cramlm

        return untrained_as_cramlm(auto.from_config(config, trust_remote_code=remote))
    try:
        model, info = auto.from_pretrained(source, trust_remote_code=remote, output_loading_info=True)
    except ValueError as e:
        raise PairsUnavailable(f"{source}: no {kind} head class ({str(e).splitlines()[0]})") from None
    if info.get("missing_keys"):
        missing = sorted(info["missing_keys"])
        raise PairsUnavailable(f"{source}: its {kind.upper()} head is not in the checkpoint (missing {missing[:3]}"
                               f"{' ...' if len(missing) > 3 else ''}): it would score with random weights")
    return model


def hf_pair_models(ckpt, device) -> list[PairModel]:
    import transformers

    remote = ckpt.trust_remote_code
    source = ckpt.hf_source
    config = transformers.AutoConfig.from_pretrained(source, trust_remote_code=remote)
    kind = hf_kind(config)
    tok = ckpt.tokenizer.tok
    seed = ckpt.identity.get("seed") or 0
    encode, text = hf_encoder(tok, "clm" if kind == "clm" else "mlm")
    pad = ckpt.tokenizer.pad_id
    vocab = config.vocab_size
    if kind == "hybrid":  # scored as its run is: causal log-probability of [CLS] text [SEP]'s text, the PLL beside
        causal, masked = (load_hf_lm(source, k, ckpt.untrained, remote, seed).to(device).eval() for k in ("clm", "mlm"))
        return [PairModel("log-probability", "clm", lambda ids, mask: causal(input_ids=ids, attention_mask=mask).logits,
                          encode, pad, None, text, vocab),
                PairModel("pll", "mlm", full_at_positions(lambda ids, mask: masked(input_ids=ids, attention_mask=mask).logits),
                          encode, pad, tok.mask_token_id, text, vocab)]
    model = load_hf_lm(source, kind, ckpt.untrained, remote, seed).to(device).eval()

    def logits(ids, mask):
        return model(input_ids=ids, attention_mask=mask).logits

    if kind == "clm":
        return [PairModel("log-probability", "clm", logits, encode, pad, None, text, vocab)]
    if kind == "mlm":
        return [PairModel("pll", "mlm", full_at_positions(logits), encode, pad, tok.mask_token_id, text, vocab)]
    out = [PairModel("detector", "rtd", logits, encode, pad, tok.mask_token_id, text)]
    generator = Path(source) / "generator"
    if (generator / "config.json").is_file():
        gen = load_hf_lm(str(generator), "mlm", ckpt.untrained, remote, seed).to(device).eval()
        out.append(PairModel("generator", "mlm", full_at_positions(lambda ids, mask: gen(input_ids=ids, attention_mask=mask).logits),
                             encode, pad, tok.mask_token_id, text, vocab))
    return out


def full_at_positions(logits: Callable):
    """A Predict from a model that computes (B, T, V) logits: the row's one position."""

    def predict(ids: torch.Tensor, mask: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
        return logits(ids, mask)[torch.arange(len(ids), device=ids.device), where]  # (B, V)

    return predict


# ------------------------------------------------------------------------------ scoring


@contextmanager
def exact_fp32():
    """TF32 off while sentences are scored (impl.tf32 turns it on for training on CUDA): its ~1e-3
    relative matmul error would move a sentence's score with its batch's padding by more than a tie's
    1e-4 nats. No effect on a CPU."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def score_pairs(ckpt, cfg, pairs: list, device, say=print, progress=None, kept: dict | None = None, keep=None,
                seconds_before: float = 0.0) -> dict:
    """``eval.json``'s ``minimal_pairs`` of ``ckpt``: per scorer (the headline first) the accuracy
    record of eval/pairs.py, how text was given, the time taken. ``progress(n)`` is called after
    each batch of n sentences (it may raise to stop). Sentences are scored ``cfg.save_every`` at a
    time, ``keep(kept, seconds)`` called after each slice with every score so far (scorer -> method ->
    the scores of the first sentences, in order) and the seconds spent scoring; ``kept`` and
    ``seconds_before`` from a stopped evaluation: those are not scored again (a sentence's score does
    not depend on its batch, so the result is the same) and ``seconds`` counts both processes."""
    from cramlm.eval.pairs import accuracy
    from cramlm.eval.sentence_scores import score_sentences

    start = time.perf_counter()
    models = [pm for pm in pair_models(ckpt, device) if cfg.generator or pm.name != "generator"]
    if cfg.pll != type(cfg).model_fields["pll"].default and all(pm.kind != "mlm" for pm in models):
        say(f"minimal pairs: eval.minimal_pairs.pll={cfg.pll} does not apply to {ckpt.label}: it has no masked-LM "
            f"scorer (scored by {', '.join(pm.name for pm in models)})")
    texts = list(dict.fromkeys(t for p in pairs for t in (p.good, p.bad)))  # each distinct sentence once
    kept = dict(kept or {})
    scores: dict[str, dict[str, float]] = {}
    for pm in models:
        began = time.perf_counter()
        before = kept.get(pm.name) or {}
        n = min((len(v) for v in before.values()), default=0)  # sentences every method has: the rest is scored
        got = {m: list(v[:n]) for m, v in before.items()}
        say(f"minimal pairs: {ckpt.label} {pm.name}: scoring {len(texts):,} sentences"
            + (f" ({n:,} scored before, kept)" if n else ""))
        sentences = pm.encode(texts)
        check_sentences(pairs, dict(zip(texts, sentences)), ckpt.max_length, cfg.fields, ckpt.label)
        for lo in range(n, len(texts), cfg.save_every):
            with exact_fp32():
                values = score_sentences(pm.kind, pm.fn, sentences[lo: lo + cfg.save_every], pm.pad_id, pm.mask_id,
                                         cfg.pll, cfg.batch_tokens, pm.full_logits_vocab, device, progress)
            for method, v in values.items():
                got.setdefault(method, []).extend(v.tolist())
            kept[pm.name] = got
            if keep:
                keep(kept, seconds_before + time.perf_counter() - start)
        for method, v in got.items():
            name = method if pm.name in ("pll", "log-probability", "detector") else f"{pm.name} {method}"
            scores[name] = dict(zip(texts, v))
        say(f"minimal pairs: {ckpt.label} {pm.name}: {len(texts):,} sentences in {time.perf_counter() - began:.1f}s")
    records = {name: accuracy(pairs, [s[p.good] for p in pairs], [s[p.bad] for p in pairs]) for name, s in scores.items()}
    return {"kind": models[0].kind, "headline": next(iter(records)), "input": models[0].input,
            "scores": records, "sentences": len(texts), "sources": list(cfg.paths),
            "seconds": round(seconds_before + time.perf_counter() - start, 3)}


def check_sentences(pairs: list, encoded: dict, max_length: int, fields, label: str) -> None:
    """A sentence with no token to score (its characters all dropped by the tokenizer: it would score 0, above
    any sentence that has tokens) is an error in the pairs; one longer than the model's positions is this
    model's limit (a recipe's pairs on a model trained with shorter sequences): the scoring is skipped, the
    reason recorded (PairsUnavailable). Either names its pair's file and line; nothing is cut."""
    from cramlm.eval.pairs import PairsError

    def wrong(s: Sentence) -> str | None:
        if not s.scored:
            return "has no token to score (the tokenizer keeps none of its characters)"
        if len(s.ids) > max_length:
            return f"is {len(s.ids)} tokens as the model reads it, longer than {label}'s {max_length} positions"
        return None

    bad = {text: why for text, s in encoded.items() if (why := wrong(s))}
    empty = {text: why for text, why in bad.items() if why.startswith("has no token")}
    for found, error in ((empty, PairsError), (bad, PairsUnavailable)):
        for p in pairs:
            for key, text in ((fields.good, p.good), (fields.bad, p.bad)):
                if text in found:
                    more = f" ({len(found) - 1} more such sentence{'s' if len(found) > 2 else ''})" if len(found) > 1 else ""
                    raise error(f"{p.where or p.paradigm}: field '{key}' {found[text]}{more}")
