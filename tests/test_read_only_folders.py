"""A folder cramlm cannot write (issue 20 item 7): a read-only ``base_dir`` for pretraining or
``out_dir`` for evaluation is one ``Error:`` line naming the folder, before any work, and no
traceback. Read-only is real: a mode-0555 folder, or (as root, whom modes do not stop) a read-only
tmpfs mount."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cramlm.cli import main
from tests.conftest import TINY_PRETRAIN

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def read_only(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    mounted = False
    if os.geteuid() == 0:
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)], capture_output=True)
        if res.returncode != 0:
            pytest.skip("root without mount: no read-only folder to test with")
        mounted = True
    else:
        folder.chmod(0o555)
    try:
        yield folder
    finally:
        if mounted:
            subprocess.run(["umount", str(folder)], capture_output=True)
        else:
            folder.chmod(0o755)


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "cramlm", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def _one_error(res: subprocess.CompletedProcess, folder: Path) -> str:
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and str(folder) in errors[0], res.stderr
    return errors[0]


@pytest.mark.parametrize("where", ["base_dir", "run folder below it"])
def test_read_only_base_dir_is_one_error_naming_the_folder(read_only, tmp_path, where):
    base = read_only if where == "base_dir" else read_only / "sub"
    res = _cli(["pretrain", "name=x", f"base_dir={base}", "dryrun=true", "impl.dryrun_steps=1", *TINY_PRETRAIN], tmp_path)
    line = _one_error(res, base)
    assert "read-only" in line.lower() or "permission" in line.lower()


def test_read_only_out_dir_fails_before_any_fine_tuning(read_only, in_tmp):
    run = CliRunner().invoke(main, ["pretrain", "name=tiny", "dryrun=true", "impl.dryrun_steps=2", *TINY_PRETRAIN])
    assert run.exit_code == 0, run.output
    out = read_only / "results"
    res = _cli(["eval", "checkpoint=tiny", f"out_dir={out}", "eval.epochs=1", "impl.progress=false"], in_tmp)
    _one_error(res, out)
    assert "held-out" not in res.stdout and "fine-tuned" not in res.stdout, res.stdout  # no work done first
