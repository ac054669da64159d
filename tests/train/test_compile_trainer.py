"""A compiled training run compiles a bounded number of graphs. The masked-token count changes every
microbatch; code that specialises on it recompiles each microbatch until torch's recompile_limit
(minutes a step on a GPU). On a CPU, compile=auto never compiles, so
this forces compile=true with dynamo's counting backend (aot_eager: the graphs inductor would get,
without its minutes of C++ code generation)."""

from __future__ import annotations

import torch
from torch._dynamo.backends.debugging import aot_eager

from cramlm.train import parallelize

from .helpers import run_inprocess


def test_a_compiled_run_does_not_recompile_per_microbatch(tmp_path, monkeypatch, fresh_dynamo):
    graphs = []

    def counting(gm, example_inputs, **kwargs):
        graphs.append(len(gm.graph.nodes))
        return aot_eager(gm, example_inputs, **kwargs)

    compile_ = torch.compile
    monkeypatch.setattr(parallelize.torch, "compile", lambda model, **kw: compile_(model, backend=counting))
    # 8 steps x 2 microbatches of 8 sequences: 16 masked-token counts, nearly all different; a storm
    # shows in full, not capped at the default limit of 8 (config.patch: monkeypatch's undo deletes the
    # config module's attribute, which breaks every later flex_attention call)
    with torch._dynamo.config.patch(recompile_limit=64):
        summary = run_inprocess(tmp_path, "compiled", "impl.compile=true", "budget=null", "train.budget.steps=8",
                                "train.batch_size=16", "train.batch_ramp=0", "train.validate_every=0")
    assert summary["steps"] == 8
    # the forward before and after the sparse head's graph break, each once static and once dynamic,
    # and the final validation's: a handful, not one per microbatch
    assert 0 < len(graphs) <= 8, f"{len(graphs)} graphs compiled in 16 microbatches: {graphs}"
