"""``impl.compile=auto`` (the default) compiles on one CUDA GPU only (tests/gpu/test_compile.py
checks that side, and tests/gpu/nccl_driver.py that a DDP-wrapped model is left alone): never a
CPU model."""

import torch

from cramlm.train.impl import ImplConfig
from cramlm.train.parallelize import compile_model


def test_compile_auto_leaves_cpu_models_alone():
    model = torch.nn.Linear(4, 4)
    assert ImplConfig().compile == "auto"
    assert compile_model(model, ImplConfig()) is model
    assert compile_model(model, ImplConfig(compile=True))._orig_mod is model  # asked for: compiled anyway

