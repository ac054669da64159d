"""torch.compile with inductor (Triton kernels on the GPU) gives eager's loss and gradients for
every model family, packed documents (FlexAttention inside the compiled graph, and the dense mask) included; and
``impl.compile=auto`` compiles a model on the GPU (tests/train/test_compile_auto.py: not on a CPU)."""

from __future__ import annotations

import pytest
import torch

from cramlm.train.impl import ImplConfig
from cramlm.train.parallelize import compile_model
from tests.gpu.helpers import WIDE
from tests.models.helpers import random_ids, tiny_model

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("name", ["crammed-bert-tiny", "gpt2-tiny", "llama-tiny"])  # one per registered type
def test_inductor_matches_eager(name, cuda, fresh_dynamo):
    model = tiny_model(name, **WIDE).train().to(cuda)
    ids = random_ids(4, 64).to(cuda)
    labels = ids.clone()
    if model.cfg.objective == "mlm":
        labels[:, 1::3] = -100
    docs = torch.tensor([[0] * 20 + [1] * 44] * 2 + [[0] * 64] * 2, device=cuda)
    compiled = torch.compile(model)  # inductor, the trainer's default
    # plain (SDPA flash), packed through FlexAttention (auto takes it past 128 tokens; forced at 64) and packed through the dense mask
    for kernel, inputs in (("auto", {}), ("flex", {"document_ids": docs}), ("dense", {"document_ids": docs})):
        model.trunk.document_kernel = kernel
        model.zero_grad(set_to_none=True)
        loss = compiled(ids, labels=labels, **inputs)["loss"]
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        reference = model(ids, labels=labels, **inputs)["loss"]
        reference.backward()
        torch.testing.assert_close(loss, reference, rtol=1e-5, atol=1e-5)
        for n, p in model.named_parameters():
            if p.grad is not None:
                torch.testing.assert_close(grads[n], p.grad, rtol=1e-3, atol=1e-5, msg=n)


def test_compile_auto_compiles_a_model_on_the_gpu(cuda):
    model = torch.nn.Linear(4, 4).to(cuda)
    compiled = compile_model(model, ImplConfig())  # compile defaults to auto
    assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule) and compiled._orig_mod is model
