"""Checkpoint and resume on the GPU: a run resumed from a mid-run checkpoint continues with the
same losses and ends with the same weights, bitwise when every operation it runs has a
deterministic implementation (torch.use_deterministic_algorithms), which needs the CUDA RNG state
(dropout masks here) restored as well as the weights, the fused optimizer's state and the data
position."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.gpu.helpers import run_overrides, subprocess_env
from tests.train.helpers import REPO, losses, records

pytestmark = pytest.mark.cuda

DRIVER = Path(__file__).with_name("resume_driver.py")


def test_resume_on_the_device_continues_the_same_run(device, tmp_path):
    # fp32: where some kernel is not deterministic, the runs then differ only by fp32 rounding
    extra = run_overrides(device, "budget=null", "train.budget.steps=8", "train.checkpoint_every=1",
                          "train.keep_checkpoints=10", "arch.dropout=0.1", "train.optim.lr=3e-3", "impl.precision=fp32")
    e = subprocess_env(CUBLAS_WORKSPACE_CONFIG=":4096:8")  # cuBLAS's deterministic workspace (CUDA docs)
    proc = subprocess.run([sys.executable, str(DRIVER), str(tmp_path), *extra], env=e, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]
    nondeterministic = json.loads(proc.stdout.strip().splitlines()[-1])["nondeterministic"]
    ref, resumed = losses(tmp_path / "ref"), losses(tmp_path / "resumed")
    assert sorted(ref) == list(range(1, 9)) and sorted(resumed) == list(range(5, 9))
    assert records(tmp_path / "resumed", "event")[0]["event"] == "resumed"
    a, b = load_file(str(tmp_path / "ref" / "model.safetensors")), load_file(str(tmp_path / "resumed" / "model.safetensors"))
    assert a.keys() == b.keys()
    if not nondeterministic:
        assert {s: ref[s] for s in resumed} == resumed
        for k in a:
            assert torch.equal(a[k], b[k]), k
    else:  # some kernel has no deterministic version: the same run up to its rounding
        print("not bitwise: " + "; ".join(nondeterministic))
        for s in resumed:
            assert abs(resumed[s] - ref[s]) < 1e-4
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-3, atol=1e-5, msg=k)
    # without the CUDA generator's state the resumed steps would draw step 1's dropout masks again
    # and the losses above would differ by far more than rounding
    training = torch.load(tmp_path / "ref" / "checkpoints" / "step-00000004" / "training.pt", weights_only=True)
    if device.type == "cuda":
        # this process's own device's generator alone (a node with fewer devices resumes it too)
        assert "cuda_rng" not in training
        assert training["cuda_rng_device"].dtype == torch.uint8 and training["cuda_rng_device"].numel() > 0
