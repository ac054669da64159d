"""Interruption and recovery: a signal stops a run with a checkpoint (one process and two), damaged
or half-replaced checkpoints do not stop ``resume=auto``, a full disk is reported as such, a resumed
run's summary and progress bar continue the run's history, and a diverged run fails."""

import json
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from cramlm.io import write_digests
from safetensors.torch import load_file

from cramlm.report.rundata import load_run_data, read_metrics
from cramlm.report.segments import segments
from cramlm.train import checkpoint as ckpt
from cramlm.train.checkpoint import checkpoint_dirs
from cramlm.train.hardware import machine
from cramlm.train.preemption import EXIT_INTERRUPTED

from .helpers import CAUSAL, REPO, cramlm_cmd, env, free_port, killed_after_step, losses, overrides, records, run_inprocess

STEPS = ["budget=null", "train.budget.steps=60", "train.checkpoint_every=0", "train.checkpoint_minutes=null"]


def same_weights(a, b) -> bool:
    wa, wb = load_file(str(a)), load_file(str(b))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def wait_for_lines(path, n: int, procs, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.is_file() and sum(1 for line in path.open() if '"kind": "train"' in line) >= n:
            return
        if any(p.poll() is not None for p in procs):
            raise AssertionError("exited before the signal: " + "".join(p.stderr.read() for p in procs)[-3000:])
        time.sleep(0.02)
    raise AssertionError(f"no {n} metrics lines in {timeout} s")


def sigterm_after_two_steps(cmd: list[str], run_dir) -> tuple[subprocess.Popen, str, str]:
    """Start ``cmd`` in its own process group (the signal reaches that process alone, as srun's
    reaches torchrun or the launcher), SIGTERM it once the run has logged two steps: (proc, out, err)."""
    proc = subprocess.Popen(cmd, env=env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        wait_for_lines(run_dir / "metrics.jsonl", 2, [proc])
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc, out, err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_checkpoints_and_exits_75_then_resume_is_bitwise(tmp_path, sig):
    proc = subprocess.Popen(cramlm_cmd(tmp_path, "sig", *STEPS), env=env(), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_lines(tmp_path / "sig" / "metrics.jsonl", 2, [proc])
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_INTERRUPTED == 75, err[-3000:]
    (event,) = records(tmp_path / "sig", "event")
    assert event["event"] == "interrupted" and event["signal"] == sig.name
    stopped = event["step"]
    assert 2 <= stopped < 60 and f"{sig.name}: stopped after step {stopped}" in out + err
    assert [p.name for p in checkpoint_dirs(tmp_path / "sig" / "checkpoints")] == [f"step-{stopped:08d}"]
    assert not (tmp_path / "sig" / "summary.json").exists()  # the run is not finished
    assert sorted(losses(tmp_path / "sig")) == list(range(1, stopped + 1))  # every step up to the stop logged

    resumed = run_inprocess(tmp_path, "sig", *STEPS, "resume=auto")
    assert resumed["steps"] == 60
    segs = segments(read_metrics(tmp_path / "sig" / "metrics.jsonl"), resumed["steps"])  # which ran where
    assert [(s.start, s.end) for s in segs] == [(0, stopped), (stopped, 60)]
    assert segs[0].ended == f"stopped by {sig.name} after step {stopped}, checkpoint written" and segs[1].ended == "done at step 60"
    here = machine(torch.device("cpu"))
    assert all(s.info["machine"] == here and s.info["world_size"] == 1 and s.wall for s in segs)
    assert segs[0].wall_end == segs[0].stopped["wall"] and segs[1].resumed_from.endswith(f"step-{stopped:08d}")
    if sig == signal.SIGTERM:  # one reference run is enough to show the resume is exact
        run_inprocess(tmp_path, "ref", *STEPS)
        assert same_weights(tmp_path / "ref" / "model.safetensors", tmp_path / "sig" / "model.safetensors")
        assert losses(tmp_path / "sig") == losses(tmp_path / "ref")


def test_signal_to_one_rank_stops_both_at_the_same_step(tmp_path):
    """Two gloo processes (DDP) started directly; SIGUSR1 reaches rank 1 only. The flag rides on the
    step's reduction: both stop after the same step, save together and exit 75; one process resumes."""
    port = free_port()
    args = overrides(tmp_path, "ddp", *STEPS, "impl.distributed=ddp", "impl.microbatch_size=4", "impl.dist_timeout=60")
    procs = []
    for rank in range(2):
        e = dict(env(), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, "-m", "cramlm", "pretrain", *args], env=e, cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        wait_for_lines(tmp_path / "ddp" / "metrics.jsonl", 2, procs)
        procs[1].send_signal(signal.SIGUSR1)
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [75, 75], [err[-2000:] for _, err in outs]
    (event,) = records(tmp_path / "ddp", "event")
    assert event["event"] == "interrupted" and event["signal"] == "SIGUSR1" and event["step"] < 60
    assert [p.name for p in checkpoint_dirs(tmp_path / "ddp" / "checkpoints")] == [f"step-{event['step']:08d}"]
    resumed = run_inprocess(tmp_path, "ddp", *STEPS, "impl.microbatch_size=4", "resume=auto")
    assert resumed["steps"] == 60 and min(s for s in losses(tmp_path / "ddp") if s > event["step"]) == event["step"] + 1


def test_kill_while_a_step_is_saved_again_keeps_a_checkpoint(tmp_path):
    """A finished run resumed with the same budget saves its final step again: the old folder is
    moved aside, the new one renamed in, the old one deleted. SIGKILL right after the move aside
    (keep_checkpoints=1: nothing else is left) and resume=auto restores it."""
    args = ["budget=null", "train.budget.steps=2", "train.keep_checkpoints=1"]
    run_inprocess(tmp_path, "again", *args)
    script = (
        "import os, signal\n"
        "real = os.replace\n"
        "def replace(src, dst):\n"
        "    real(src, dst)\n"
        "    if os.path.basename(str(dst)).startswith('.old-step-'):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "os.replace = replace\n"
        "from cramlm.cli import main\n"
        f"main(['pretrain', *{overrides(tmp_path, 'again', *args, 'resume=auto')!r}])\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], env=env(), cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    root = tmp_path / "again" / "checkpoints"
    assert checkpoint_dirs(root) == [] and list(root.glob(".old-step-00000002-*"))  # killed inside the window
    resumed = run_inprocess(tmp_path, "again", *args, "resume=auto")
    assert resumed["steps"] == 2 and [p.name for p in checkpoint_dirs(root)] == ["step-00000002"]
    assert not list(root.glob(".old-*")) and not list(root.glob(".tmp-*"))


@pytest.mark.parametrize("damaged", ["model.safetensors", "training.pt"])
def test_resume_auto_falls_back_past_a_truncated_checkpoint(tmp_path, capsys, damaged):
    args = ["budget=null", "train.checkpoint_every=1", "train.keep_checkpoints=3"]
    run_inprocess(tmp_path, "trunc", *args, "train.budget.steps=4")
    root = tmp_path / "trunc" / "checkpoints"
    newest = root / "step-00000004" / damaged
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    capsys.readouterr()
    resumed = run_inprocess(tmp_path, "trunc", *args, "train.budget.steps=6", "resume=auto")
    out = capsys.readouterr().out
    assert f"warning: checkpoint step-00000004 is damaged ({damaged}" in out
    assert "resumed from" in out and "step-00000003 (step 3)" in out
    assert resumed["steps"] == 6 and (root / "step-00000004.damaged").is_dir()  # kept for inspection
    assert [r["from"] for r in records(tmp_path / "trunc", "event")][-1].endswith("step-00000003")
    assert ckpt.checkpoint_problem(root / "step-00000004") is None  # step 4 trained and saved again


class _Payload:
    """Unpickling this would run a command (it never may)."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        import os

        return (os.system, (self.command,))


def test_resume_auto_sets_aside_a_checkpoint_whose_training_pt_holds_a_pickle_payload(tmp_path, capsys):
    """Issue 20 item 11: a training.pt written by torch.save (a valid, CRC-clean archive) whose
    pickle would run code stopped `--resume auto`; it is set aside like any unreadable checkpoint,
    and the payload never runs."""
    args = ["budget=null", "train.checkpoint_every=1", "train.keep_checkpoints=3"]
    run_inprocess(tmp_path, "evil", *args, "train.budget.steps=3")
    root = tmp_path / "evil" / "checkpoints"
    marker = tmp_path / "PAYLOAD-RAN"
    torch.save({"optimizer": _Payload(f"touch {marker}")}, root / "step-00000003" / "training.pt")
    write_digests(root / "step-00000003", ["training.pt"])  # its digest agrees: only the weights-only load can tell
    assert ckpt.checkpoint_problem(root / "step-00000003").startswith("training.pt: refused by the weights-only loader")
    capsys.readouterr()
    resumed = run_inprocess(tmp_path, "evil", *args, "train.budget.steps=4", "resume=auto")
    out = capsys.readouterr().out
    assert "warning: checkpoint step-00000003 is damaged (training.pt: refused" in out and "step-00000002 (step 2)" in out
    assert resumed["steps"] == 4 and (root / "step-00000003.damaged").is_dir() and not marker.exists()


def test_resume_of_a_damaged_folder_is_a_clear_error(tmp_path):
    from click.testing import CliRunner

    from cramlm.cli import main

    run_inprocess(tmp_path, "bad", "budget=null", "train.budget.steps=1")
    folder = tmp_path / "bad" / "checkpoints" / "step-00000001"
    (folder / "model.safetensors").write_bytes(b"\x08" + bytes(7))
    result = CliRunner().invoke(main, ["pretrain", *overrides(tmp_path, "bad", "budget=null", "train.budget.steps=2"),
                                       f"resume={folder}"])
    assert result.exit_code == 1 and "Error: resume=" in result.output and "damaged checkpoint" in result.output


def test_summary_and_progress_continue_the_runs_history_after_resume(tmp_path, capsys):
    first = run_inprocess(tmp_path, "hist", "budget=null", "train.budget.steps=3")
    capsys.readouterr()
    resumed = run_inprocess(tmp_path, "hist", "budget=null", "train.budget.steps=6", "resume=auto", "impl.progress=true")
    err = capsys.readouterr().err
    assert resumed["first_loss"] == first["first_loss"] == losses(tmp_path / "hist")[1]  # the run's, not step 4's
    assert resumed["last_loss"] == losses(tmp_path / "hist")[6] != resumed["first_loss"]
    shown = re.findall(r"\| ([0-9.]+)/100% of budget", err)
    assert shown[0] == "50.0" and shown[-1] == "100.0", err  # the bar starts where the run is, not at 0


def _disk_full_after(calls: int, monkeypatch):
    """Checkpoint writes that fail like a full disk from the ``calls``-th on: half a file, then ENOSPC."""
    original, count = ckpt.save_state_dict, [0]

    def full(state, path, aliases):
        count[0] += 1
        if count[0] >= calls:
            path.write_bytes(b"half a file")
            raise OSError(28, "No space left on device", str(path))
        original(state, path, aliases)

    monkeypatch.setattr(ckpt, "save_state_dict", full)


def test_disk_full_on_a_periodic_checkpoint_warns_and_training_goes_on(tmp_path, monkeypatch, capsys):
    _disk_full_after(3, monkeypatch)
    with pytest.raises(ckpt.DiskFullError):  # the final checkpoint cannot be written either
        run_inprocess(tmp_path, "full", "budget=null", "train.budget.steps=4", "train.checkpoint_every=1",
                      "train.keep_checkpoints=5")
    root = tmp_path / "full" / "checkpoints"
    assert [p.name for p in checkpoint_dirs(root)] == ["step-00000001", "step-00000002"]  # the previous ones stay
    assert not list(root.glob(".tmp-*"))  # the partial writes are gone
    events = [r for r in records(tmp_path / "full", "event") if r["event"] == "disk_full"]
    assert [e["step"] for e in events] == [3]  # the periodic one at step 3 warned, step 4 trained on
    message = events[0]["message"]
    assert "disk full" in message and "needs about" in message and "MB free" in message and "step-00000002" in message
    assert "cramlm: warning: disk full" in capsys.readouterr().out


def test_disk_full_on_the_final_checkpoint_is_one_error_line(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from cramlm.cli import main

    _disk_full_after(2, monkeypatch)
    result = CliRunner().invoke(main, ["pretrain", *overrides(tmp_path, "final", "budget=null", "train.budget.steps=2",
                                                              "train.checkpoint_every=1")])
    assert result.exit_code == 1 and "Error: disk full while writing checkpoint" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "final" / "model.safetensors").exists()
    root = tmp_path / "final" / "checkpoints"
    assert [p.name for p in checkpoint_dirs(root)] == ["step-00000001"] and not list(root.glob(".tmp-*"))


@pytest.mark.parametrize("how", ["lr=1e30", "every loss NaN"])
def test_a_run_whose_every_update_was_nonfinite_fails(tmp_path, how):
    from click.testing import CliRunner

    from cramlm.cli import main

    extra = ["train.optim.lr=1e30"] if how == "lr=1e30" else [*CAUSAL, "arch.nan_at=[2,3,4,5]"]
    result = CliRunner().invoke(main, ["pretrain", *overrides(tmp_path, "div", "budget=null", "train.budget.steps=4", *extra)])
    assert result.exit_code == 1 and "Error: training diverged" in result.output, result.output
    assert not (tmp_path / "div" / "model.safetensors").exists() and not (tmp_path / "div" / "summary.json").exists()
    (seg,) = segments(read_metrics(tmp_path / "div" / "metrics.jsonl"))  # a failure is no cut-off: it names its error
    assert seg.ended.startswith("failed after step 4: NonFiniteError: training diverged"), seg.ended


def test_nonfinite_flags_read_at_metrics_lines_equal_a_per_step_check(tmp_path):
    """With one process and fused AdamW a NaN step is dropped on the device and counted at the next
    metrics line (log_every=3): same event, same counts, bitwise the same weights as the per-step
    host check (rollback mode without a checkpoint drops the step the same way)."""
    base = [*CAUSAL, "budget=null", "train.budget.steps=6", "train.checkpoint_every=0", "train.checkpoint_minutes=null",
            "arch.nan_at=[3]", "train.log_every=3"]  # call 3 = step 2
    deferred = run_inprocess(tmp_path, "deferred", *base)
    per_step = run_inprocess(tmp_path, "per-step", *base, "train.on_nonfinite=rollback")
    assert deferred["skipped_steps"] == per_step["skipped_steps"] == 1
    (event,) = records(tmp_path / "deferred", "event")
    assert event["step"] == 2 and "non-finite loss at step 2: step skipped" in event["message"]
    assert sorted(losses(tmp_path / "deferred")) == [1, 3, 6]
    assert losses(tmp_path / "deferred") == losses(tmp_path / "per-step")
    assert same_weights(tmp_path / "deferred" / "model.safetensors", tmp_path / "per-step" / "model.safetensors")


def test_sigterm_to_torchrun_reaches_the_workers_which_checkpoint(tmp_path):
    """The documented Slurm path: SIGTERM to torchrun, which passes it on to its workers (and kills
    them 30 s later); they finish the step, save together and exit 75."""
    from .helpers import torchrun_cmd

    # its own group: the signal goes to torchrun only
    proc, out, err = sigterm_after_two_steps(
        torchrun_cmd(2, tmp_path, "tr", *STEPS, "impl.microbatch_size=4", "impl.dist_timeout=60"), tmp_path / "tr")
    assert proc.returncode != 0  # torchrun itself ends with its SignalException
    (event,) = records(tmp_path / "tr", "event")
    assert f"SIGTERM: stopped after step {event['step']}" in out + err, (out + err)[-3000:]
    assert event["event"] == "interrupted" and event["signal"] == "SIGTERM" and event["step"] < 60
    assert [p.name for p in checkpoint_dirs(tmp_path / "tr" / "checkpoints")] == [f"step-{event['step']:08d}"]


def test_a_run_killed_before_its_first_checkpoint_keeps_its_log_when_started_again(tmp_path, capsys):
    """SIGKILL after step 3 with no checkpoint written: `--resume auto` starts again from step 0 and
    appends, so the lost start's lines stay (which ran where, the steps trained again) while the
    curves read the run as it stands; the config history keeps both starts."""
    args = ["budget=null", "train.budget.steps=5", "train.checkpoint_every=100"]
    killed_after_step(3, ['pretrain', *overrides(tmp_path, 'early', *args)])
    run_dir = tmp_path / "early"
    assert checkpoint_dirs(run_dir / "checkpoints") == []
    before = (run_dir / "metrics.jsonl").read_bytes()
    assert [r["step"] for r in records(run_dir)] == [1, 2, 3]
    capsys.readouterr()
    summary = run_inprocess(tmp_path, "early", *args, "resume=auto")
    assert summary["steps"] == 5
    assert "starting again from step 0 (metrics.jsonl keeps the earlier start's lines, to step 3" in capsys.readouterr().out
    assert (run_dir / "metrics.jsonl").read_bytes().startswith(before)  # the lost start's lines, byte for byte
    assert [r["step"] for r in records(run_dir)] == [1, 2, 3, 1, 2, 3, 4, 5]
    history = [json.loads(line) for line in (run_dir / "config-history.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [0, 0]
    log = load_run_data(run_dir)
    first, second = segments(log.log)
    assert first.ended == "cut off after step 3 (last logged); the next started again from step 0 (no checkpoint): at least 3 steps trained again"
    assert second.ended == "done at step 5"
    assert [r["step"] for r in log.metrics if r.get("kind") == "train"] == [1, 2, 3, 4, 5]  # the run as it stands
