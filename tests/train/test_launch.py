"""``python -m cramlm.launch`` (issue 20 item 6): torchrun exits 1 with ``SignalException`` after a
SIGTERM even though its workers checkpointed and exited 75; the wrapper's own status is 75 then,
so a job script can tell preemption from failure, and a failure stays a failure."""

import re
import subprocess
import sys
from pathlib import Path

from cramlm.launch import last_attempt, workers_interrupted
from cramlm.train.checkpoint import checkpoint_dirs
from cramlm.train.preemption import EXIT_INTERRUPTED

from .helpers import REPO, env, free_port, overrides, records
from .test_interrupt import STEPS, sigterm_after_two_steps


def launch_cmd(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "cramlm.launch", f"--nproc_per_node={nproc}", f"--master_port={free_port()}",
            "-m", "cramlm", *args]


def test_sigterm_to_the_launcher_gives_75_and_a_checkpoint(tmp_path):
    cmd = launch_cmd(2, "pretrain", *overrides(tmp_path, "tr", *STEPS, "impl.microbatch_size=4", "impl.dist_timeout=60"))
    proc, out, err = sigterm_after_two_steps(cmd, tmp_path / "tr")  # to the launcher only, as from srun
    assert proc.returncode == EXIT_INTERRUPTED, err[-3000:]
    # torchrun's own end (SignalException, exit 1), corrected by the launcher's status and told in one line
    assert "cramlm.launch: torchrun stopped on a stop signal; each worker's reason is above" in err and "Traceback" not in err, err[-3000:]
    (event,) = records(tmp_path / "tr", "event")
    assert event["event"] == "interrupted" and event["signal"] == "SIGTERM" and event["step"] < 60
    assert [p.name for p in checkpoint_dirs(tmp_path / "tr" / "checkpoints")] == [f"step-{event['step']:08d}"]


def test_a_failing_run_keeps_its_failure_status(tmp_path):
    res = subprocess.run(launch_cmd(2, "pretrain", *overrides(tmp_path, "bad", "train.batch_size=0")), env=env(),
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode not in (0, EXIT_INTERRUPTED), res.stderr[-3000:]
    # each worker's one Error line, then one line for torchrun's end in place of its ChildFailedError traceback
    # (under load torchrun may stop the other worker before it reads its config: then it says nothing itself)
    assert 1 <= res.stderr.count("Error: invalid config") == res.stderr.count("train.batch_size") <= 2, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "ChildFailedError" not in res.stderr, res.stderr[-3000:]
    (line,) = [line for line in res.stderr.splitlines() if line.startswith("cramlm.launch:")]
    assert re.fullmatch(r"cramlm\.launch: torchrun stopped as a worker failed; each worker's reason is above "
                        r"\(local rank 0: (exit 1|stopped by torchrun), local rank 1: (exit 1|stopped by torchrun)\)", line), line
    assert "exit 1" in line


def test_a_worker_that_did_not_record_its_exit_keeps_torchruns_report(tmp_path):
    """A worker that is not cramlm (or was killed before its exit) says nothing of its own: torchrun's
    report is then the only account of the failure, and stays."""
    cmd = [sys.executable, "-m", "cramlm.launch", "--nproc_per_node=1", f"--master_port={free_port()}",
           "-m", "json.tool", str(tmp_path / "missing.json")]
    res = subprocess.run(cmd, env=env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr[-3000:]
    assert "ChildFailedError" in res.stderr and "cramlm.launch: torchrun stopped" not in res.stderr, res.stderr[-3000:]


def test_75_only_when_every_worker_of_the_last_attempt_says_so(tmp_path):
    def folder(name: str, *files: tuple[str, str]) -> Path:
        d = tmp_path / name
        d.mkdir()
        for fname, text in files:
            (d / fname).write_text(text)
        return d

    assert workers_interrupted(folder("both", ("0000-0", "75 2"), ("0000-1", "75 2")))
    assert not workers_interrupted(folder("one-missing", ("0000-0", "75 2")))  # the other was killed
    assert not workers_interrupted(folder("one-failed", ("0000-0", "75 2"), ("0000-1", "1 2")))
    assert workers_interrupted(folder("restarted", ("0000-0", "1 1"), ("0001-0", "75 1")))
    assert not workers_interrupted(folder("none"))
    assert last_attempt(tmp_path / "one-failed") == {"0": 75, "1": 1}
    assert last_attempt(tmp_path / "one-missing") is None
    assert last_attempt(folder("ten", *((f"0000-{r}", "1 11") for r in range(11)))) == {str(r): 1 for r in range(11)}
