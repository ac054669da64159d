"""Every model family runs under torch.compile. The aot_eager backend traces the graph (dynamo)
and the joint forward/backward (AOTAutograd) exactly as inductor does, without inductor's C++
code generation, which takes minutes on 2 CPU cores (that step is checked by benchmarks/model_step.py
--compile)."""

from __future__ import annotations

import pytest
import torch

from tests.models.helpers import random_ids, tiny_model


@pytest.mark.parametrize("name", ["crammed-bert-tiny", "gpt2-tiny", "llama-tiny"])  # one per registered type
def test_model_compiles_and_matches_eager(name, fresh_dynamo):
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


def _masked_batch(count: int, B: int = 2, T: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs with [MASK] = 4 at the first ``count`` positions, labels there): each count a new M."""
    ids = random_ids(B, T, seed=count)
    labels = torch.full_like(ids, -100)
    labels.view(-1)[:count] = ids.view(-1)[:count]
    inputs = ids.clone()
    inputs.view(-1)[:count] = 4
    return inputs, labels


@pytest.mark.parametrize("objective", ["mlm", "rtd"])
def test_a_new_number_of_masked_tokens_does_not_recompile(objective, fresh_dynamo):
    """The number of masked tokens (M, the rows of the sparse MLM head) changes every batch. A traced
    graph that specialises on it recompiles each batch until torch's recompile_limit (minutes a step
    on a GPU): after one recompilation M must be symbolic."""
    from torch._dynamo.testing import CompileCounter

    from cramlm.models.objectives.config import RTDConfig
    from cramlm.models.objectives.rtd import build_rtd

    # rtd as gpu-24h trains it: QK-norm and zero-initialised output projections too
    model = tiny_model("crammed-bert", **({"qk_norm": True, "zero_init_out": True} if objective == "rtd" else {})).train()
    if objective == "rtd":
        model = build_rtd(model, RTDConfig(generator_size=0.5), 5).train()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter)
    frames = []
    for count in (5, 9, 13, 17, 21, 26):
        inputs, labels = _masked_batch(count)
        extra = {"sample_noise": torch.rand(inputs.shape, generator=torch.Generator().manual_seed(count))} if objective == "rtd" else {}
        compiled(inputs, labels=labels, **extra)["loss"].backward()
        frames.append(counter.frame_count)
    assert frames[2] == frames[-1], f"frames compiled after each batch: {frames}"
