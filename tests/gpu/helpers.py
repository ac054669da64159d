"""Shared by the CUDA tests."""

from __future__ import annotations

import torch

# tests/models/helpers' tiny widths with a head dim of 16 (FlexAttention's minimum on torch 2.5)
WIDE = dict(hidden_size=64, num_heads=4, intermediate_size=128)


def run_overrides(device: torch.device, *extra: str) -> list[str]:
    """`cramlm pretrain` overrides for a tiny run on ``device`` (tests/train/helpers.TINY sets the
    rest): compile off unless a test is about it (inductor takes seconds per model), TF32 off so
    that fp32 results compare exactly."""
    return [f"impl.device={device.type}", "impl.compile=false", "impl.tf32=false", "arch.hidden_size=64",
            "arch.num_heads=4", "arch.intermediate_size=128", *extra]


def subprocess_env(**extra: str) -> dict:
    """tests/train's environment for a child process, with this checkout's src/ first and the
    parent's PYTHONPATH kept (on the GPU machine cramlm is not installed: gpu_check.sh puts src/
    and the carried wheels on PYTHONPATH)."""
    import os

    from tests.train.helpers import REPO, env

    paths = [str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")]
    return dict(env(), PYTHONPATH=os.pathsep.join(p for p in paths if p), **extra)
