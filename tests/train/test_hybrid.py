"""train.objective=hybrid (GPT-BERT: masked next-token prediction mixed with causal LM sequences)
end to end: its batches, it learns in both modes, resumes bit for bit, saves the arch as the run's
model, evaluates (held-out loss, minimal pairs in both modes, fine-tuning) and exports as a masked
and a causal LM over the same weights."""

import json
import shutil
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from cramlm.cli.common import resolve_or_exit
from cramlm.constants import IGNORE_INDEX
from cramlm.models.crammed_bert import CrammedBert
from cramlm.models.objectives.base import masked_collator
from cramlm.models.objectives.hybrid import GPTBERT, HybridCollator
from cramlm.run.build import load_run
from cramlm.train.config import TrainConfig

from .helpers import REPO, evaluate_tiny, free_port, losses, overrides, records, run, run_inprocess
from .test_objective_plugin import PAIRS, final_state

HYBRID = ["train.objective=hybrid", "budget=null", "train.hybrid.causal_fraction=0.25"]
STEPS = [*HYBRID, "train.budget.steps=4", "train.checkpoint_every=2", "train.keep_checkpoints=5"]


def collator(fraction: float = 0.25) -> HybridCollator:
    return HybridCollator(masked_collator(TrainConfig(), 512, 0), fraction, 0)


def test_a_sequences_mode_and_masks_are_keyed_by_its_stream_position():
    blocks = torch.randint(5, 512, (64, 16))
    blocks[:, 0] = 2  # [CLS]
    whole = collator()(blocks, np.arange(64))
    part = collator()(blocks[40:48], np.arange(40, 48))  # another batch, another process: the same rows
    assert all(torch.equal(whole[k][40:48], part[k]) for k in ("input_ids", "labels", "causal"))
    causal = whole["causal"]
    assert 8 <= int(causal.sum()) <= 24  # about a quarter
    assert torch.equal(whole["input_ids"][causal], blocks[causal]) and torch.equal(whole["labels"][causal], blocks[causal])
    masked = whole["labels"][~causal]
    assert ((masked != IGNORE_INDEX).float().mean() - 0.25).abs() < 0.08  # train.mlm_probability
    assert not collator(0.0)(blocks, np.arange(64))["causal"].any()


def test_hybrid_learns_in_both_modes_and_saves_the_arch(tmp_path):
    summary = run_inprocess(tmp_path, "hy", *HYBRID, "train.budget.steps=30", "train.optim.lr=3e-3", "train.validate_every=0.5")
    mlm = run_inprocess(tmp_path, "mlm", "budget=null", "train.budget.steps=1")
    got = losses(tmp_path / "hy")
    assert sum(got[s] for s in (28, 29, 30)) < sum(got[s] for s in (1, 2, 3)) - 0.3, got
    lines = records(tmp_path / "hy")  # the two modes' shares of the loss, logged beside it
    assert all(r["loss"] == pytest.approx(r["masked_loss"] + r["causal_loss"], abs=1e-4) for r in lines)
    assert sum(r["causal_loss"] > 0 for r in lines) >= 15 and sum(r["causal_loss"] == 0 for r in lines) >= 1
    val = [r["val_loss"] for r in records(tmp_path / "hy", "val")]
    assert len(val) >= 2 and val[-1] < val[0]  # masked next-token loss on the held-out masks
    assert summary["objective"] == "hybrid" and summary["flops_source"] == "model.flops_per_token"
    assert summary["flops_per_token"] > mlm["flops_per_token"]  # the causal rows' head at every position
    model, _, cfg = load_run(tmp_path / "hy")  # the run's model is the arch, under its own names
    assert type(model) is CrammedBert and cfg.train.hybrid.causal_fraction == 0.25
    saved, trained = load_file(str(tmp_path / "hy" / "model.safetensors")), final_state(tmp_path / "hy")
    assert saved.keys() == trained.keys() and all(torch.equal(saved[k], trained[k]) for k in saved)


def test_hybrid_resumes_bitwise(tmp_path):
    run_inprocess(tmp_path, "ref", *STEPS)
    shutil.copytree(tmp_path / "ref" / "checkpoints" / "step-00000002", tmp_path / "resumed" / "checkpoints" / "step-00000002")
    assert run_inprocess(tmp_path, "resumed", *STEPS, "resume=auto")["steps"] == 4
    a, b = final_state(tmp_path / "ref"), final_state(tmp_path / "resumed")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert losses(tmp_path / "resumed") == {s: v for s, v in losses(tmp_path / "ref").items() if s > 2}
    assert [r["causal_loss"] for r in records(tmp_path / "resumed")] == [r["causal_loss"] for r in records(tmp_path / "ref")[2:]]


def test_hybrid_evaluates_fine_tuning_heldout_and_minimal_pairs_in_both_modes(tmp_path, monkeypatch):
    run_inprocess(tmp_path, "hy", *HYBRID, "train.budget.steps=3")
    got = evaluate_tiny(tmp_path / "hy", PAIRS, monkeypatch)
    assert got["heldout"]["objective"] == "hybrid" and "next-token" in got["heldout"]["scored_by"]
    pairs = got["minimal_pairs"]
    assert pairs["headline"] == "log-probability" and pairs["kind"] == "clm" and "pll-word-l2r" in pairs["scores"]
    assert all(record["pairs"] == 8 for record in pairs["scores"].values())
    assert [r["task"] for r in got["results"]] == ["whales"]


def test_with_document_attention_a_documents_first_token_is_not_predicted_from_the_last_document(tmp_path):
    """Masked next-token prediction scores token t + 1 at position t: at a document's first token that
    position is the previous document's (no context in its own, under document attention): not scored
    in masked rows (causal rows predict across the separator, as a causal LM does)."""
    run_inprocess(tmp_path, "hy", *HYBRID, "train.budget.steps=1", "arch.init_std=0.5")
    from cramlm.eval.checkpoints import load_checkpoint

    model = load_checkpoint(str(tmp_path / "hy"), tmp_path).lm.model.eval()
    torch.manual_seed(0)
    ids = torch.randint(5, 512, (1, 16))
    docs = torch.tensor([[0] * 8 + [1] * 8])
    both, inner = torch.full_like(ids, IGNORE_INDEX), torch.full_like(ids, IGNORE_INDEX)
    both[0, [8, 11]] = ids[0, [8, 11]]  # the second document's first token and one inside it
    inner[0, 11] = ids[0, 11]
    with torch.no_grad():
        a = model(ids, labels=both, document_ids=docs)["loss"]
        b = model(ids, labels=inner, document_ids=docs)["loss"]
        c = model(ids, labels=both)["loss"]  # without document attention both are scored
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_the_scorers_read_the_token_from_the_position_before_it(tmp_path):
    run_inprocess(tmp_path, "hy", *HYBRID, "train.budget.steps=2", "arch.init_std=0.5")
    from cramlm.eval.checkpoints import load_checkpoint

    model = load_checkpoint(str(tmp_path / "hy"), tmp_path).lm.model.eval()
    assert isinstance(model, GPTBERT)
    from cramlm.models.objectives.base import build_objective

    causal, pll = build_objective(load_run(tmp_path / "hy")[2]).scorers(model)
    ids = torch.randint(5, 512, (2, 10))
    with torch.no_grad():
        full = model.head(model.encode(ids))  # (B, T, V) bidirectional, at t token t + 1's
        assert torch.allclose(pll.fn(ids, None, torch.tensor([3, 7])), full[[0, 1], [2, 6]], atol=1e-4)
        assert torch.allclose(causal.fn(ids[:, :5], None), model.causal_logits(ids)[:, :5], atol=1e-4)  # no look-ahead
        rows = model.encode(ids, causal=torch.tensor([True, False]))  # training's one forward: each row its mode
        assert torch.allclose(rows[0], model.encode(ids, causal=True)[0], atol=1e-5)
        assert torch.allclose(rows[1], model.encode(ids)[1], atol=1e-5)


def test_hybrid_exports_a_masked_and_a_causal_lm_over_the_same_weights(tmp_path):
    transformers = pytest.importorskip("transformers")
    from cramlm.cli.export import export_run

    run_inprocess(tmp_path, "hy", *HYBRID, "train.budget.steps=2", "arch.init_std=0.5")
    export_run(str(tmp_path / "hy"), str(tmp_path / "hf"))
    from cramlm.eval.checkpoints import load_checkpoint

    model = load_checkpoint(str(tmp_path / "hy"), tmp_path).lm.model.eval()
    masked = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    causal = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    assert type(masked).__name__ == "CramlmHybridForMaskedLM" and type(causal).__name__ == "CramlmHybridForCausalLM"
    ids = torch.randint(5, 512, (2, 12))
    with torch.no_grad():
        ours = model.head(model.encode(ids))
        assert torch.allclose(masked(input_ids=ids).logits[:, 1:], ours[:, :-1], atol=1e-4)  # at i, token i's
        assert torch.allclose(causal(input_ids=ids).logits, model.causal_logits(ids), atol=1e-4)
        # and it generates, greedy as the run's causal mode (GPT-BERT as a generator)
        out = causal.generate(input_ids=ids[:, :5], attention_mask=torch.ones_like(ids[:, :5]), max_new_tokens=3, do_sample=False)
        greedy = ids[:, :5]
        for _ in range(3):
            greedy = torch.cat([greedy, model.causal_logits(greedy)[:, -1].argmax(-1, keepdim=True)], dim=1)
        assert torch.equal(out, greedy)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["objective"] == "hybrid"
    from cramlm.eval.pair_models import pair_models  # zero-shot: the export scored as its run is, both modes
    from cramlm.eval.sentence_scores import score_sentences

    texts = ["the whale swam far", "far the swam whale", "a ship sailed"]

    def scores(ckpt):
        return {pm.name: score_sentences(pm.kind, pm.fn, pm.encode(texts), pm.pad_id, pm.mask_id, ["original"], 64,
                                         pm.full_logits_vocab)
                for pm in pair_models(ckpt, "cpu")}

    run_ckpt, export_ckpt = load_checkpoint(str(tmp_path / "hy"), tmp_path), load_checkpoint(str(tmp_path / "hf"), tmp_path, trust_remote_code=True)
    assert export_ckpt.max_length == run_ckpt.max_length
    from types import SimpleNamespace

    from cramlm.eval.checkpoints import positions_of  # a remote-code config's own length (was: 512 for any)
    assert positions_of(transformers.AutoConfig.from_pretrained(tmp_path / "hf", trust_remote_code=True)) == run_ckpt.max_length
    assert positions_of(SimpleNamespace(cramlm={"max_seq_length": 2048})) == 2048 and positions_of(SimpleNamespace()) == 512
    run, export = scores(run_ckpt), scores(export_ckpt)
    assert list(run) == list(export) == ["log-probability", "pll"]
    for name in run:
        for method in run[name]:
            np.testing.assert_allclose(export[name][method], run[name][method], atol=1e-4)


def test_hybrid_needs_a_crammed_bert_encoder(tmp_path):
    import click

    from .helpers import CAUSAL

    with pytest.raises(click.ClickException, match=r"train.objective=hybrid .* needs a masked LM; .* is causal "
                       r"\(its objectives: train.objective=clm\)"):  # what would fit: `cramlm run default arch=gpt2-tiny`
        resolve_or_exit("pretrain", overrides(tmp_path, "x", *CAUSAL, "train.objective=hybrid"))
    masked = ["plugins=[tests.train.plugin_models]", "arch.type=tiny-masked"]  # a masked LM, not crammed-bert
    for objective in ("hybrid", "rtd"):  # refused when the config is read, not when the model is built
        with pytest.raises(click.ClickException, match=rf"train.objective={objective} .* needs arch.type=crammed-bert; "
                           r"arch.type=tiny-masked is not \(its objectives: [^)]*train.objective=mlm") as e:
            resolve_or_exit("pretrain", overrides(tmp_path, "x", *masked, f"train.objective={objective}"))
        assert "objective=rtd" not in e.value.message.split("its objectives")[1]  # only what would train it
        assert "objective=hybrid" not in e.value.message.split("its objectives")[1]
    resolve_or_exit("pretrain", overrides(tmp_path, "x", *masked))  # its own: MLM
    with pytest.raises(click.ClickException, match="train.hybrid is set but train.objective=mlm"):
        resolve_or_exit("pretrain", overrides(tmp_path, "x", "train.hybrid.causal_fraction=0.5"))
    with pytest.raises(click.ClickException, match="train.rtd is set but train.objective=mlm"):  # not silently ignored
        resolve_or_exit("pretrain", overrides(tmp_path, "x", "train.rtd.generator_size=0.5"))
    resolve_or_exit("pretrain", overrides(tmp_path, "x", "train.objective=rtd", "train.rtd.generator_size=0.5"))


def test_hybrid_under_ddp_and_fsdp_matches_one_process(tmp_path):
    """Every process runs one trunk forward a microbatch whatever its rows' modes (FSDP's collectives agree)."""
    setup = [*HYBRID, "train.budget.steps=3", "impl.microbatch_size=2", "train.validate_every=0"]
    run_inprocess(tmp_path, "one", *setup)
    runs = [overrides(tmp_path, name, *setup, f"impl.distributed={name}") for name in ("ddp", "fsdp")]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           str(REPO / "tests" / "train" / "dist_driver.py"), json.dumps(runs)]
    run(cmd, timeout=300)
    reference = records(tmp_path / "one")
    assert {r["causal_loss"] > 0 for r in reference} == {True, False}  # microbatches with and without causal rows
    for name in ("ddp", "fsdp"):
        got = records(tmp_path / name)
        assert [r["step"] for r in got] == [1, 2, 3], name
        for mine, theirs in zip(reference, got):
            assert all(abs(mine[k] - theirs[k]) < 1e-4 for k in ("loss", "masked_loss", "causal_loss")), (name, mine, theirs)
