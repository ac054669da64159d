"""The CUDA tests (``pytest -m cuda``; benchmarks/gpu_check.sh runs them first). They skip without
a GPU; ``CRAMLM_TEST_DEVICE=cpu`` runs the ones whose logic also holds on a CPU there (a smoke
test of the test code itself; the rest still skip).

The folder is tests/gpu, not tests/cuda: pytest imports test folders under their own name, and
`cuda` is the top-level package of NVIDIA's cuda-python (present on GPU machines)."""

from __future__ import annotations

import os

import pytest
import torch

DEVICE_ENV = "CRAMLM_TEST_DEVICE"


@pytest.fixture
def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if os.environ.get(DEVICE_ENV) == "cpu":
        return torch.device("cpu")
    pytest.skip("needs a CUDA GPU (CRAMLM_TEST_DEVICE=cpu runs the CPU-capable part here)")


@pytest.fixture
def cuda() -> torch.device:
    """Only on a GPU, also under CRAMLM_TEST_DEVICE=cpu (NCCL, inductor's GPU kernels...)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch.device("cuda")


@pytest.fixture(autouse=True)
def exact_fp32():
    """fp32 comparisons need true fp32 matmuls: cramlm turns TF32 on for its runs (impl.tf32), and
    that switch is process-global, so each test starts with it off and leaves it as it found it."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved

