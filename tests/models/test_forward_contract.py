"""One forward contract for every pretraining model (issue 15 item 5): the MLM and causal models
take the same arguments in the same order and return the same keys, whatever sparse_prediction."""

from __future__ import annotations

import inspect

import pytest
import torch

from cramlm.models.crammed_bert import CrammedBert
from cramlm.models.gpt import CausalLM
from tests.models.helpers import random_ids, tiny_model

ARGUMENTS = ["self", "input_ids", "attention_mask", "labels", "position_ids", "document_ids", "token_type_ids"]


def test_mlm_and_causal_models_take_the_same_arguments_in_the_same_order():
    for cls in (CrammedBert, CausalLM):
        assert list(inspect.signature(cls.forward).parameters) == ARGUMENTS, cls.__name__
    for cls in (CrammedBert, CausalLM):
        assert list(inspect.signature(cls.encode).parameters) == [a for a in ARGUMENTS if a != "labels"], cls.__name__


@pytest.mark.parametrize("name,overrides", [
    ("crammed-bert-tiny", {"sparse_prediction": True}),
    ("crammed-bert-tiny", {"sparse_prediction": False}),
    ("gpt2-tiny", {}),
    ("llama-tiny", {}),
])
def test_the_returned_keys_are_always_loss_and_logits(name, overrides):
    model = tiny_model(name, **overrides).eval()
    ids = random_ids(2, 12)
    labels = ids.clone()
    labels[:, ::2] = -100
    mask = torch.ones_like(ids)
    with torch.no_grad():
        plain = model(ids, mask)  # positional order: input_ids, attention_mask
        scored = model(ids, mask, labels)  # ... then labels
    assert set(plain) == set(scored) == {"loss", "logits"}
    assert plain["loss"] is None and plain["logits"].shape == (2, 12, model.vocab_size)
    assert scored["loss"].ndim == 0 and torch.isfinite(scored["loss"])
    if overrides.get("sparse_prediction") or name.startswith(("gpt2", "llama")):
        # the head ran only on scored positions, fused with the loss: no (B, T, V) logits
        assert scored["logits"] is None
    else:
        torch.testing.assert_close(scored["logits"], plain["logits"])
