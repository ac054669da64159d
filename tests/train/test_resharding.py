"""A checkpoint resumes on another number of processes and another layout (real torchrun, gloo):
FSDP2 -> one process, FSDP2 -> DDP and DDP -> FSDP2, each step after the resume equal to one
process's run to 1e-5."""

import json
import shutil
import sys

from .helpers import CAUSAL, REPO, free_port, losses, overrides, records, run, run_inprocess

# global batch 8 = 4 microbatches of 2; a checkpoint at step 2 of 4
SETUP = ["budget=null", "train.budget.steps=4", "impl.microbatch_size=2", "train.checkpoint_every=2",
         "train.keep_checkpoints=5", "train.optim.lr=3e-3", "train.validate_every=0", *CAUSAL]


def launch(tmp_path, runs: list[list[str]]) -> None:
    """One torchrun launch (2 processes) running ``runs`` one after the other (dist_driver.py)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           str(REPO / "tests" / "train" / "dist_driver.py"), json.dumps(runs)]
    run(cmd, timeout=300)


def from_step_2(tmp_path, source: str, name: str) -> None:
    """A run folder holding only ``source``'s step-2 checkpoint (what a kill after step 2 leaves)."""
    shutil.copytree(tmp_path / source / "checkpoints" / "step-00000002", tmp_path / name / "checkpoints" / "step-00000002")


def assert_continues(tmp_path, name: str, reference: dict, world: int, written_by: int) -> None:
    got = losses(tmp_path / name)
    assert sorted(got) == [3, 4] and all(abs(got[s] - reference[s]) < 1e-5 for s in (3, 4)), (name, got, reference)
    event = records(tmp_path / name, "event")[0]
    assert event["event"] == "resumed" and (event["world_size"], event["checkpoint_world_size"]) == (world, written_by)


def test_full_checkpoints_move_between_fsdp_ddp_and_one_process(tmp_path):
    """The optimizer's kernel is each process's own: FSDP2's Adam is unfused (sharded parameters),
    one process's fused (its device-side skip flag needs that); a resume keeps its own."""
    run_inprocess(tmp_path, "one", *SETUP)
    reference = losses(tmp_path / "one")
    assert sorted(reference) == [1, 2, 3, 4] and abs(reference[4] - reference[1]) > 1e-3
    full = "impl.progress=false"  # (the full format: the only one)
    launch(tmp_path, [overrides(tmp_path, "fsdp", *SETUP, "impl.distributed=fsdp", full),
                      overrides(tmp_path, "ddp", *SETUP, "impl.distributed=ddp")])
    for name, source in (("fsdp-to-one", "fsdp"), ("fsdp-to-ddp", "fsdp"), ("ddp-to-fsdp", "ddp")):
        from_step_2(tmp_path, source, name)
    launch(tmp_path, [overrides(tmp_path, "fsdp-to-ddp", *SETUP, "impl.distributed=ddp", "resume=auto"),
                      overrides(tmp_path, "ddp-to-fsdp", *SETUP, "impl.distributed=fsdp", full, "resume=auto")])
    run_inprocess(tmp_path, "fsdp-to-one", *SETUP, "resume=auto")  # died at its first step: torch's unfused Adam
    assert_continues(tmp_path, "fsdp-to-one", reference, world=1, written_by=2)
    assert_continues(tmp_path, "fsdp-to-ddp", reference, world=2, written_by=2)
    assert_continues(tmp_path, "ddp-to-fsdp", reference, world=2, written_by=2)
