"""A one-process NCCL group, set up by cramlm's init_distributed exactly as under torchrun, and a
DDP and an FSDP2 run on it (the model left on the host, moved block by block as it is sharded)
that train like the same run without either; FSDP2's sharded checkpoints written from the device
and resumed on the group and on one GPU without it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.helpers import run_overrides, subprocess_env
from tests.train.helpers import REPO, free_port, losses, run_inprocess

pytestmark = pytest.mark.cuda

DRIVER = Path(__file__).with_name("nccl_driver.py")
SHARDED_DRIVER = Path(__file__).with_name("sharded_driver.py")


def test_one_process_nccl_group_and_ddp(cuda, tmp_path):
    extra = run_overrides(cuda, "budget=null", "train.budget.steps=4", "train.optim.lr=3e-3")
    single = run_inprocess(tmp_path, "single", *extra)
    e = subprocess_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    proc = subprocess.run([sys.executable, str(DRIVER), str(tmp_path), *extra], env=e, cwd=REPO,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-5000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["backend"] == "nccl" and seen["world"] == 1 and seen["rank"] == 0 and seen["owns_group"]
    assert seen["sum"] == [1.5, 2.0] and seen["max"] == [3.0]
    assert seen["compile_auto_wraps_ddp"] is False
    assert seen["summary_world_size"] == 1 and single["world_size"] == 1
    assert "x 1 processes (ddp)" in proc.stdout
    ddp, fsdp, plain = losses(tmp_path / "ddp"), losses(tmp_path / "fsdp"), losses(tmp_path / "single")
    assert sorted(ddp) == sorted(fsdp) == sorted(plain) == [1, 2, 3, 4] and seen["fsdp_world_size"] == 1
    assert all(abs(ddp[s] - plain[s]) < 1e-5 for s in plain), (ddp, plain)
    assert all(abs(fsdp[s] - plain[s]) < 1e-5 for s in plain), (fsdp, plain)  # moved to the GPU by fully_shard


def test_sharded_checkpoints_from_the_device_resume_on_the_group_and_without_it(device, tmp_path):
    """On a GPU: NCCL, shards written from device tensors. CRAMLM_TEST_DEVICE=cpu (gpu_check.sh --dry):
    the same driver and checks on gloo, so the test code has run before a GPU runs it."""
    extra = run_overrides(device, "budget=null", "train.budget.steps=4", "train.checkpoint_every=2",
                          "train.keep_checkpoints=5", "train.optim.lr=3e-3", "impl.precision=fp32")
    single = run_inprocess(tmp_path, "single", *extra)
    e = subprocess_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    proc = subprocess.run([sys.executable, str(SHARDED_DRIVER), str(tmp_path), *extra], env=e, cwd=REPO,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-5000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["backend"] == ("nccl" if device.type == "cuda" else "gloo")
    assert seen["files"] == [".metadata", "__0_0.distcp", "digests.json", "state.json", "training.pt"]
    run_inprocess(tmp_path, "to-one", *extra, "resume=auto")  # one GPU, no process group: DCP reads alone
    plain = losses(tmp_path / "single")
    assert single["world_size"] == 1 and sorted(plain) == [1, 2, 3, 4]
    for name in ("fsdp-again", "to-one"):
        got = losses(tmp_path / name)
        assert sorted(got) == [3, 4] and all(abs(got[s] - plain[s]) < 1e-5 for s in got), (name, got, plain)
