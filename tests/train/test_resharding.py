"""A checkpoint of either format resumes on another number of processes and another layout (real
torchrun, gloo): FSDP2 -> one process, FSDP2 -> DDP, DDP -> FSDP2, one process -> FSDP2, each step
after the resume equal to one process's run to 1e-5; a sharded checkpoint resumed on the same
number of processes continues bit for bit."""

import json
import shutil
import sys

import torch
from safetensors.torch import load_file

from .helpers import CAUSAL, REPO, free_port, losses, overrides, records, run, run_inprocess

# global batch 8 = 4 microbatches of 2; a checkpoint at step 2 of 4
SETUP = ["budget=null", "train.budget.steps=4", "impl.microbatch_size=2", "train.checkpoint_every=2",
         "train.keep_checkpoints=5", "train.optim.lr=3e-3", "train.validate_every=0", *CAUSAL]
FULL, SHARDED = "impl.checkpoint_format=full", "impl.checkpoint_format=sharded"
LLAMA = ["arch=llama-tiny", "arch.num_kv_heads=1"]  # rotary positions: a non-persistent buffer


def launch(runs: list[list[str]]) -> str:
    """One torchrun launch (2 processes) running ``runs`` one after the other (dist_driver.py); its output."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           str(REPO / "tests" / "train" / "dist_driver.py"), json.dumps(runs)]
    return run(cmd, timeout=300).stdout


def from_step_2(tmp_path, source: str, name: str) -> None:
    """A run folder holding only ``source``'s step-2 checkpoint (what a kill after step 2 leaves)."""
    shutil.copytree(tmp_path / source / "checkpoints" / "step-00000002", tmp_path / name / "checkpoints" / "step-00000002")


def assert_continues(tmp_path, name: str, reference: dict, world: int, written_by: int) -> None:
    got = losses(tmp_path / name)
    assert sorted(got) == [3, 4] and all(abs(got[s] - reference[s]) < 1e-5 for s in (3, 4)), (name, got, reference)
    event = records(tmp_path / name, "event")[0]
    assert event["event"] == "resumed" and (event["world_size"], event["checkpoint_world_size"]) == (world, written_by)


def weights(tmp_path, name: str) -> dict[str, torch.Tensor]:
    return load_file(str(tmp_path / name / "model.safetensors"))


def test_checkpoints_move_between_layouts_and_world_sizes(tmp_path):
    """Full format: the optimizer's kernel is each process's own (FSDP2's Adam is unfused, one
    process's fused, whose device-side skip flag an unfused Adam refuses: an FSDP2 checkpoint
    resumed on one process died at its first step). Sharded format (FSDP2's default): DCP reshards
    on load; the same world size continues bitwise (the final weights equal)."""
    run_inprocess(tmp_path, "one", *SETUP)
    run_inprocess(tmp_path, "one-sharded", *SETUP, SHARDED)
    reference = losses(tmp_path / "one")
    assert sorted(reference) == [1, 2, 3, 4] and abs(reference[4] - reference[1]) > 1e-3
    assert losses(tmp_path / "one-sharded") == reference  # the format changes no maths
    assert all(torch.equal(a, b) for a, b in zip(weights(tmp_path, "one").values(), weights(tmp_path, "one-sharded").values()))
    launch([overrides(tmp_path, "fsdp-full", *SETUP, "impl.distributed=fsdp", FULL),
            overrides(tmp_path, "ddp", *SETUP, "impl.distributed=ddp"),
            overrides(tmp_path, "fsdp", *SETUP, "impl.distributed=fsdp"),  # sharded: FSDP2's default
            overrides(tmp_path, "llama", *SETUP, *LLAMA, "impl.distributed=fsdp")])
    step2 = tmp_path / "fsdp" / "checkpoints" / "step-00000002"
    assert (step2 / ".metadata").is_file() and not (step2 / "model.safetensors").exists()
    assert sorted(p.name for p in step2.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    resumes = {"fsdp-full-to-one": "fsdp-full", "fsdp-full-to-ddp": "fsdp-full", "ddp-to-fsdp": "ddp",
               "fsdp-again": "fsdp", "sharded-to-one": "fsdp", "sharded-to-ddp": "fsdp", "one-sharded-to-fsdp": "one-sharded",
               "llama-again": "llama"}
    for name, source in resumes.items():
        from_step_2(tmp_path, source, name)
    out = launch([overrides(tmp_path, "fsdp-full-to-ddp", *SETUP, "impl.distributed=ddp", "resume=auto"),
                  overrides(tmp_path, "ddp-to-fsdp", *SETUP, "impl.distributed=fsdp", FULL, "resume=auto"),
                  overrides(tmp_path, "fsdp-again", *SETUP, "impl.distributed=fsdp", "resume=auto"),
                  overrides(tmp_path, "sharded-to-ddp", *SETUP, "impl.distributed=ddp", "resume=auto"),
                  overrides(tmp_path, "one-sharded-to-fsdp", *SETUP, "impl.distributed=fsdp", "resume=auto"),
                  overrides(tmp_path, "llama-again", *SETUP, *LLAMA, "impl.distributed=fsdp", "resume=auto")])
    # resumed from shards under FSDP2 no process builds the whole model (rank 0 neither: llama-again),
    # unless a module cannot compute its non-persistent buffers again (the plugin's `one`: rank 0
    # builds on the host and broadcasts them, fsdp-again and one-sharded-to-fsdp); never for a full checkpoint
    assert out.count("every process builds its model on the meta device; its shards come from step-00000002") == 1, out
    run_inprocess(tmp_path, "fsdp-full-to-one", *SETUP, "resume=auto")
    run_inprocess(tmp_path, "sharded-to-one", *SETUP, "resume=auto")
    for name, world, written_by in (("fsdp-full-to-one", 1, 2), ("fsdp-full-to-ddp", 2, 2), ("ddp-to-fsdp", 2, 2),
                                    ("sharded-to-one", 1, 2), ("sharded-to-ddp", 2, 2), ("one-sharded-to-fsdp", 2, 1),
                                    ("fsdp-again", 2, 2)):
        assert_continues(tmp_path, name, reference, world, written_by)
    # the same world size: bit for bit the uninterrupted run (its final weights, assembled from shards)
    again, straight = weights(tmp_path, "fsdp-again"), weights(tmp_path, "fsdp")
    assert again.keys() == straight.keys() and all(torch.equal(again[k], straight[k]) for k in again)
    # llama's rotary frequencies are no checkpoint's: computed again on the meta-built model, bit for bit
    llama_again, llama = weights(tmp_path, "llama-again"), weights(tmp_path, "llama")
    assert losses(tmp_path / "llama-again") == {s: v for s, v in losses(tmp_path / "llama").items() if s > 2}
    assert llama_again.keys() == llama.keys() and all(torch.equal(llama_again[k], llama[k]) for k in llama)
    # the final model.safetensors assembled from shards is the one a full checkpoint gathers, bit for bit
    gathered = weights(tmp_path, "fsdp-full")
    assert gathered.keys() == straight.keys() and all(torch.equal(gathered[k], straight[k]) for k in straight)
