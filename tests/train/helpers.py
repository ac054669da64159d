"""Shared by the training tests: tiny configs, running cramlm in-process or as real processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from cramlm.cli.common import resolve_or_exit
from cramlm.run.pretrain import pretrain

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # plugins are imported as tests.train.plugin_models
    sys.path.insert(0, str(REPO))

# tiny MLM run, one thread so that float results are identical in every process
TINY = [
    "arch.hidden_size=32", "arch.num_layers=2", "arch.num_heads=2", "arch.intermediate_size=64",
    "arch.max_seq_length=32", "data.seq_length=32", "data.tokenizer.vocab_size=512",
    "data.max_entries_in_raw_dataset=20", "train.batch_size=8", "impl.microbatch_size=8",
    "impl.progress=false", "impl.threads=1", "impl.precision=fp32", "train.log_every=1", "train.validate_sequences=4",
    "train.min_updates=0",
]
CAUSAL = ["plugins=[tests.train.plugin_models]", f"arch={Path(__file__).with_name('tiny-causal.yaml')}"]


def overrides(tmp: Path, name: str, *extra: str) -> list[str]:
    return [*TINY, f"base_dir={tmp}", f"name={name}", f"impl.data_cache={tmp.parent / 'data-cache'}", *extra]


def run_inprocess(tmp: Path, name: str, *extra: str) -> dict:
    return pretrain(resolve_or_exit("pretrain", overrides(tmp, name, *extra)))


def env() -> dict:
    # this checkout's src first: subprocesses run the code under test, not another installed copy
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        e.pop(key, None)
    return e


def cramlm_cmd(tmp: Path, name: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "cramlm", "pretrain", *overrides(tmp, name, *extra)]


def torchrun_cmd(nproc: int, tmp: Path, name: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={free_port()}",
        "-m", "cramlm", "pretrain", *overrides(tmp, name, *extra),
    ]


def run(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if proc.returncode:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def records(run_dir: Path, kind: str = "train") -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == kind]


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(run_dir)}


def record_collated(into: list[int]):
    """Patch ``StepData`` so that every stream position a process collates is appended to ``into``
    (the real methods run); returns a function that undoes the patch."""
    from cramlm.train.batches import StepData

    sequences = StepData.sequences

    def recording(self, positions):
        into.extend(int(p) for p in positions)
        return sequences(self, positions)

    StepData.sequences = recording
    return lambda: setattr(StepData, "sequences", sequences)


# a tiny finished run with checkpoints at steps 1 and 2, shared by the run-folder tests
FINISHED_STEPS = ["budget=null", "train.budget.steps=2", "train.checkpoint_every=1"]


def finished_run(tmp_path_factory, label: str) -> Path:
    base = tmp_path_factory.mktemp(label)
    run_inprocess(base, "base", *FINISHED_STEPS)
    return base / "base"


def copy_run(finished: Path, name: str) -> Path:
    import shutil

    run_dir = finished.parent / name
    shutil.copytree(finished, run_dir)
    return run_dir


def evaluate_tiny(run_dir: Path, pairs: Path, monkeypatch) -> dict:
    """``cramlm eval`` of ``run_dir`` on a 24-sentence two-label task and the minimal pairs at ``pairs``
    (one fine-tuning epoch); the run's eval.json."""
    task = run_dir.parent / "task"
    task.mkdir(exist_ok=True)
    rows = [(f"the whale number {i} swam {'far' if i % 2 else 'near'}", ["far", "near"][i % 2 == 0]) for i in range(24)]
    for name, part in (("train.tsv", rows[:16]), ("dev.tsv", rows[16:])):
        (task / name).write_text("sentence\tlabel\n" + "".join(f"{a}\t{y}\n" for a, y in part))
    (task / "task.json").write_text(json.dumps({"name": "whales", "columns": {"sentence1": "sentence", "label": "label"},
                                                "labels": ["far", "near"]}))
    monkeypatch.chdir(run_dir.parent)
    result = invoke("eval", f"checkpoint={run_dir}", f"eval.tasks=[{task}]", f"eval.minimal_pairs.paths=[{pairs}]",
                    "eval.epochs=1", "eval.batch_size=8", "eval.max_seq_length=32", "impl.progress=false",
                    "impl.precision=fp32")
    assert result.exit_code == 0, result.output
    return json.loads((run_dir / "eval.json").read_text())


def invoke(*args: str):
    from click.testing import CliRunner

    from cramlm.cli import main

    return CliRunner().invoke(main, list(args))


def holder(lock: Path) -> subprocess.Popen:
    """Another process holding ``lock`` (until killed)."""
    code = "import sys, time; from cramlm.locks import FolderLock; held = FolderLock(sys.argv[1], 'x').acquire(); print('held', flush=True); time.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-c", code, str(lock)], env=env(), cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def killed_after_step(step: int, argv: list[str], cwd: Path = REPO, timeout: float = 300) -> subprocess.CompletedProcess:
    """``cramlm *argv`` in its own process, SIGKILLed once metrics.jsonl holds the train line of ``step``
    (a kill with no warning: a lost machine, the OOM killer); asserts it was killed so."""
    import signal

    script = (
        "import os, signal\n"
        "from cramlm.train import metrics\n"
        "write = metrics.MetricsLog.write\n"
        "def killing(self, record):\n"
        "    write(self, record)\n"
        f"    if record.get('kind') == 'train' and record.get('step') == {step}:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "metrics.MetricsLog.write = killing\n"
        "from cramlm.cli import main\n"
        f"main({argv!r})\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], env=env(), cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    return proc
