"""Every model family runs under torch.compile. The aot_eager backend traces the graph (dynamo)
and the joint forward/backward (AOTAutograd) exactly as inductor does, without inductor's C++
code generation, which takes minutes on 2 CPU cores (that step is checked by benchmarks/model_step.py
--compile)."""

from __future__ import annotations

import pytest
import torch

from tests.models.helpers import random_ids, tiny_model


@pytest.mark.parametrize("name", ["crammed-bert-tiny", "gpt2-tiny", "llama-tiny"])  # one per registered type
def test_model_compiles_and_matches_eager(name):
    torch._dynamo.reset()
    model = tiny_model(name).train()
    ids = random_ids()
    labels = ids.clone()
    if model.cfg.objective == "mlm":
        labels[:, 1::3] = -100
    docs = torch.tensor([[0] * 6 + [1] * 10, [0] * 16])
    compiled = torch.compile(model, backend="aot_eager")
    loss = compiled(ids, labels=labels, document_ids=docs)["loss"]
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    reference = model(ids, labels=labels, document_ids=docs)["loss"]
    reference.backward()
    torch.testing.assert_close(loss, reference)
    for n, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)
