"""A signal during `cramlm eval` (issue 20 item 5): the fine-tuning in progress is abandoned, the
finished ones (task, seed) stay written, the exit status is 75 as in training, and the same command
continues from them without redoing any."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cramlm.cli import main
from cramlm.train.preemption import EXIT_INTERRUPTED
from tests.conftest import TINY_PRETRAIN

REPO = Path(__file__).resolve().parents[2]
# 4 seeds of 13 steps each on the shipped sentiment task: seconds per seed, so the signal sent
# when seed 0's line appears always lands while seed 1 trains
EVAL = ["checkpoint=tiny", "eval.seeds=4", "eval.epochs=1", "eval.max_train_examples=100", "eval.batch_size=8",
        "eval.max_dev_examples=50", "eval.max_seq_length=32", "impl.progress=false", "impl.precision=fp32", "impl.threads=1"]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO / "src"), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")


def _eval(cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cramlm", "eval", *EVAL], cwd=cwd, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_eval_writes_finished_seeds_exits_75_and_rerun_continues(in_tmp, sig):
    run = CliRunner().invoke(main, ["pretrain", "name=tiny", "dryrun=true", "impl.dryrun_steps=2", *TINY_PRETRAIN])
    assert run.exit_code == 0, run.output
    partial = in_tmp / "outputs" / "tiny" / "eval.partial.json"
    proc = _eval(in_tmp)
    out = []
    try:
        for line in proc.stdout:  # the trigger: seed 0's result is written (no timing guess)
            out.append(line)
            if "seed 0: fine-tuned" in line:
                if sig == signal.SIGTERM:  # held still meanwhile: a second evaluation into its folder is refused
                    proc.send_signal(signal.SIGSTOP)
                    second = CliRunner().invoke(main, ["eval", *EVAL])
                    proc.send_signal(signal.SIGCONT)
                proc.send_signal(sig)
                break
        rest, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    out = "".join(out) + rest
    assert proc.returncode == EXIT_INTERRUPTED == 75, out + err
    if sig == signal.SIGTERM:
        assert second.exit_code == 1 and f"Error: results file outputs/tiny/eval.json is in use by pid {proc.pid} " \
            in second.output and second.output.endswith("; lock file outputs/tiny/.eval.lock\n"), second.output
    assert "Traceback" not in err and f"cramlm eval: {sig.name}: stopped" in err, err
    written = json.loads(partial.read_text())
    seeds = written["tasks"]["rotten_tomatoes_small"]["seeds"]
    assert "0" in seeds and len(seeds) < 4, seeds
    assert written["device"] == "cpu" and written["precision"]  # another device or precision: not continued
    assert not (in_tmp / "outputs" / "tiny" / "eval.json").exists()
    if sig != signal.SIGTERM:
        return
    again = subprocess.run([sys.executable, "-m", "cramlm", "eval", *EVAL], cwd=in_tmp, env=_env(),
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    for seed in seeds:  # not redone
        assert f"seed {seed}: finished before" in again.stdout and f"seed {seed}: fine-tuned" not in again.stdout
    assert sum(f"seed {s}: fine-tuned" in again.stdout for s in range(4)) == 4 - len(seeds)
    (row,) = json.loads((in_tmp / "outputs" / "tiny" / "eval.json").read_text())["results"]
    assert [s["seed"] for s in row["seeds"]] == [0, 1, 2, 3]
    assert row["seeds"][0]["epochs"] == [e["dev"] for e in seeds["0"]["epochs"]]  # seed 0 as written before
    assert not partial.exists()  # all in eval.json now
    assert not list((in_tmp / "outputs" / "tiny").glob(".eval.lock*"))  # the lock and its owner file removed


def test_a_changed_hparam_redoes_the_finished_seeds(tmp_path):
    from cramlm.eval.config import Hparams
    from cramlm.eval.partial import Partial
    from cramlm.eval.tasks import Example, Task

    task = Task("t", ["a", "b"], ["accuracy"], [Example("x", None, 0)], {"dev": [Example("y", None, 1)]})
    path = tmp_path / "eval.partial.json"
    p = Partial(path, {"checkpoint": "c"})
    p.add_run(task, Hparams(), 0, {"seed": 0, "epochs": []})
    again = Partial(path, {"checkpoint": "c"})
    assert again.reused == 1 and again.run(task, Hparams(), 0) == {"seed": 0, "epochs": []}
    assert again.run(task, Hparams(lr=1e-2), 0) is None  # other hyperparameters: redone
    other = Task("t", ["a", "b"], ["accuracy"], [Example("x changed", None, 0)], {"dev": [Example("y", None, 1)]})
    assert again.run(other, Hparams(), 0) is None  # other data: redone
    # a file written before the device and precision were recorded: taken as this evaluation's
    assert Partial(path, {"checkpoint": "c", "device": "cpu", "precision": "auto"}).reused == 1
    assert Partial(path, {"checkpoint": "other"}).reused == 0  # another checkpoint: nothing reused,
    kept = tmp_path / "eval.partial.other.json"  # and its file set aside, not overwritten
    assert not path.exists() and json.loads(kept.read_text())["tasks"]["t"]["seeds"]["0"] == {"seed": 0, "epochs": []}


def _pairs_file(folder: Path, n: int) -> Path:
    """``n`` distinct pairs: enough masked copies that scoring them takes many batches."""
    folder.mkdir()
    with (folder / "agreement.jsonl").open("w") as f:
        for i in range(n):
            f.write(json.dumps({"sentence_good": f"The whale number {i} swims in the grey sea.",
                                "sentence_bad": f"The whale number {i} swim in the grey sea.",
                                "UID": "agreement", "linguistics_term": "agreement"}) + "\n")
    return folder


# The child signals itself at a chosen point (no race with a fast machine finishing first), by a patch
# made before cramlm's command runs: SIGTERM at the first batch of minimal pairs; SIGTERM once a task's
# seed 0 is written; SIGKILL once the partial file keeps the second slice of sentences.
AT_FIRST_PAIR_BATCH = """
from cramlm.eval import sentence_scores
score = sentence_scores.score_sentences
def signalled(*args):
    *head, progress = args
    def first_batch(n):
        os.kill(os.getpid(), signal.SIGTERM)
        progress(n)
    return score(*head, first_batch)
sentence_scores.score_sentences = signalled
"""
AFTER_SEED_0 = """
from cramlm.eval.partial import Partial
add = Partial.add_run
def signalled(self, task, hp, seed, done):
    add(self, task, hp, seed, done)
    if seed == 0:
        os.kill(os.getpid(), signal.SIGTERM)
Partial.add_run = signalled
"""
AT_SECOND_KEPT_SLICE = """
from cramlm.eval.partial import Partial
keep, calls = Partial.keep_pairs, []
def killed(self, key, scores, seconds):
    keep(self, key, scores, seconds)
    calls.append(1)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
Partial.keep_pairs = killed
"""


def _signalling(patch: str, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`cramlm *argv` in its own process with ``patch`` applied first."""
    script = f"import os, signal\n{patch}\nfrom cramlm.cli import main\nmain({argv!r})\n"
    return subprocess.run([sys.executable, "-c", script], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)


def test_a_signal_during_the_minimal_pairs_stops_them_and_a_scored_result_is_not_redone(in_tmp):
    run = CliRunner().invoke(main, ["pretrain", "name=tiny", "dryrun=true", "impl.dryrun_steps=2", *TINY_PRETRAIN])
    assert run.exit_code == 0, run.output
    pairs = [f"eval.minimal_pairs.paths=[{_pairs_file(in_tmp / 'pairs', 60)}]", "eval.minimal_pairs.batch_tokens=256"]
    argv = ["eval", *EVAL, "eval.seeds=2", *pairs]
    command = [sys.executable, "-m", "cramlm", *argv]
    # stopped at the first scorer's first batch: the signal lands among its batches
    first = _signalling(AT_FIRST_PAIR_BATCH, argv, in_tmp)
    out, err = first.stdout, first.stderr
    assert first.returncode == EXIT_INTERRUPTED, out + err
    assert "Traceback" not in err and "stopped (in the minimal pairs)" in err, err
    assert "sentences in" not in out  # stopped inside the first scorer, among its ~90 batches
    partial = in_tmp / "outputs" / "tiny" / "eval.partial.json"
    assert json.loads(partial.read_text())["minimal_pairs"] is None
    # scored in full, then stopped in the fine-tuning: the next run takes the pairs from the partial file
    second = _signalling(AFTER_SEED_0, argv, in_tmp)
    out, err = second.stdout, second.stderr
    assert second.returncode == EXIT_INTERRUPTED and "minimal pairs: scored before" not in out, out + err
    assert "seed 0: fine-tuned" in out and "seed 1: fine-tuned" not in out, out
    scored = json.loads(partial.read_text())["minimal_pairs"]["result"]
    assert scored["sentences"] == 120
    third = subprocess.run(command, cwd=in_tmp, env=_env(), capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stdout + third.stderr
    assert "minimal pairs: scored before" in third.stdout
    assert json.loads((in_tmp / "outputs" / "tiny" / "eval.json").read_text())["minimal_pairs"]["scores"] == scored["scores"]


def test_a_killed_minimal_pair_scoring_continues_after_the_sentences_it_wrote_to_the_same_scores(in_tmp):
    """SIGKILL (no handler runs) part way through the pairs: the sentences scored before the last write of
    the partial file are kept, the same command scores only the rest (under another save_every too) and
    its scores are those of a scoring never stopped; its seconds count both processes."""
    run = CliRunner().invoke(main, ["pretrain", "name=tiny", "dryrun=true", "impl.dryrun_steps=2", *TINY_PRETRAIN])
    assert run.exit_code == 0, run.output
    pairs = [f"eval.minimal_pairs.paths=[{_pairs_file(in_tmp / 'pairs', 200)}]", "eval.minimal_pairs.batch_tokens=256",
             "eval.tasks=[]"]
    command = [sys.executable, "-m", "cramlm", "eval", *EVAL, *pairs]
    partial = in_tmp / "outputs" / "tiny" / "eval.partial.json"

    def kept() -> int:
        scores = (json.loads(partial.read_text()).get("minimal_pairs_kept") or {}).get("scores") or {}
        return min((len(v) for by_method in scores.values() for v in by_method.values()), default=0)

    first = _signalling(AT_SECOND_KEPT_SLICE, ["eval", *EVAL, *pairs, "eval.minimal_pairs.save_every=16"], in_tmp)
    assert first.returncode == -signal.SIGKILL, first.stdout + first.stderr
    scored = kept()
    assert scored == 32, scored  # two whole slices of 16 of the 400 sentences
    written = json.loads(partial.read_text())
    assert written["minimal_pairs_kept"]["seconds"] > 0  # the time those took is kept with them
    written["minimal_pairs_kept"]["seconds"] = 1000.0  # (marked, to find it in the total)
    partial.write_text(json.dumps(written))
    second = subprocess.run([*command, "eval.minimal_pairs.save_every=50"], cwd=in_tmp, env=_env(),
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"scoring 400 sentences ({scored:,} scored before, kept)" in second.stdout, second.stdout
    assert not partial.exists()
    reference = subprocess.run([*command, "out_dir=reference"], cwd=in_tmp, env=_env(), capture_output=True, text=True,
                               timeout=300)
    assert reference.returncode == 0, reference.stdout + reference.stderr
    got = json.loads((in_tmp / "outputs" / "tiny" / "eval.json").read_text())["minimal_pairs"]
    want = json.loads((in_tmp / "reference" / "eval.json").read_text())["minimal_pairs"]
    assert got["scores"] == want["scores"] and got["sentences"] == want["sentences"] == 400
    assert 1000 < got["seconds"] < 1000 + 300  # the scoring's cost counts both processes
