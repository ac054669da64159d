"""Exported checkpoints fine-tune with Hugging Face's own tools (issue 22.1): every export, stock
class or remote code, loads in AutoModelForSequenceClassification (encoders also in
AutoModelForTokenClassification), serves pipeline("text-classification") and, for masked LMs,
pipeline("fill-mask"); HF's Trainer fine-tunes one and the fine-tuned folder reloads."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer

from cramlm.data.tokenizer import TokenizerConfig, train_tokenizer
from cramlm.models.hf import export_hf, stock_architecture
from tests.models.helpers import VOCAB, tiny_model
from tests.models.test_hf_export import moby_dick

transformers = pytest.importorskip("transformers")

EXPORTS = [  # (preset, overrides, class the export is written as)
    ("crammed-bert-tiny", {}, "CramlmForMaskedLM"),  # cramming's own layers: remote code
    ("gpt2-tiny", {"norm": "rmsnorm"}, "CramlmForCausalLM"),  # a GPT no stock class matches: remote code
    ("bert-original-tiny", {}, "BertForMaskedLM"),
    ("crammed-bert-modern", {}, "ModernBertForMaskedLM"),
    ("gpt2-tiny", {}, "GPT2LMHeadModel"),
    ("llama-tiny", {}, "LlamaForCausalLM"),
]
IDS = [f"{name}{'+' + ','.join(ov) if ov else ''}" for name, ov, _ in EXPORTS]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_tokenizer(TokenizerConfig(vocab_size=VOCAB, min_frequency=1), moby_dick())


def export(name: str, overrides: dict, tokenizer: Tokenizer, folder) -> tuple[str, torch.nn.Module]:
    model = tiny_model(name, **overrides)
    return export_hf(model, tokenizer, folder), model


@pytest.mark.parametrize("name,overrides,cls", EXPORTS, ids=IDS)
def test_every_export_loads_in_the_fine_tuning_classes_and_pipelines(name, overrides, cls, tokenizer, tmp_path):
    assert export(name, overrides, tokenizer, tmp_path)[0] == cls
    remote = cls.startswith("Cramlm")
    lm_auto = transformers.AutoModelForCausalLM if cls.endswith(("CausalLM", "LMHeadModel")) else transformers.AutoModelForMaskedLM
    lm = lm_auto.from_pretrained(tmp_path, trust_remote_code=True)
    seq = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path, trust_remote_code=True, num_labels=3)
    assert type(seq).__name__.endswith("ForSequenceClassification")
    # the pretrained trunk is loaded, not initialised afresh (only the head is new)
    torch.testing.assert_close(seq.get_input_embeddings().weight, lm.get_input_embeddings().weight)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path, trust_remote_code=True)
    batch = tok(["call me ishmael", "the whale, the white whale"], padding=True, return_tensors="pt")
    assert seq(**batch).logits.shape == (2, 3)

    classify = transformers.pipeline("text-classification", model=str(tmp_path), trust_remote_code=True)
    out = classify(["call me ishmael", "the whale"])
    assert [set(o) for o in out] == [{"label", "score"}] * 2 and all(o["label"].startswith("LABEL_") for o in out)

    if lm_auto is transformers.AutoModelForMaskedLM:  # encoders: a label per token, and mask filling
        tagger = transformers.AutoModelForTokenClassification.from_pretrained(tmp_path, trust_remote_code=True, num_labels=5)
        assert tagger(**batch).logits.shape == (*batch["input_ids"].shape, 5)
        fill = transformers.pipeline("fill-mask", model=str(tmp_path), trust_remote_code=True)
        guesses = fill(f"call me {fill.tokenizer.mask_token} .", top_k=3)
        assert len(guesses) == 3 and all(g["sequence"].startswith("call me") for g in guesses)
        # the pipeline's scores are the exported MLM head's: the most likely token under our model
        ids = tok(f"call me {tok.mask_token} .", return_tensors="pt")["input_ids"]
        at = (ids[0] == tok.mask_token_id).nonzero().item()
        with torch.no_grad():
            assert guesses[0]["token"] == lm(input_ids=ids).logits[0, at].argmax().item()


def test_remote_code_sequence_head_is_cramlm_eval_head(tokenizer, tmp_path):
    """first token (a masked LM's default; `classifier_pooling` picks another) -> dense of the
    architecture's pooler_size -> tanh -> dropout -> linear: heads.py's SequenceClassifier."""
    from cramlm.models.heads import SequenceClassifier

    _, model = export("crammed-bert-tiny", {"pooler_size": 48}, tokenizer, tmp_path)
    assert stock_architecture(model.cfg) is None
    for pooling in ("first", "mean"):
        hf = transformers.AutoModelForSequenceClassification.from_pretrained(
            tmp_path, trust_remote_code=True, num_labels=2, classifier_pooling=pooling).eval()
        assert hf.pooler.weight.shape == (48, model.cfg.hidden_size)
        ours = SequenceClassifier(model, num_labels=2, pooling=pooling).eval()
        ours.pooler.load_state_dict(hf.pooler.state_dict())
        ours.classifier.load_state_dict(hf.classifier.state_dict())
        ids = torch.tensor([[2, 40, 41, 42, 3, 0], [2, 50, 51, 3, 0, 0]])
        mask = (ids != 0).long()
        with torch.no_grad():
            torch.testing.assert_close(hf(input_ids=ids, attention_mask=mask).logits,
                                       ours(ids, mask)["logits"], rtol=1e-4, atol=1e-5)


class Examples(torch.utils.data.Dataset):
    """A handful of labelled sentences, tokenised by the export's own tokenizer."""

    def __init__(self, tok, texts: list[str], labels: list[int]):
        self.rows = [dict(tok(t, truncation=True, max_length=32), labels=y) for t, y in zip(texts, labels)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.rows[i]


@pytest.mark.parametrize("name", ["crammed-bert-tiny"])  # remote code (a stock-class export is a stock HF model)
def test_trainer_fine_tunes_an_export_and_the_result_reloads(name, tokenizer, tmp_path):
    pytest.importorskip("accelerate")  # transformers' Trainer needs it (the `hf` extra)
    export(name, {}, tokenizer, tmp_path / "export")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "export", trust_remote_code=True)
    texts = moby_dick(16)
    labels = [i % 2 for i in range(len(texts))]  # arbitrary: learnable only by fitting these examples
    data = Examples(tok, texts, labels)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "export", trust_remote_code=True, num_labels=2)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "trainer"), max_steps=40, learning_rate=3e-3, lr_scheduler_type="constant", per_device_train_batch_size=8,
        per_device_eval_batch_size=16, warmup_steps=0, weight_decay=0.0, logging_steps=5, save_strategy="no",
        report_to=[], use_cpu=True, seed=0, data_seed=0, dataloader_num_workers=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, eval_dataset=data,
                                   data_collator=transformers.DataCollatorWithPadding(tok), processing_class=tok)
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    assert after < 0.7 * before, (before, after)

    trainer.save_model(str(tmp_path / "tuned"))
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "tuned", trust_remote_code=True)
    batch = transformers.DataCollatorWithPadding(tok)([data[i] for i in range(4)])
    batch.pop("labels")
    model.eval()
    reloaded.eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).logits, model(**batch).logits)
    classify = transformers.pipeline("text-classification", model=str(tmp_path / "tuned"), trust_remote_code=True)
    assert classify(["call me ishmael"])[0]["label"] in {"LABEL_0", "LABEL_1"}


def test_causal_remote_code_head_pools_the_last_real_token(tokenizer, tmp_path):
    """A causal export's sequence head reads the last non-padding token (the one that has seen the
    whole input), so right padding does not change a row's logits."""
    export("gpt2-tiny", {"norm": "rmsnorm"}, tokenizer, tmp_path)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path, trust_remote_code=True, num_labels=2).eval()
    assert hf.config.classifier_pooling == "last"
    ids = torch.tensor([[40, 41, 42, 43, 44]])
    padded = torch.tensor([[40, 41, 42, 43, 44, 5, 5]])
    with torch.no_grad():
        alone = hf(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        in_batch = hf(input_ids=padded, attention_mask=torch.tensor([[1, 1, 1, 1, 1, 0, 0]])).logits
        first = hf(input_ids=ids[:, :1], attention_mask=torch.ones(1, 1, dtype=torch.long)).logits
    torch.testing.assert_close(in_batch, alone, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(alone, first)  # not the first token's
