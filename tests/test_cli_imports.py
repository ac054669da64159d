"""`cramlm --help`, `--version`, config errors and `config show` answer without importing torch,
scipy or scikit-learn (torch: about 2 s of a 2.5 s `--help`, issue 16.4; scipy.stats and
sklearn.metrics through cramlm.eval.metrics: 4.5 s of a 7.75 s import on a loaded machine, issue
22.2). Each case runs in a fresh interpreter, since this test process has long imported all three."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SCRIPT = """
import json, sys
from click.testing import CliRunner
from cramlm.cli import main
result = CliRunner().invoke(main, json.loads(sys.argv[1]))
heavy = [m for m in ("torch", "scipy", "sklearn") if m in sys.modules]
print(json.dumps({"code": result.exit_code, "output": result.output, "heavy": heavy}))
"""

CASES = [
    (["--help"], 0, "pretrain"),
    (["--version"], 0, "version"),
    (["pretrain", "--help"], 0, "Examples"),
    (["pretrain", "train.optim.lrr=1e-3"], 1, "Did you mean 'train.optim.lr'"),
    (["pretrain", "arch=gpt2-tiny", "arch.hidden_sise=8"], 1, "arch.hidden_sise: unknown key"),
    (["eval", "eval.lrr=1e-3"], 1, "Did you mean 'eval.lr'"),
    (["run", "default", "train.optim.lrr=1e-3"], 1, "train.optim.lrr: unknown key"),
    (["data", "prepare", "data.seq_lenght=64"], 1, "data.seq_lenght: unknown key"),
    (["config", "show", "pretrain", "arch=llama-tiny", "train=bert-original"], 0, "type: adam"),
    (["config", "show", "eval"], 0, "protocol"),
    (["config", "show", "eval", "--doc"], 0, "eval.lr"),
    (["config", "show", "pretrain", "budget=45s"], 0, "budget: 45s\n"),  # as written, not 0.0125 (issue 22.7)
    (["run", "--show"], 0, "budget: 1m\n"),
    (["eval", "eval.learning_rate=1e-4"], 1, "Did you mean 'eval.lr'"),  # HF's name (issue 22.7)
]


@pytest.mark.parametrize("args,code,expected", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_cli_answers_without_importing_torch_scipy_sklearn(args, code, expected, tmp_path):
    out = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(args)], capture_output=True, text=True, cwd=tmp_path,
                         check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["code"] == code, result["output"]
    assert expected in result["output"]
    assert not result["heavy"], f"cramlm {' '.join(args)} imported {', '.join(result['heavy'])}"
