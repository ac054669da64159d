"""What a YAML file may expand to is bounded (issue 20 item 4): an alias bomb ("billion laughs") as an
``arch=`` file or a ``cramlm run`` recipe fails at once with one Error line naming the file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cramlm.config.loader import ConfigError, resolve, safe_load_text
from cramlm.run.config import PretrainConfig
from cramlm.run.pretrain import DEFAULTS


def bomb(levels: int = 14, fanout: int = 9) -> str:
    """A few hundred bytes that expand to fanout**levels values."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * fanout) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fanout) + "]")
    return "\n".join(lines) + f"\nhidden_size: *a{levels}\n"


def test_alias_bomb_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb())
    assert len(path.read_bytes()) < 1000
    with pytest.raises(ConfigError, match=rf"^arch: {path}: YAML expands to more than"):
        resolve(PretrainConfig, DEFAULTS, [f"arch={path}"])


@pytest.mark.parametrize("text,words", [
    ("a: &x [1, *x]\n", "contains it"),  # an alias inside its own anchor
    ("a: " + "[" * 500 + "]" * 500 + "\n", "nested deeper"),
    ("a: " + "[" * 120 + "]" * 120 + "\n", "nested deeper"),
])
def test_recursive_and_deep_yaml_are_refused(text, words):
    with pytest.raises(ConfigError, match=words):
        safe_load_text(text, "x.yaml")


def test_shared_aliases_within_the_bound_still_load():
    # anchors and aliases are fine in a normal config: 3 levels of 3 aliases
    data = safe_load_text(bomb(levels=3, fanout=3), "ok.yaml")
    assert len(data["hidden_size"]) == 3 and data["hidden_size"][0][0][0] == ["lol"] * 3


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cramlm", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_alias_bomb_recipe_and_arch_file_on_the_command_line(tmp_path):
    (tmp_path / "bomb.yaml").write_text(bomb())
    for args in (["run", "bomb.yaml"], ["config", "show", "pretrain", "arch=bomb.yaml"]):
        res = _cli(args, tmp_path)
        assert res.returncode == 1, res.stderr
        assert "Traceback" not in res.stderr
        errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and "bomb.yaml" in errors[0] and "expands to more than" in errors[0], res.stderr


def test_missing_arch_file_says_it_does_not_exist(tmp_path):
    with pytest.raises(ConfigError, match=r"^arch: .*nothere\.yaml does not exist"):
        resolve(PretrainConfig, DEFAULTS, [f"arch={tmp_path / 'nothere.yaml'}"])


def test_a_large_flat_yaml_is_not_called_an_alias_bomb():
    text = "a: [" + ", ".join(["1"] * 100_001) + "]\n"
    with pytest.raises(ConfigError) as e:
        safe_load_text(text, "big.yaml")
    assert "holds more than 100,000 values" in str(e.value) and "alias" not in str(e.value)
