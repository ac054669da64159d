"""docs/training.md's Slurm example, as local processes: the data prepared once by an array job
(`cramlm data prepare --num-shards 2 --shard-index i`, both tasks at once, then `cramlm data
merge`), two "nodes" (one torchrun agent each, c10d rendezvous on localhost, as `srun torchrun`
starts them), the time limit (SIGTERM to every agent, as srun sends it) ending in a checkpoint, and
the requeued job resuming from it to the same losses as one process."""

import json
import signal
import subprocess
import sys

from cramlm.train.checkpoint import checkpoint_dirs

from .helpers import REPO, TINY, env, free_port, losses, records, run, run_inprocess
from .test_interrupt import wait_for_lines

STEPS = ["budget=null", "train.budget.steps=40", "train.checkpoint_every=0", "train.checkpoint_minutes=null",
         "impl.microbatch_size=4", "impl.dist_timeout=60", "train.validate_every=0"]


def test_slurm_example_as_local_processes(tmp_path):
    cache = tmp_path / "data-cache"
    data = [o for o in TINY if o.startswith("data.")]
    cramlm = [sys.executable, "-m", "cramlm"]
    # the array job (both tasks at once: they share the tokenizer through its lock), then the merge
    shards = [subprocess.Popen([*cramlm, "data", "prepare", *data, f"cache={cache}", "--num-shards", "2",
                                "--shard-index", str(i), "--quiet"], env=env(), cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (0, 1)]
    outs = [p.communicate(timeout=300) for p in shards]
    assert [p.returncode for p in shards] == [0, 0], [err[-2000:] for _, err in outs]
    run([*cramlm, "data", "merge", *data, f"cache={cache}", "--num-shards", "2"], timeout=300)
    prepared = sorted(p.name for p in cache.iterdir())

    def nodes(**extra):  # srun: one launcher (torchrun agent) per node, each its own process group (srun signals each)
        port = free_port()
        job = [sys.executable, "-m", "cramlm.launch", "--nnodes", "2", "--nproc_per_node", "1",
               "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "job42",
               "-m", "cramlm", "pretrain", *TINY, f"base_dir={tmp_path}", "name=bert24", f"impl.data_cache={cache}",
               *STEPS, "--resume", "auto"]
        return [subprocess.Popen(job, env={**env(), **extra}, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True) for _ in range(2)]

    run_dir = tmp_path / "bert24"
    agents = nodes()
    try:
        wait_for_lines(run_dir / "metrics.jsonl", 3, agents)
        for agent in agents:  # the time limit
            agent.send_signal(signal.SIGTERM)
        outs = [a.communicate(timeout=120) for a in agents]
    finally:
        for agent in agents:
            agent.kill()
    assert [a.returncode for a in agents] == [75, 75], [err[-2000:] for _, err in outs]  # the job can requeue on 75
    (event,) = records(run_dir, "event")
    assert event["event"] == "interrupted" and event["signal"] == "SIGTERM" and event["step"] < 40, outs[0][1][-2000:]
    assert [p.name for p in checkpoint_dirs(run_dir / "checkpoints")] == [f"step-{event['step']:08d}"]

    agents = nodes(CRAMLM_PLUGINS="tests.train.two_hosts")  # the requeued job, each node reporting a host of its own
    try:
        outs = [a.communicate(timeout=300) for a in agents]
    finally:
        for agent in agents:
            agent.kill()
    assert [a.returncode for a in agents] == [0, 0], [err[-3000:] for _, err in outs]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 40 and summary["world_size"] == 2
    assert sorted(p.name for p in cache.iterdir()) == prepared  # the training used the merged data, prepared once
    assert summary["data"].startswith(str(cache))
    resumed = [r for r in records(run_dir, "event") if r["event"] == "resumed"]
    assert resumed and resumed[0]["step"] == event["step"] and resumed[0]["checkpoint_world_size"] == 2
    first, again = records(run_dir, "segment")  # every rank's machine gathered: one named while both nodes are this one
    assert (first["step"], first["world_size"], "machines" in first) == (0, 2, False)
    assert again["step"] == event["step"] and again["machine"]["host"] == "node0"
    assert [(m["host"], m["ranks"]) for m in again["machines"]] == [("node1", [1])]
    # the same run as one process, across the interruption
    run_inprocess(tmp_path, "one", *STEPS, f"impl.data_cache={cache}")
    reference, got = losses(tmp_path / "one"), losses(run_dir)
    assert sorted(got) == list(range(1, 41)), sorted(got)
    assert all(abs(got[s] - reference[s]) < 1e-5 for s in reference), (got, reference)
