"""Checkpoints: a run killed by SIGKILL and resumed ends bitwise equal to an uninterrupted one; a kill
during a checkpoint write leaves the previous checkpoint loadable; tied weights are stored once."""

import random
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from cramlm.train.checkpoint import checkpoint_dirs, kept_at, latest_checkpoint, read_checkpoint

from .helpers import REPO, env, killed_after_step, losses, overrides, records, run, run_inprocess

STEPS = ["budget=null", "train.budget.steps=10", "train.checkpoint_every=1", "train.keep_checkpoints=3"]


def same_weights(a, b) -> bool:
    wa, wb = load_file(str(a)), load_file(str(b))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_sigkill_then_resume_is_bitwise_identical(tmp_path):
    reference = run_inprocess(tmp_path, "ref", *STEPS)
    assert reference["steps"] == 10
    kill_at = random.Random(5).randint(2, 8)  # a "random" step, fixed so the test is repeatable
    killed_after_step(kill_at, ["pretrain", *overrides(tmp_path, "killed", *STEPS)])  # by the process itself: on any machine
    metrics = tmp_path / "killed" / "metrics.jsonl"
    done = [int(p.name[5:]) for p in checkpoint_dirs(tmp_path / "killed" / "checkpoints")]
    assert done and max(done) < 10  # killed mid-run
    resumed = run_inprocess(tmp_path, "killed", *STEPS, "resume=auto")
    assert resumed["steps"] == 10
    assert same_weights(tmp_path / "ref" / "model.safetensors", tmp_path / "killed" / "model.safetensors")
    # the loss of every step is the same too (resumed steps append to metrics.jsonl)
    assert {s: l for s, l in losses(tmp_path / "killed").items()} == losses(tmp_path / "ref")
    assert any(r["event"] == "resumed" for r in records(tmp_path / "killed", "event"))
    from cramlm.report.rundata import read_metrics
    from cramlm.report.segments import segments

    cut, last = segments(read_metrics(metrics), 10)  # the kill is a segment cut off: the steps after its checkpoint ran twice
    (resumed_at,) = [r["step"] for r in records(tmp_path / "killed", "event") if r["event"] == "resumed"]
    assert cut.stopped is None and last.start == resumed_at <= min(max(done), cut.end) and cut.retrained == cut.end - resumed_at
    assert cut.ended.startswith(f"cut off after step {cut.end} (last logged); the next resumed from step {resumed_at}")
    assert last.ended == "done at step 10" and cut.info["machine"]["boot"] == last.info["machine"]["boot"]
    import json  # the thread count is recorded, so impl.threads=auto can resume with the same one

    state = json.loads((latest_checkpoint(tmp_path / "killed" / "checkpoints") / "state.json").read_text())
    assert isinstance(state["threads"], int) and state["threads"] >= 1


def test_kill_during_checkpoint_write_keeps_previous(tmp_path):
    # a real process that dies (SIGKILL) half-way through writing its third checkpoint
    script = textwrap.dedent(f"""
        import os, signal, sys
        import cramlm.train.checkpoint as c
        original, calls = c.save_state_dict, [0]
        def dying(state, path, aliases):
            calls[0] += 1
            if calls[0] == 3:
                path.write_bytes(b"half a file")
                os.kill(os.getpid(), signal.SIGKILL)
            original(state, path, aliases)
        c.save_state_dict = dying
        from cramlm.cli import main
        main(["pretrain", *{overrides(tmp_path, "dying", *STEPS)!r}])
    """)
    proc = subprocess.run([sys.executable, "-c", script], env=env(), cwd=REPO, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-3000:]
    root = tmp_path / "dying" / "checkpoints"
    assert [p.name for p in checkpoint_dirs(root)] == ["step-00000001", "step-00000002"]
    assert list(root.glob(".tmp-step-00000003-*"))  # the interrupted write, under a temporary name
    model, training, state = read_checkpoint(latest_checkpoint(root), {"head.decoder.weight": "trunk.tokens.weight"})
    assert state["usage"]["steps"] == 2 and training["optimizer"]["state"]
    # resuming from it cleans the partial write and finishes the run
    resumed = run_inprocess(tmp_path, "dying", *STEPS, "resume=auto")
    assert resumed["steps"] == 10 and not list(root.glob(".tmp-*"))
    assert len(checkpoint_dirs(root)) == 3  # keep_checkpoints


def test_tied_weights_stored_once_and_loadable(tmp_path):
    from cramlm.run.build import load_run

    run_inprocess(tmp_path, "tied", "budget=null", "train.budget.steps=1")
    names = load_file(str(tmp_path / "tied" / "model.safetensors")).keys()
    assert "trunk.tokens.weight" in names and "head.decoder.weight" not in names
    model, tok, cfg = load_run(tmp_path / "tied")
    assert model.decoder.weight is model.tokens.weight


def test_cli_resume_auto_extends_a_finished_run(tmp_path):
    from click.testing import CliRunner

    from cramlm.cli import main

    args = overrides(tmp_path, "cli", "budget=null")
    first = CliRunner().invoke(main, ["pretrain", *args, "train.budget.steps=2"])
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(main, ["pretrain", "--resume", "auto", *args, "train.budget.steps=3"])
    assert again.exit_code == 0, again.output
    assert "resumed from" in again.output and sorted(losses(tmp_path / "cli")) == [1, 2, 3]


def test_a_resume_goes_on_with_its_data_after_the_corpus_grew(tmp_path):
    """A corpus file appended to after a run prepared its cache: a fresh run on it is refused (the
    cache is of other text), a resume goes on with the cache's tokens, the data its checkpoint pins
    (was: refused, with remedies that do not let it continue)."""
    import json

    from click.testing import CliRunner

    from cramlm.cli import main

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i}: " + "the whale and the sea and the ship " * 12}) + "\n"
                              for i in range(40)))
    args = overrides(tmp_path, "grown", "budget=null", f"data.sources=[{{type: jsonl, path: {corpus}}}]", "data.name=grown")
    first = CliRunner().invoke(main, ["pretrain", *args, "train.budget.steps=2"])
    assert first.exit_code == 0, first.output
    with corpus.open("a") as f:
        f.write(json.dumps({"text": "a document added later " * 10}) + "\n")
    again = CliRunner().invoke(main, ["pretrain", "--resume", "auto", *args, "train.budget.steps=3"])
    assert again.exit_code == 0, again.output
    assert "resumed from" in again.output and "goes on with the cache's tokens" in again.output
    fresh = CliRunner().invoke(main, ["pretrain", *overrides(tmp_path, "fresh", "budget=null", f"data.sources=[{{type: jsonl, path: {corpus}}}]",
                                                             "data.name=grown"), "train.budget.steps=1"])
    assert fresh.exit_code != 0 and "prepared from other files" in fresh.output


# t = steps / 10: 0.25 is reached at step 3, 0.5 at step 5; the others rotate out (two kept)
KEPT_AT = [*STEPS[:3], "train.keep_checkpoints=2", "train.checkpoint_at=[0.5,0.25]"]


def test_checkpoints_at_fractions_of_the_budget_are_kept_and_a_resume_writes_the_rest(tmp_path):
    run_inprocess(tmp_path, "run", *KEPT_AT)
    root = tmp_path / "run" / "checkpoints"
    assert [(p.name, kept_at(p)) for p in checkpoint_dirs(root)] == [
        ("step-00000003", 0.25), ("step-00000005", 0.5), ("step-00000009", None), ("step-00000010", None)]
    # resumed from the first: 0.25 has passed, 0.5's checkpoint is written again, and the run is the same
    run_inprocess(tmp_path, "branch", *KEPT_AT, f"resume={root / 'step-00000003'}")
    branch = tmp_path / "branch" / "checkpoints"
    assert [(p.name, kept_at(p)) for p in checkpoint_dirs(branch)] == [
        ("step-00000005", 0.5), ("step-00000009", None), ("step-00000010", None)]
    assert same_weights(tmp_path / "run" / "model.safetensors", tmp_path / "branch" / "model.safetensors")


def test_a_stop_at_a_kept_fraction_keeps_its_checkpoint(tmp_path, monkeypatch):
    from cramlm.train.preemption import Interrupted
    from cramlm.train.trainer import Trainer

    train_step = Trainer.train_step

    def stopped_at_three(self, n_micro):
        step = train_step(self, n_micro)
        step.stop = signal.SIGTERM if step.number == 3 else step.stop
        return step

    monkeypatch.setattr(Trainer, "train_step", stopped_at_three)
    with pytest.raises((Interrupted, SystemExit)):
        run_inprocess(tmp_path, "run", *KEPT_AT, "train.checkpoint_every=0", "train.checkpoint_minutes=null")
    monkeypatch.undo()
    run_inprocess(tmp_path, "run", *KEPT_AT, "train.checkpoint_every=0", "train.checkpoint_minutes=null", "resume=auto")
    root = tmp_path / "run" / "checkpoints"
    assert [(p.name, kept_at(p)) for p in checkpoint_dirs(root)] == [
        ("step-00000003", 0.25), ("step-00000005", 0.5), ("step-00000010", None)]


def test_a_kept_checkpoint_stays_kept_when_its_run_is_resumed_finished_or_with_a_larger_budget(tmp_path):
    def kept(name):
        return [(p.name, kept_at(p)) for p in checkpoint_dirs(tmp_path / name / "checkpoints") if kept_at(p)]

    # reached on the last step: the final checkpoint is kept, and saved again by a resume of the finished run
    last = [*STEPS[:3], "train.keep_checkpoints=2", "train.checkpoint_at=[0.95]"]
    run_inprocess(tmp_path, "last", *last)
    assert [p.name[-2:] for p in checkpoint_dirs(tmp_path / "last" / "checkpoints")] == ["08", "09", "10"]  # (beside the 2 newest)
    run_inprocess(tmp_path, "last", *last, "resume=auto")
    run_inprocess(tmp_path, "last", *last, "train.budget.steps=14", "resume=auto")
    assert kept("last") == [("step-00000010", 0.95), ("step-00000014", 0.95)]  # (0.95 of the longer budget too)
    # the budget doubled: the old final step is 0.5 of the new one, and its checkpoint is kept for it
    half = ["budget=null", "train.checkpoint_every=1", "train.keep_checkpoints=2", "train.checkpoint_at=[0.5]"]
    run_inprocess(tmp_path, "half", *half, "train.budget.steps=10")
    run_inprocess(tmp_path, "half", *half, "train.budget.steps=20", "resume=auto")
    assert kept("half") == [("step-00000005", 0.5), ("step-00000010", 0.5)]
