"""The held-out loss (data/heldout.py, heldout-v1) depends only on the prepared data: the same
checkpoint gets the same number under any training preset, microbatch and process count; the
benchmark and `cramlm eval` agree; bits per byte put an MLM and a causal run on one axis while
their losses never share one (issues 21.3, 22.5, 24)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cramlm.cli import main
from cramlm.config.loader import resolve
from cramlm.data.cramtok import read_packed
from cramlm.data.tokenizer import MASK_ID, SPECIAL_TOKENS
from cramlm.eval.checkpoints import load_checkpoint
from cramlm.data.heldout import HELDOUT_MLM_PROBABILITY, heldout_mask, run_heldout_set
from cramlm.eval.lm import heldout_eval
from cramlm.run.config import PretrainConfig
from cramlm.run.pretrain import DEFAULTS
from cramlm.train.validation import heldout_sums
from tests.conftest import TINY_PRETRAIN

REPO = Path(__file__).resolve().parents[2]
GPT = ["arch=gpt2", "arch.hidden_size=32", "arch.num_layers=2", "arch.num_heads=2", "arch.max_seq_length=32"]


def _cli(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result


def _pretrain(name: str, *extra: str) -> Path:
    _cli("pretrain", f"name={name}", "dryrun=true", "impl.dryrun_steps=3", *TINY_PRETRAIN, *extra)
    return Path("outputs") / name


@pytest.fixture
def tiny_run(in_tmp) -> Path:
    return _pretrain("tiny")


def _lm(run: Path):
    lm = load_checkpoint(str(run), ".").lm
    return lm, read_packed(lm.val_path)


def test_same_checkpoint_same_heldout_loss_under_any_preset_and_microbatch(tiny_run):
    lm, val = _lm(tiny_run)
    losses, variants = [], []
    for preset, micro in (("bert-o4", 2), ("bert-o4", 8), ("bert-original", 2), ("bert-o4-cpu", 8)):
        other = resolve(PretrainConfig, DEFAULTS, [f"train={preset}", f"impl.microbatch_size={micro}"])
        cfg = lm.config.model_copy(update={"train": other.train, "impl": other.impl, "seed": micro})
        variants.append((other.train.mlm_probability, other.train.validate_sequences, cfg.impl.microbatch_size, cfg.seed))
        heldout = run_heldout_set(cfg, val, lm.vocab_size, lm.val_path)
        losses.append(heldout_eval(lm.model, heldout, batch_size=micro, progress=False)["loss"])
    assert len(set(variants)) == 4  # the presets differ in masking rate, validation size, microbatch and seed
    assert all(abs(x - losses[0]) < 1e-6 for x in losses), losses
    assert math.isfinite(losses[0])


def test_loss_is_token_weighted_and_process_shares_add_up_exactly(tiny_run):
    lm, val = _lm(tiny_run)
    heldout = run_heldout_set(lm.config, val, lm.vocab_size, lm.val_path)
    n = len(heldout)
    assert n >= 3
    model = lm.model.eval()
    with torch.inference_mode():
        # by hand: cross-entropy of every scored token, summed, over their number
        per_token = []
        for i in range(n):
            out = model(input_ids=heldout.input_ids[i : i + 1], labels=heldout.labels[i : i + 1])
            scored = int((heldout.labels[i] != -100).sum())
            per_token.append((float(out["loss"]) * scored if scored else 0.0, scored))
        expected = sum(a for a, _ in per_token) / sum(b for _, b in per_token)
        for world, batch in ((1, 1), (1, 8), (2, 2), (3, 1), (n + 2, 2)):  # n + 2: some score a batch that does not count
            shares = [heldout.batches(batch, world, rank) for rank in range(world)]
            assert len({len(s) for s in shares}) == 1  # every process runs the same number of forwards
            counted = sorted(i for s in shares for b, c in s if c for i in range(len(b["input_ids"])))
            assert len(counted) == n
            total = sum(heldout_sums(model, "mlm", share) for share in shares)
            assert float(total[0] / total[1]) == pytest.approx(expected, abs=1e-6), (world, batch)
    # a mean of per-batch means would weight the tokens unequally: the definitions differ here
    assert len({b for _, b in per_token}) > 1


def test_mask_is_keyed_by_block_and_position_only():
    rng = np.random.default_rng(0)
    ids = rng.integers(len(SPECIAL_TOKENS), 500, size=(64, 128))
    ids[:, 0] = 2  # [CLS]
    blocks = np.arange(100, 164)
    inputs, labels = heldout_mask(ids, blocks, 500)
    sub_inputs, sub_labels = heldout_mask(ids[[5, 40]], blocks[[5, 40]], 500)
    assert np.array_equal(sub_inputs, inputs[[5, 40]]) and np.array_equal(sub_labels, labels[[5, 40]])
    chosen = labels != -100
    assert not chosen[:, 0].any()  # special tokens are never scored
    assert chosen.mean() == pytest.approx(HELDOUT_MLM_PROBABILITY * 127 / 128, abs=0.01)
    assert (inputs[chosen] == MASK_ID).mean() == pytest.approx(0.8, abs=0.03)
    assert np.array_equal(labels[chosen], ids[chosen]) and np.array_equal(inputs[~chosen], ids[~chosen])
    other, _ = heldout_mask(ids, blocks + 1, 500)
    assert not np.array_equal(other, inputs)  # another block number, another mask


def test_benchmark_and_eval_stage_agree_and_bits_per_byte_follow_from_the_bytes(tiny_run):
    _cli("eval", f"checkpoint={tiny_run}", "eval.tasks=[]", "impl.progress=false")
    heldout = json.loads((tiny_run / "eval.json").read_text())["heldout"]
    spec = importlib.util.spec_from_file_location("val_mlm_loss", REPO / "benchmarks" / "val_mlm_loss.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    got = bench.val_loss(str(tiny_run))  # through cramlm.eval.lm.run_heldout
    assert got["loss"] == pytest.approx(heldout["loss"], abs=1e-6) and got["bpb"] == pytest.approx(heldout["bpb"], abs=1e-6)
    assert got["run"] == str(tiny_run) and got["val_mlm_loss"] == round(got["loss"], 4)
    assert heldout["definition"] == "heldout-v1" and heldout["tokenizer"].startswith("wordpiece, vocab 512")
    manifest = json.loads((Path(heldout["file"]).parent / "manifest.json").read_text())
    val = manifest["val"]
    assert val["bytes"] > val["tokens"] - val["copies_written"] > 0  # a WordPiece token covers more than a byte
    bpt = val["bytes"] / (val["tokens"] - val["copies_written"])
    assert heldout["bytes_per_token"] == pytest.approx(bpt)
    # MLM: every scored token is a text token, so bits per byte = loss / ln 2 / bytes per token
    assert heldout["bpb"] == pytest.approx(heldout["loss"] / math.log(2) / bpt, rel=1e-9)


def test_report_of_mlm_and_causal_run_shares_only_bits_per_byte(in_tmp, monkeypatch):
    from cramlm.report import plots, write_report
    from cramlm.report.rundata import load_run_data

    mlm = _pretrain("bert")
    gpt = _pretrain("gpt", *GPT)
    for run in (mlm, gpt):
        _cli("eval", f"checkpoint={run}", "eval.tasks=[]", "impl.progress=false")
    runs = [load_run_data(mlm), load_run_data(gpt)]
    assert [r.objective for r in runs] == ["mlm", "clm"]
    assert runs[0].tokenizer.startswith("wordpiece") and runs[1].tokenizer.startswith("byte-bpe")
    for r in runs:
        assert r.has("val_bpb") and 0 < r.heldout["bpb"] < 20

    figures = []
    save = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, path: figures.append((path.stem, fig)) or save(fig, path))
    path = write_report(mlm, gpt, out="compare")
    drawn = dict(figures)
    assert {"loss_vs_tokens", "loss_vs_time", "bpb"} <= set(drawn)
    for name in ("loss_vs_tokens", "loss_vs_time"):  # one panel per objective: the losses never share an axis
        axes = drawn[name].axes
        assert [ax.get_ylabel() for ax in axes] == ["MLM loss (nats per token)", "causal LM loss (nats per token)"]
        for ax in axes:
            owners = {line.get_label().split()[0] for line in ax.get_lines()}
            assert len(owners) == 1, owners
    (bpb_ax,) = drawn["bpb"].axes  # bits per byte: both runs on one axis, each labelled with its objective
    labels = [line.get_label() for line in bpb_ax.get_lines()]
    assert bpb_ax.get_ylabel() == "bits per byte of validation text"
    assert any(label.startswith("bert (MLM)") for label in labels) and any(label.startswith("gpt (causal LM)") for label in labels)

    html = path.read_text()
    data_row = next(row for row in html.split("<tr>") if row.startswith("<td>Data</td>"))
    assert "tokenizer wordpiece" in data_row and "tokenizer byte-bpe" in data_row
    assert "Held-out bits per byte, evaluation" in html and "differ in objective or tokenizer" in html
