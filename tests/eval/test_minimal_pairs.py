"""Zero-shot minimal pairs (eval/pairs.py, eval/sentence_scores.py, eval/pair_models.py): reading pair
files, ties counted half, the scorers against hand computation, against transformers on an export
and against lm-evaluation-harness, and every kind of checkpoint through `cramlm eval`."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cramlm.cli import main
from cramlm.eval.pairs import (BLIMP_SHARED_36, Pair, PairFields, PairsConfig, PairsError, accuracy, load_pairs,
                               pairs_text, read_pairs, reference)
from cramlm.eval.sentence_scores import Sentence, clm_scores, pll_copies, pll_scores, rtd_scores

FIXTURES = Path(__file__).parent / "fixtures" / "minimal_pairs"
PAIRS = f"eval.minimal_pairs.paths=[{FIXTURES}]"


# ------------------------------------------------------------------------------ files


def test_a_folder_reads_every_jsonl_with_blimps_fields(tmp_path):
    pairs = load_pairs(PairsConfig(paths=[str(FIXTURES)]))
    assert len(pairs) == 8 and {p.paradigm for p in pairs} == {"anaphor", "subject_verb"}
    assert {p.phenomenon for p in pairs} == {"anaphor_agreement", "subject_verb_agreement"}
    assert pairs[0].good == "Ishmael saw himself in the water." and pairs[0].bad == "Ishmael saw herself in the water."
    assert len(load_pairs(PairsConfig(paths=[str(FIXTURES / "anaphor.jsonl")], max_pairs=3))) == 3


def test_field_names_are_configurable_and_a_file_without_a_paradigm_is_its_stem(tmp_path):
    path = tmp_path / "agreement.jsonl"
    path.write_text(json.dumps({"ok": "A cat runs.", "ko": "A cat run."}) + "\n\n" + json.dumps({"ok": "Cats run.", "ko": "Cats runs."}) + "\n")
    pairs = read_pairs(path, PairFields(good="ok", bad="ko", paradigm=None, phenomenon=None))
    assert [(p.good, p.paradigm, p.phenomenon) for p in pairs] == [("A cat runs.", "agreement", "agreement"),
                                                                   ("Cats run.", "agreement", "agreement")]


@pytest.mark.parametrize("line, message", [
    ('{"sentence_good": "A b.", "sentence_bad": "A c."}\n{"sentence_good": "A b."}', "bad.jsonl:2: field 'sentence_bad'"),
    ('{"sentence_good": "A b.", "sentence_bad": ""}', "bad.jsonl:1: field 'sentence_bad' (eval.minimal_pairs.fields) is not"),
    ('{"sentence_good": "A b.",', "bad.jsonl:1: invalid JSON"),
    ('["A b.", "A c."]', "bad.jsonl:1: expected a JSON object"),
    ("", "bad.jsonl: no pairs"),
    ('{"sentence_good": "A b.", "sentence_bad": "A c.", "UID": "p", "linguistics_term": "x"}\n'
     '{"sentence_good": "A d.", "sentence_bad": "A e.", "UID": "p", "linguistics_term": "y"}',
     "bad.jsonl:2: paradigm 'p' has phenomenon 'y' here, 'x' on line 1"),  # was: silently the last one's
    ('{"sentence_good": "A b.", "sentence_bad": "A c.", "UID": ["p"]}', "bad.jsonl:1: field 'UID' (eval.minimal_pairs.fields) is not a name"),
    ('{"sentence_good": "A b.", "sentence_bad": "A c."}\n{"sentence_good": "A b.", "sentence_bad": "A \\ud800 c."}',
     "bad.jsonl:2: field 'sentence_bad' is not valid Unicode text"),  # a lone surrogate: was a tokenizer's TypeError
    ('{"sentence_good": "A b.", "sentence_bad": "A c.", "UID": "p", "linguistics_term": "x\\ud800"}',
     "bad.jsonl:1: field 'linguistics_term' is not valid Unicode text"),  # was: an error writing eval.md, after scoring
])
def test_a_bad_pair_file_is_one_error_naming_file_and_line(tmp_path, line, message):
    (tmp_path / "bad.jsonl").write_text(line + "\n")
    with pytest.raises(PairsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_pairs(PairsConfig(paths=[str(tmp_path / "bad.jsonl")]))


def test_a_pair_file_not_in_utf8_is_named_by_its_line(tmp_path):
    good = json.dumps({"sentence_good": "A b.", "sentence_bad": "A c."}).encode()
    (tmp_path / "bad.jsonl").write_bytes(good + b"\n" + good + b"\n" + good.replace(b"A b.", b"A caf\xe9.") + b"\n")
    with pytest.raises(PairsError, match=r"bad.jsonl:3: not UTF-8 text \(byte 0xe9: "):
        load_pairs(PairsConfig(paths=[str(tmp_path / "bad.jsonl")]))


def test_a_folder_reads_gzipped_pair_files_too(tmp_path):
    import gzip

    (tmp_path / "anaphor.jsonl").write_text((FIXTURES / "anaphor.jsonl").read_text())
    with gzip.open(tmp_path / "subject_verb.jsonl.gz", "wt") as f:
        f.write((FIXTURES / "subject_verb.jsonl").read_text())
    def read(folder):
        return [(p.good, p.bad, p.paradigm, p.phenomenon, Path(p.where).name) for p in load_pairs(PairsConfig(paths=[str(folder)]))]

    assert read(tmp_path) == [(*pair[:4], where.replace("subject_verb.jsonl", "subject_verb.jsonl.gz")) for *pair, where in read(FIXTURES)]


def test_a_gzipped_file_without_paradigms_is_named_as_its_plain_twin_would_be(tmp_path):
    import gzip

    line = json.dumps({"sentence_good": "A cat runs.", "sentence_bad": "A cat run."}) + "\n"
    (tmp_path / "agreement.jsonl").write_text(line)
    with gzip.open(tmp_path / "agreement.jsonl.gz", "wt") as f:
        f.write(line)
    fields = PairFields(paradigm=None, phenomenon=None)
    assert {p.paradigm for p in read_pairs(tmp_path / "agreement.jsonl.gz", fields)} == {"agreement"}  # was: agreement.jsonl
    with pytest.raises(PairsError, match="paradigm 'agreement' is also in"):  # the same pairs twice: refused, not counted twice
        load_pairs(PairsConfig(paths=[str(tmp_path)], fields=fields))


def test_the_config_refuses_one_field_for_both_sentences_and_a_variant_twice():
    with pytest.raises(ValueError, match="the two sentences need fields of their own"):
        PairFields(good="sentence_bad")
    with pytest.raises(ValueError, match="the two sentences need fields of their own"):
        PairFields(good="UID")
    with pytest.raises(ValueError, match="each variant once"):
        PairsConfig(pll=["original", "original"])


def test_missing_paths_and_a_paradigm_in_two_files_are_refused(tmp_path):
    with pytest.raises(PairsError, match="nope: no such file or folder"):
        load_pairs(PairsConfig(paths=[str(tmp_path / "nope")]))
    (tmp_path / "empty").mkdir()
    with pytest.raises(PairsError, match=r"no \*.jsonl or \*.jsonl.gz files"):
        load_pairs(PairsConfig(paths=[str(tmp_path / "empty")]))
    with pytest.raises(PairsError, match="anaphor.jsonl is read twice"):  # a file listed, then its folder
        load_pairs(PairsConfig(paths=[str(FIXTURES / "anaphor.jsonl"), str(FIXTURES)]))
    (tmp_path / "copy.jsonl").write_text((FIXTURES / "anaphor.jsonl").read_text())
    with pytest.raises(PairsError, match="paradigm 'anaphor' is also in"):
        load_pairs(PairsConfig(paths=[str(FIXTURES / "anaphor.jsonl"), str(tmp_path / "copy.jsonl")]))


def test_a_folder_whose_subfolders_hold_pairs_is_refused_not_read_in_part(tmp_path):
    (tmp_path / "sub").mkdir()
    for path in (tmp_path / "top.jsonl", tmp_path / "sub" / "inner.jsonl"):
        path.write_text(json.dumps({"sentence_good": "A cat runs.", "sentence_bad": "A cat run."}) + "\n")
    with pytest.raises(PairsError, match=r"subfolder sub holds pair files \(\*.jsonl, \*.jsonl.gz\), which would not be read"):
        load_pairs(PairsConfig(paths=[str(tmp_path)]))  # was: top.jsonl alone, the subfolder's pairs silently left out
    assert len(load_pairs(PairsConfig(paths=[str(tmp_path), str(tmp_path / "sub")]))) == 2


@pytest.mark.parametrize("key", ["paradigm", "phenomenon"])
def test_a_field_name_of_ones_own_that_no_line_has_is_refused_not_a_silent_regrouping(tmp_path, key):
    typo = {"paradigm": "uid", "phenomenon": "linguistic_term"}[key]
    with pytest.raises(PairsError, match=f"anaphor.jsonl: no line has field '{typo}' \\(eval.minimal_pairs.fields.{key}\\)"):
        load_pairs(PairsConfig(paths=[str(FIXTURES)], fields=PairFields(**{key: typo})))
    pairs = read_pairs(FIXTURES / "anaphor.jsonl", PairFields(**{key: "field"}))  # a name the lines have
    assert {getattr(p, key) for p in pairs} == {"morphology"}
    path = tmp_path / "own.jsonl"  # BLiMP's own names absent from every line: the file's stem, then the paradigm
    path.write_text(json.dumps({"sentence_good": "A cat runs.", "sentence_bad": "A cat run."}) + "\n")
    assert [(p.paradigm, p.phenomenon) for p in read_pairs(path, PairFields())] == [("own", "own")]


def test_the_shared_blimp_paradigms_load(shared_data):
    pairs = load_pairs(PairsConfig(paths=[str(shared_data / "minimal_pairs" / "blimp")]))
    assert len(pairs) == 36_000 and {p.paradigm for p in pairs} == BLIMP_SHARED_36
    assert len({p.phenomenon for p in pairs}) >= 12


# ------------------------------------------------------------------------------ accuracy and ties


def pairs_of(paradigms: dict[str, int]) -> list[Pair]:
    return [Pair(f"g{i}", f"b{i}", name, "phen-" + name[0]) for name, n in paradigms.items() for i in range(n)]


def test_ties_count_half_and_the_tie_rate_is_reported():
    pairs = pairs_of({"a1": 4, "a2": 2, "b": 2})
    good = [-1.0, -1.0, -5.0, -2.0, -3.0, -3.0, -1.0, -1.0]
    bad = [-2.0, -1.0 - 5e-5, -4.0, -2.0, -4.0, -3.0 + 0.5, -1.0, -1.0]  # 5e-5 apart: a tie (fp noise)
    got = accuracy(pairs, good, bad)
    assert got["paradigms"]["a1"] == {"accuracy": (1 + 0.5 + 0 + 0.5) / 4, "ties": 0.5, "pairs": 4, "phenomenon": "phen-a"}
    assert got["paradigms"]["a2"]["accuracy"] == 0.5 and got["paradigms"]["b"]["accuracy"] == 0.5
    assert got["phenomena"] == {"phen-a": (0.5 + 0.5) / 2, "phen-b": 0.5}  # the mean of its paradigms
    assert got["accuracy"] == pytest.approx((0.5 + 0.5 + 0.5) / 3)  # macro over paradigms
    assert got["tie_rate"] == 4 / 8
    assert got["off_chance"] == {"above": 0, "below": 0}


def test_paradigms_off_chance_are_counted_both_ways():
    """Macro 50% from two paradigms passed and failed outright is not a model at chance: the table says so."""
    pairs = pairs_of({"pass": 30, "fail": 30, "coin": 30})
    good = [-1.0] * 30 + [-2.0] * 30 + [-1.0, -2.0] * 15
    bad = [-2.0] * 30 + [-1.0] * 30 + [-2.0, -1.0] * 15  # the coin: right on every other pair
    got = accuracy(pairs, good, bad)
    assert got["accuracy"] == pytest.approx(0.5) and got["paradigms"]["coin"]["accuracy"] == 0.5
    assert got["off_chance"] == {"above": 1, "below": 1}
    text = pairs_text({"headline": "log-probability", "scores": {"log-probability": got}})
    assert re.search(r"paradigms off chance \(above / below\) +1 / 1$", text, re.M), text


def test_a_model_that_scores_every_sentence_alike_is_at_chance_not_100():
    pairs = pairs_of({"x": 10})
    got = accuracy(pairs, [-3.0] * 10, [-3.0] * 10)
    assert got["accuracy"] == 0.5 and got["tie_rate"] == 1.0  # lm-eval's argmax would say 100
    text = pairs_text({"headline": "pll-word-l2r", "scores": {"pll-word-l2r": got}})
    assert "tie rate" in text and "100.0" in text and "50.0" in text


def test_a_twin_scored_on_other_pairs_is_not_set_beside_the_run(tmp_path):
    """A twin evaluated with another max_pairs or other files: no margin, no verdict, and the console and the
    report say why (they compared the macro averages of different tests)."""
    from cramlm.eval.pairs import pairs_verdict, pairs_versus
    from cramlm.report.html import pairs_table
    from cramlm.report.rundata import RunData

    def record(paradigms, good):
        pairs = pairs_of(paradigms)
        return {"kind": "mlm", "headline": "pll-word-l2r", "scores": {"pll-word-l2r": accuracy(pairs, good, [-2.0] * len(pairs))}}

    run = record({"a": 2, "b": 2}, [-1.0, -1.0, -3.0, -3.0])
    same, fewer = record({"a": 2, "b": 2}, [-3.0] * 4), record({"a": 2}, [-3.0, -3.0])
    assert len(pairs_versus(run, same)) == 2 and pairs_verdict(run, same)
    assert pairs_versus(run, fewer) == [] and pairs_verdict(run, fewer) is None
    text = pairs_text(run, fewer)
    assert "untrained twin" not in text.splitlines()[1]  # no twin column
    assert "the untrained twin was scored on other pairs (2 in 1 paradigms, against 4 in 2): not compared" in text
    html = pairs_table([RunData(tmp_path, "r", eval={"minimal_pairs": run}, eval_untrained={"minimal_pairs": fewer})])
    assert "margin" not in html and "r: the untrained twin was scored on other pairs" in html
    assert "margin" in pairs_table([RunData(tmp_path, "r", eval={"minimal_pairs": run}, eval_untrained={"minimal_pairs": same})])


def test_a_twin_scored_by_another_pll_variant_is_not_set_beside_the_run(tmp_path):
    """A twin evaluated with another eval.minimal_pairs.pll on the same pairs: its headline is another
    scorer, so a margin would set word-l2r PLL against the original PLL (it was drawn, unsaid)."""
    from cramlm.eval.pairs import pairs_verdict, pairs_versus
    from cramlm.report.html import pairs_table
    from cramlm.report.rundata import RunData

    pairs = pairs_of({"a": 2, "b": 2})
    run = {"kind": "mlm", "headline": "pll-word-l2r", "scores": {"pll-word-l2r": accuracy(pairs, [-1.0] * 4, [-2.0] * 4)}}
    twin = {"kind": "mlm", "headline": "pll-original", "scores": {"pll-original": accuracy(pairs, [-3.0] * 4, [-2.0] * 4)}}
    assert pairs_versus(run, twin) == [] and pairs_verdict(run, twin) is None
    text = pairs_text(run, twin)
    assert "untrained twin" not in text.splitlines()[1]
    assert "the untrained twin was scored by pll-original, the run by pll-word-l2r: not compared" in text
    html = pairs_table([RunData(tmp_path, "r", eval={"minimal_pairs": run}, eval_untrained={"minimal_pairs": twin})])
    assert "margin" not in html and "r: the untrained twin was scored by pll-original" in html


def test_reference_figures_only_for_the_shared_36():
    assert reference(BLIMP_SHARED_36)["GPT-2 (1.5B)"] == 81.2
    assert reference(set(BLIMP_SHARED_36) - {"passive_1"}) is None


# ------------------------------------------------------------------------------ scorers by hand


V = 7
MASK, PAD = 1, 0


def toy_logits(row: list[int], where: int) -> list[float]:
    """A masked 'LM' whose logits at ``where`` depend on the row's visible tokens: hand-computable."""
    visible = sum(t for t in row if t not in (MASK, PAD))
    n_masked = sum(t == MASK for t in row)
    return [math.sin(v * (visible + 1) + where) + 0.3 * v * n_masked for v in range(V)]


def toy_predict(ids: torch.Tensor, mask: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    rows = [[int(t) for t, m in zip(r, a) if m] for r, a in zip(ids, mask)]  # padding is not seen
    return torch.tensor([toy_logits(r, int(w)) for r, w in zip(rows, where)], dtype=torch.float32)


def log_softmax(xs: list[float], i: int) -> float:
    top = max(xs)
    return xs[i] - top - math.log(sum(math.exp(x - top) for x in xs))


def hand_pll(s: Sentence, l2r: bool) -> float:
    total = 0.0
    for t in s.scored:
        row = list(s.ids)
        row[t] = MASK
        if l2r:
            for u in range(t + 1, len(row)):
                if s.words[u] != s.words[t]:
                    break
                row[u] = MASK
        total += log_softmax(toy_logits(row, t), s.ids[t])
    return total


# words: -1 special; sentence 2 has a 3-piece word, sentence 3 two 2-piece words
SENTENCES = [Sentence([2, 4, 5, 3], [1, 2], [-1, 0, 1, -1]),
             Sentence([2, 6, 6, 4, 5, 3], [1, 2, 3, 4], [-1, 0, 0, 0, 1, -1]),
             Sentence([2, 4, 5, 6, 2, 5, 3], [1, 2, 3, 4, 5], [-1, 0, 0, 1, 2, 2, -1])]


@pytest.mark.parametrize("batch_tokens", [1, 14, 10_000])
def test_pll_both_variants_match_a_hand_computation_whatever_the_batch(batch_tokens):
    got = pll_scores(toy_predict, SENTENCES, MASK, PAD, ["word-l2r", "original"], batch_tokens=batch_tokens)
    for i, s in enumerate(SENTENCES):
        assert got["original"][i] == pytest.approx(hand_pll(s, l2r=False), abs=1e-5)
        assert got["word-l2r"][i] == pytest.approx(hand_pll(s, l2r=True), abs=1e-5)
    assert got["word-l2r"][0] == pytest.approx(got["original"][0], abs=1e-6)  # one-piece words: the same
    assert abs(got["word-l2r"][1] - got["original"][1]) > 1e-3


def test_copies_both_variants_share_are_scored_once():
    sent, _, l2r, use = pll_copies(SENTENCES, ["word-l2r", "original"])
    scored = sum(len(s.scored) for s in SENTENCES)  # 11 tokens; 4 are pieces with more of their word after them
    assert len(use["original"]) == len(use["word-l2r"]) == scored
    assert len(sent) == scored + 4 and l2r.sum() == 4
    twice = pll_copies(SENTENCES, ["original", "original"])  # a variant listed twice: its indices once
    assert [len(twice[0]), len(twice[3]["original"])] == [scored, scored]


def test_clm_and_rtd_scores_match_a_hand_computation():
    torch.manual_seed(0)
    table = torch.randn(V, V)  # next-token logits from the current token alone (a bigram model)
    sentences = [Sentence([3, 4, 5], [1, 2], [-1, 0, 1]), Sentence([3, 6, 6, 2, 4], [1, 2, 3, 4], [-1, 0, 1, 2, 3])]
    got = clm_scores(lambda ids, mask: table[ids], sentences, PAD, batch_tokens=6)
    for s, score in zip(sentences, got):
        hand = sum(log_softmax(table[s.ids[t - 1]].tolist(), s.ids[t]) for t in s.scored)
        assert score == pytest.approx(hand, abs=1e-5)
    z = torch.randn(V)  # the detector's replaced-logit of each token id
    got = rtd_scores(lambda ids, mask: z[ids], sentences, PAD)
    for s, score in zip(sentences, got):
        assert score == pytest.approx(sum(-math.log1p(math.exp(float(z[s.ids[t]]))) for t in s.scored), abs=1e-5)


# ------------------------------------------------------------------------------ real runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny real runs (mlm on crammed-bert, mlm on bert-original, clm on gpt2 and llama, rtd) and their exports."""
    from cramlm.cli.export import export_run
    from tests.train.helpers import run_inprocess

    root = tmp_path_factory.mktemp("pair-runs")
    # a wide init: scores that depend on the context far beyond the tolerances (a short run at init_std 0.02 barely does)
    steps = ["budget=null", "train.budget.steps=3", "arch.init_std=0.5"]
    run_inprocess(root, "mlm", *steps)
    run_inprocess(root, "bert", *steps, "arch=bert-original-tiny")
    run_inprocess(root, "gpt", *steps, "arch=gpt2-tiny", "data.tokenizer.vocab_size=400")
    run_inprocess(root, "llama", *steps, "arch=llama-tiny", "data.tokenizer.vocab_size=400")
    run_inprocess(root, "rtd", *steps, "train.objective=rtd")
    for name in ("mlm", "bert", "gpt", "llama", "rtd"):
        export_run(str(root / name), str(root / f"hf-{name}"))
    return root


def scorer_scores(ckpt, texts, variants=("word-l2r", "original")) -> dict[str, np.ndarray]:
    from cramlm.eval.pair_models import pair_models
    from cramlm.eval.sentence_scores import score_sentences

    out = {}
    for pm in pair_models(ckpt, "cpu"):
        got = score_sentences(pm.kind, pm.fn, pm.encode(texts), pm.pad_id, pm.mask_id, list(variants), 64, pm.full_logits_vocab)
        out.update({f"{pm.name} {k}": v for k, v in got.items()})
    return out


def texts_of_fixtures() -> list[str]:
    return list(dict.fromkeys(t for p in load_pairs(PairsConfig(paths=[str(FIXTURES)])) for t in (p.good, p.bad)))


def transformers_pll(folder: Path, texts: list[str], l2r: bool) -> list[float]:
    """An independent pseudo-log-likelihood through transformers: one masked copy per forward."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True).eval()
    out = []
    for text in texts:
        enc = tok(text, return_special_tokens_mask=True)
        ids, words = enc["input_ids"], enc.word_ids()
        total = 0.0
        for i, special in enumerate(enc["special_tokens_mask"]):
            if special:
                continue
            row = list(ids)
            j = i
            while j < len(row) and (j == i or (l2r and words[j] is not None and words[j] == words[i])):
                row[j] = tok.mask_token_id
                j += 1
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([row])).logits[0, i]
            total += float(torch.log_softmax(logits.double(), -1)[ids[i]])
        out.append(total)
    return out


@pytest.mark.parametrize("name", ["mlm", "bert"])  # remote-code CramlmForMaskedLM, stock BertForMaskedLM
def test_the_masked_scorer_matches_transformers_on_the_export_to_1e_4(runs, name):
    pytest.importorskip("transformers")
    from cramlm.eval.checkpoints import load_checkpoint

    texts = texts_of_fixtures()
    ours = scorer_scores(load_checkpoint(str(runs / name), runs), texts)
    for variant in ("word-l2r", "original"):
        theirs = transformers_pll(runs / f"hf-{name}", texts, l2r=variant == "word-l2r")
        np.testing.assert_allclose(ours[f"pll pll-{variant}"], theirs, atol=1e-4, rtol=0)
    gap = np.abs(ours["pll pll-word-l2r"] - ours["pll pll-original"])  # multi-piece words in these texts
    assert gap.max() > 100 * 1e-4  # the variants differ far beyond the tolerance


@pytest.mark.parametrize("name", ["gpt", "llama"])  # exported as GPT2LMHeadModel, LlamaForCausalLM
def test_the_causal_scorer_gives_lm_evaluation_harness_s_loglikelihoods(runs, name):
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from cramlm.eval.checkpoints import load_checkpoint

    pairs = load_pairs(PairsConfig(paths=[str(FIXTURES)]))
    texts = [t for p in pairs for t in (p.good, p.bad)]
    lm = HFLM(pretrained=str(runs / f"hf-{name}"), device="cpu", batch_size=4)
    requests = [Instance(request_type="loglikelihood", doc={}, arguments=("", t), idx=i) for i, t in enumerate(texts)]
    theirs = [ll for ll, _ in lm.loglikelihood(requests, disable_tqdm=True)]
    run = scorer_scores(load_checkpoint(str(runs / name), runs), texts)["log-probability log-probability"]
    export = scorer_scores(load_checkpoint(str(runs / f"hf-{name}"), runs), texts)["log-probability log-probability"]
    np.testing.assert_allclose(run, theirs, atol=1e-4, rtol=0)
    np.testing.assert_allclose(export, theirs, atol=1e-4, rtol=0)


def test_an_rtd_export_is_what_was_trained_and_refuses_fill_mask(runs):
    transformers = pytest.importorskip("transformers")
    from cramlm.eval.checkpoints import load_checkpoint

    rtd = load_checkpoint(str(runs / "rtd"), runs).lm.model.eval()
    ids = torch.randint(5, 500, (2, 12))
    disc = transformers.AutoModelForPreTraining.from_pretrained(runs / "hf-rtd", trust_remote_code=True).eval()
    gen = transformers.AutoModelForMaskedLM.from_pretrained(runs / "hf-rtd" / "generator", trust_remote_code=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(disc(input_ids=ids).logits, rtd.detector(rtd.encode(ids)).squeeze(-1), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gen(input_ids=ids).logits, rtd.generator.head(rtd.generator.trunk(ids)), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="AutoModelForMaskedLM"):  # its MLM head was never trained
        transformers.AutoModelForMaskedLM.from_pretrained(runs / "hf-rtd", trust_remote_code=True)
    texts = texts_of_fixtures()  # the run and its export score alike
    a, b = scorer_scores(load_checkpoint(str(runs / "rtd"), runs), texts), scorer_scores(load_checkpoint(str(runs / "hf-rtd"), runs, trust_remote_code=True), texts)
    assert a.keys() == b.keys() == {"detector detector", "generator pll-word-l2r", "generator pll-original"}
    for k in a:
        np.testing.assert_allclose(a[k], b[k], atol=1e-4, rtol=0)


def test_a_checkpoint_is_scored_as_its_run_at_that_step(runs, tmp_path, monkeypatch):
    """checkpoint=<run>/checkpoints/step-N is the run at that step, ELECTRA's generator and detector taken from
    the checkpoint's own weights: the final checkpoint scores exactly as the run does; results go to the run
    folder as eval-step-N. A run without its final weights names its newest checkpoint."""
    import shutil

    from cramlm.eval.checkpoints import CheckpointError, load_checkpoint

    texts = texts_of_fixtures()
    for name in ("mlm", "rtd"):
        run = load_checkpoint(str(runs / name), runs)
        step = load_checkpoint(str(runs / name / "checkpoints" / "step-00000003"), runs)
        assert (step.label, step.stem, step.out_dir) == (f"{name}/step-00000003", "eval-step-00000003", runs / name)
        summary = json.loads((runs / name / "summary.json").read_text())
        # the training each had (the final checkpoint's, as the run's)
        assert step.trained == run.trained == {k: summary[k] for k in ("steps", "tokens", "flops")} and summary["steps"] == 3
        a, b = scorer_scores(run, texts), scorer_scores(step, texts)
        assert len(a) == (3 if name == "rtd" else 2) and a.keys() == b.keys()
        assert all(np.array_equal(a[k], b[k]) for k in a), name
        twin = load_checkpoint(str(runs / name / "checkpoints" / "step-00000003-untrained"), runs)
        assert (twin.label, twin.identity, twin.trained) == (f"{name}-untrained", load_checkpoint(f"{name}-untrained", runs).identity, None)
    cut = tmp_path / "cut"
    shutil.copytree(runs / "rtd", cut)
    (cut / "model.safetensors").unlink(), (cut / "electra.safetensors").unlink()  # as a run cut off has neither
    with pytest.raises(CheckpointError, match=r"a cramlm run without its final weights \(model.safetensors\): training "
                       r"now, or cut off; its newest checkpoint is evaluated with checkpoint=.*cut/checkpoints/step-00000003$"):
        load_checkpoint(str(cut), tmp_path)
    # all it scores by comes from the checkpoint: the run's own weight files are not there
    a, b = scorer_scores(load_checkpoint(str(runs / "rtd"), runs), texts), scorer_scores(
        load_checkpoint(str(cut / "checkpoints" / "step-00000003"), tmp_path), texts)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert load_checkpoint("cut-untrained", tmp_path).label == "cut-untrained"  # the twin needs no final weights
    # a resumed run's settings may have changed since the checkpoint: its held-out set is as the run stood then
    config = cut / "config.yaml"
    then = load_checkpoint(str(cut / "checkpoints" / "step-00000003"), tmp_path).lm.mlm_probability
    config.write_text(config.read_text().replace(f"mlm_probability: {then}", "mlm_probability: 0.4"))
    assert "mlm_probability: 0.4" in config.read_text()
    assert load_checkpoint(str(cut / "checkpoints" / "step-00000003"), tmp_path).lm.mlm_probability == then != 0.4
    # named from inside the run folder, the checkpoint is still the run's (its label, its results file)
    monkeypatch.chdir(cut / "checkpoints")
    assert load_checkpoint("step-00000003", Path("elsewhere")).label == "cut/step-00000003"
    # a checkpoint set aside (step-N.superseded, ...) is no step of the run: its results would take step N's file
    shutil.copytree(cut / "checkpoints" / "step-00000003", cut / "checkpoints" / "step-00000003.superseded")
    with pytest.raises(CheckpointError, match="neither a cramlm run"):
        load_checkpoint("step-00000003.superseded", Path("elsewhere"))


def test_an_rtd_run_without_its_generator_and_detector_is_refused_never_scored_by_its_mlm_head(runs, tmp_path):
    """A run folder without electra.safetensors (as cramlm saved RTD runs before it kept one): its
    checkpoints hold the generator and detector, but they are not read in its place."""
    import shutil

    from cramlm.cli.export import export_run

    bare = tmp_path / "rtd-bare"
    shutil.copytree(runs / "rtd", bare, ignore=shutil.ignore_patterns("electra.safetensors"))
    assert any((bare / "checkpoints").iterdir())
    digests = json.loads((bare / "digests.json").read_text())
    digests["files"].pop("electra.safetensors")
    (bare / "digests.json").write_text(json.dumps(digests))
    result = CliRunner().invoke(main, ["eval", f"checkpoint={bare}", "eval.tasks=[]", "impl.progress=false", PAIRS])
    assert result.exit_code == 0, result.output
    assert f"{bare}: no electra.safetensors holds" in result.output and "retrain the run" in result.output
    assert "minimal pairs skipped" in result.output and "MLM head was never trained" in result.output
    assert "never trained" in json.loads((bare / "eval.json").read_text())["minimal_pairs"]["skipped"]
    with pytest.raises(FileNotFoundError, match=r"no electra.safetensors holds .*export a checkpoint of the run instead"):
        export_run(str(bare), str(tmp_path / "hf"))


def evaluate(checkpoint: Path, out: Path, *extra: str) -> dict:
    result = CliRunner().invoke(main, ["eval", f"checkpoint={checkpoint}", f"out_dir={out}", "eval.tasks=[]", "eval.lm_eval=false",
                                       "impl.progress=false", PAIRS, *extra])
    assert result.exit_code == 0, result.output
    assert "minimal pairs:" in result.output
    assert "no fine-tuning tasks (eval.tasks=[])" in result.output and "nan" not in result.output  # no means of nothing
    md = next(out.glob("eval*.md")).read_text()
    assert "no fine-tuning tasks" in md and "mean" not in md.split("minimal pairs")[0].lower()
    return json.loads(next(out.glob("eval*.json")).read_text())["minimal_pairs"]


@pytest.mark.parametrize("checkpoint, kind, headline", [
    ("mlm", "mlm", "pll-word-l2r"), ("gpt", "clm", "log-probability"), ("rtd", "rtd", "detector"),
    ("hf-bert", "mlm", "pll-word-l2r"), ("hf-mlm", "mlm", "pll-word-l2r"), ("hf-gpt", "clm", "log-probability"),
    ("hf-rtd", "rtd", "detector"), ("mlm-untrained", "mlm", "pll-word-l2r"), ("rtd-untrained", "rtd", "detector"),
    ("hf-gpt-untrained", "clm", "log-probability"), ("llama", "clm", "log-probability"),
    ("hf-llama", "clm", "log-probability"),
])
def test_every_checkpoint_kind_scores_minimal_pairs_in_cramlm_eval(runs, tmp_path, checkpoint, kind, headline):
    got = evaluate(runs / checkpoint, tmp_path, "trust_remote_code=true")
    assert got["kind"] == kind and got["headline"] == headline and list(got["scores"])[0] == headline
    if kind == "rtd":
        assert list(got["scores"]) == ["detector", "generator pll-word-l2r"]  # the generator's PLL beside
        alone = evaluate(runs / checkpoint, tmp_path / "detector-alone", "trust_remote_code=true",
                         "eval.minimal_pairs.generator=false")
        assert list(alone["scores"]) == ["detector"] and alone["scores"]["detector"] == got["scores"]["detector"]
    record = got["scores"][headline]
    assert record["pairs"] == 8 and set(record["paradigms"]) == {"anaphor", "subject_verb"}
    assert 0 <= record["accuracy"] <= 1 and 0 <= record["tie_rate"] <= 1


@pytest.mark.parametrize("checkpoint", ["mlm", "hf-gpt"])
def test_a_sentence_too_long_or_with_no_token_is_named_by_its_file_and_line(runs, tmp_path, checkpoint):
    """A sentence whose characters the tokenizer drops all would score 0 nats, above any real sentence: an
    error in the pairs. One longer than the model's positions is the model's limit: the scoring is skipped
    and the reason, naming the file and line, recorded (eval.json, console, eval.md); nothing is cut."""
    pair = {"sentence_good": "The whale swims in the sea.", "sentence_bad": "The whale swim in the sea."}
    long = dict(pair, sentence_bad="the whale " * 40 + "swim.")
    empty = dict(pair, sentence_bad="\u0301")  # a combining accent alone: no token left by the MLM tokenizer
    too_long = f"long.jsonl:2: field 'sentence_bad' is .* tokens as the model reads it, longer than {checkpoint}'s 32 positions"
    cases = [(long, too_long, 0)]
    if checkpoint == "mlm":  # a byte-level BPE keeps every character
        cases.append((empty, "empty.jsonl:2: field 'sentence_bad' has no token to score", 1))
    for bad, message, code in cases:
        path = tmp_path / ("long.jsonl" if bad is long else "empty.jsonl")
        path.write_text(json.dumps(pair) + "\n" + json.dumps(bad) + "\n")
        out = tmp_path / f"out-{path.stem}"
        result = CliRunner().invoke(main, ["eval", f"checkpoint={runs / checkpoint}", f"out_dir={out}", "eval.tasks=[]",
                                           "eval.lm_eval=false", "impl.progress=false", "trust_remote_code=true",
                                           f"eval.minimal_pairs.paths=[{path}]"])
        assert result.exit_code == code and "Traceback" not in result.output, result.output
        if code:
            assert re.search(f"^Error: .*{message}", result.output, re.M), result.output
            assert not (out / "eval.json").exists()
        else:
            assert re.search(f"^minimal pairs skipped: .*{message}", result.output, re.M), result.output
            assert re.search(message, json.loads(next(out.glob("eval*.json")).read_text())["minimal_pairs"]["skipped"])
            assert "minimal pairs not scored" in next(out.glob("eval*.md")).read_text()


def test_pll_variants_asked_of_a_causal_lm_are_said_not_to_apply(runs, tmp_path):
    result = CliRunner().invoke(main, ["eval", f"checkpoint={runs / 'gpt'}", f"out_dir={tmp_path}", "eval.tasks=[]",
                                       "eval.lm_eval=false", "impl.progress=false", PAIRS, "eval.minimal_pairs.pll=[original]"])
    assert result.exit_code == 0, result.output
    assert "eval.minimal_pairs.pll=['original'] does not apply to gpt: it has no masked-LM scorer (scored by log-probability)" \
        in result.output


def test_a_checkpoint_without_a_trained_lm_head_is_refused_not_scored(runs, tmp_path):
    transformers = pytest.importorskip("transformers")
    bare = tmp_path / "bert-encoder"  # an encoder alone (as sentence-transformers ship BERT): no MLM head
    transformers.AutoModel.from_pretrained(runs / "hf-bert").save_pretrained(bare)
    for f in (runs / "hf-bert").glob("*token*"):
        (bare / f.name).write_bytes(f.read_bytes())
    result = CliRunner().invoke(main, ["eval", f"checkpoint={bare}", f"out_dir={tmp_path / 'out'}", "eval.tasks=[]",
                                       "impl.progress=false", PAIRS])
    assert result.exit_code == 0, result.output
    assert "minimal pairs skipped" in result.output and "head is not in the checkpoint" in result.output
    got = json.loads((tmp_path / "out" / "eval.json").read_text())["minimal_pairs"]
    assert "random weights" in got["skipped"]
    assert f"minimal pairs not scored: {got['skipped']}" in (tmp_path / "out" / "eval.md").read_text()  # eval.md said nothing
    assert f"minimal pairs not scored: {got['skipped']}" in result.output  # in the closing tables, beside "skipped" when met


def test_the_pipelines_closing_table_shows_the_pairs_beside_the_twin(tmp_path):
    from cramlm.pipeline.recipe import resolve_recipe, results_summary

    cfg = resolve_recipe("default", [f"base_dir={tmp_path}", "name=x"])
    cfg.run_dir.mkdir(parents=True)
    pairs = pairs_of({"a": 2})
    for stem, good in (("eval", [-1.0, -1.0]), ("eval-untrained", [-3.0, -1.0])):
        record = {"kind": "mlm", "headline": "pll-word-l2r", "scores": {"pll-word-l2r": accuracy(pairs, good, [-2.0, -2.0])}}
        (cfg.run_dir / f"{stem}.json").write_text(json.dumps({"results": [], "minimal_pairs": record}))
    text = results_summary(cfg)
    assert "untrained twin" in text and "macro average (paradigms)" in text
    line = next(x for x in text.splitlines() if x.startswith("macro average"))
    assert line.split()[-2:] == ["100.0", "50.0"]


def test_ahead_of_needs_two_standard_errors_and_two_points():
    from cramlm.eval.pairs import ahead_of

    assert ahead_of(0.60, 300, 0.50, 300) == 1 and ahead_of(0.40, 300, 0.50, 300) == -1  # 10 points, 2 SE ~8
    assert ahead_of(0.56, 300, 0.50, 300) == 0  # 6 points, within two standard errors
    assert ahead_of(0.515, 10 ** 6, 0.50, 10 ** 6) == 0  # beyond the noise of a million pairs, but under 2 points
    assert ahead_of(0.53, 10 ** 6, 0.50, 10 ** 6) == 1


def test_sentences_are_scored_without_tf32_and_the_setting_comes_back():
    """TF32 (impl.tf32, on for training on CUDA) would move a score by more than a tie's 1e-4 nats."""
    from cramlm.eval.pair_models import exact_fp32

    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        with pytest.raises(KeyboardInterrupt), exact_fp32():
            assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
            raise KeyboardInterrupt  # a stop while scoring
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
