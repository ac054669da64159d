"""Real processes with gloo: 2-process DDP and FSDP2 train like 1 process with the same global batch,
each process collating only its own sequences; a checkpoint resumes on another number of processes;
a failing rank makes the job fail fast."""

import json
import shutil
import subprocess
import sys
import time

from .helpers import CAUSAL, REPO, env, free_port, losses, overrides, record_collated, records, run, run_inprocess

# global batch 8 = 4 microbatches of 2: one process accumulates 4, each of two processes 2
SETUP = ["budget=null", "train.budget.steps=4", "impl.microbatch_size=2", "train.checkpoint_every=2",
         "train.keep_checkpoints=5", "train.optim.lr=3e-3", "train.validate_every=0.5"]


def test_ddp_and_fsdp_match_one_process(tmp_path):
    """One torchrun launch (2 processes) runs, for the MLM crammed-bert and a causal LM: DDP, FSDP2,
    and FSDP2 resumed from the 1-process checkpoint at step 2."""
    runs, one_process = [], {}
    for arch, extra in {"mlm": SETUP, "clm": [*SETUP, *CAUSAL]}.items():
        undo = record_collated(one_process.setdefault(arch, []))
        try:
            run_inprocess(tmp_path, f"{arch}-one", *extra)
        finally:
            undo()
        shutil.copytree(tmp_path / f"{arch}-one" / "checkpoints" / "step-00000002",
                        tmp_path / f"{arch}-fsdp-resumed" / "checkpoints" / "step-00000002")
        runs += [
            overrides(tmp_path, f"{arch}-ddp", *extra, "impl.distributed=ddp"),
            overrides(tmp_path, f"{arch}-fsdp", *extra, "impl.distributed=fsdp"),
            overrides(tmp_path, f"{arch}-fsdp-resumed", *extra, "impl.distributed=fsdp", "resume=auto"),
        ]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           str(REPO / "tests" / "train" / "dist_driver.py"), json.dumps(runs)]
    proc = run(cmd, timeout=300)
    assert "x 2 processes (ddp)" in proc.stdout and "x 2 processes (fsdp)" in proc.stdout
    for arch in ("mlm", "clm"):
        reference = losses(tmp_path / f"{arch}-one")
        assert sorted(reference) == [1, 2, 3, 4]
        for name in (f"{arch}-ddp", f"{arch}-fsdp"):
            got = losses(tmp_path / name)
            assert sorted(got) == [1, 2, 3, 4]
            assert all(abs(got[s] - reference[s]) < 1e-5 for s in reference), (name, got, reference)
            val = records(tmp_path / name, "val")[-1]["val_loss"]
            assert abs(val - records(tmp_path / f"{arch}-one", "val")[-1]["val_loss"]) < 1e-5
            assert json.loads((tmp_path / name / "summary.json").read_text())["world_size"] == 2
        # the two processes never collated each other's sequences, and together those of one process
        assert sorted(one_process[arch]) == list(range(32))  # 4 steps of 8 stream positions
        for name, first in ((f"{arch}-ddp", 0), (f"{arch}-fsdp", 0), (f"{arch}-fsdp-resumed", 16)):
            ranks = [json.loads((tmp_path / name / f"collated-rank{r}.json").read_text()) for r in (0, 1)]
            assert all(len(set(r)) == len(r) == (32 - first) // 2 for r in ranks), (name, ranks)
            assert not set(ranks[0]) & set(ranks[1]), (name, ranks)
            assert sorted(ranks[0] + ranks[1]) == sorted(p for p in one_process[arch] if p >= first), name
        resumed = losses(tmp_path / f"{arch}-fsdp-resumed")
        assert sorted(resumed) == [3, 4] and all(abs(resumed[s] - reference[s]) < 1e-5 for s in (3, 4))
        event = records(tmp_path / f"{arch}-fsdp-resumed", "event")[0]
        assert event["world_size"] == 2 and event["checkpoint_world_size"] == 1


def test_failing_rank_fails_fast(tmp_path):
    # two processes started directly (no torchrun agent to kill the survivor): rank 1 raises in its
    # 4th forward; rank 0, waiting in a collective, must exit with an error, not hang
    port = free_port()
    args = overrides(tmp_path, "fail", *CAUSAL, "budget=null", "train.budget.steps=50", "impl.distributed=ddp",
                     "impl.dist_timeout=30", "impl.microbatch_size=4", "arch.fail_rank=1", "arch.fail_after=3")
    procs = []
    for rank in range(2):
        e = dict(env(), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, "-m", "cramlm", "pretrain", *args], env=e, cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    exited: dict[int, float] = {}
    deadline = time.time() + 120
    try:
        while len(exited) < 2 and time.time() < deadline:
            for rank, p in enumerate(procs):
                if rank not in exited and p.poll() is not None:
                    exited[rank] = time.time()
            time.sleep(0.05)
    finally:
        for p in procs:
            p.kill()
    assert procs[1].returncode != 0 and "injected failure on rank 1" in procs[1].stderr.read()
    assert procs[0].returncode != 0, "rank 0 should fail when rank 1 dies"
    assert "Connection closed by peer" in procs[0].stderr.read()
    assert exited[0] - exited[1] < 15  # seconds, far below impl.dist_timeout: it did not wait for a timeout
