"""Config system: presets, overrides, and errors that name the exact key path."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from cramlm.config.loader import ConfigError, available_presets, resolve
from cramlm.config.registry import names
from cramlm.run.pretrain import DEFAULTS
from cramlm.run.config import PretrainConfig


def pretrain_cfg(*overrides: str) -> PretrainConfig:
    return resolve(PretrainConfig, DEFAULTS, list(overrides))


def test_defaults_resolve_to_tiny_minute_run():
    cfg = pretrain_cfg()
    assert cfg.arch.type == "crammed-bert" and cfg.arch.hidden_size < 768
    assert cfg.budget == pytest.approx(1 / 60)
    assert cfg.train.optim.type == "adamw"


def test_group_selection_and_overrides():
    cfg = pretrain_cfg("train.optim.lr=1e-4", "arch=crammed-bert", "train=bert-o4", "budget=24", "name=x")
    assert (cfg.arch.hidden_size, cfg.arch.num_layers) == (768, 16)
    assert cfg.train.batch_size == 8192 and cfg.train.optim.lr == 1e-4  # override wins over the later group pick
    assert cfg.budget == 24 and cfg.name == "x"


@pytest.mark.parametrize("text,hours", [("90s", 0.025), ("2m", 2 / 60), ("1.5h", 1.5), ("0.5", 0.5)])
def test_budget_units(text, hours):
    assert pretrain_cfg(f"budget={text}").budget == pytest.approx(hours)


def test_unknown_key_names_path_and_close_match():
    with pytest.raises(ConfigError) as e:
        pretrain_cfg("train.optim.lrr=1e-3")
    assert "train.optim.lrr: unknown key" in str(e.value)
    assert "Did you mean 'train.optim.lr'" in str(e.value)


def test_unknown_top_level_key():
    with pytest.raises(ConfigError, match=r"budgt: unknown key\. Did you mean 'budget'"):
        pretrain_cfg("budgt=3")


def test_wrong_type_names_path():
    with pytest.raises(ConfigError) as e:
        pretrain_cfg("arch.num_layers=many")
    assert "arch.num_layers:" in str(e.value) and "'many'" in str(e.value)


def test_invalid_literal_and_negative_budget():
    with pytest.raises(ConfigError, match="arch.norm_scheme"):
        pretrain_cfg("arch.norm_scheme=sideways")
    with pytest.raises(ConfigError, match="budget: must be positive"):
        pretrain_cfg("budget=-1")


def test_missing_group_preset_lists_available():
    with pytest.raises(ConfigError) as e:
        pretrain_cfg("train=bert-o5")
    msg = str(e.value)
    assert "train: no preset 'bert-o5'" in msg and "bert-o4" in msg


def test_unknown_component_type():
    with pytest.raises(ConfigError, match="arch: unknown model type 'crammed-bret'.*Did you mean 'crammed-bert'"):
        pretrain_cfg("arch.type=crammed-bret")
    # nothing close: a plugin's type whose module was not named in plugins=[...]
    # (a name close to none, whatever plugins other test modules registered at collection)
    with pytest.raises(ConfigError, match=r"train.objective: unknown objective type 'quokka'; registered: .*"
                       r"A plugin's type is registered once its module is imported: plugins=\[my_module\]"):
        pretrain_cfg("train.objective=quokka")


def test_preset_from_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("type: crammed-bert\nhidden_size: 64\nnum_layers: 1\nnum_heads: 2\nintermediate_size: 128\n")
    assert pretrain_cfg(f"arch={path}").arch.hidden_size == 64


def test_interpolation_between_keys():
    cfg = pretrain_cfg("arch.max_seq_length=${data.seq_length}", "data.seq_length=64")
    assert cfg.arch.max_seq_length == 64


def test_every_shipped_preset_validates():
    for group in ("arch", "train", "data", "impl"):
        for name in available_presets(group):
            pretrain_cfg(f"{group}={name}")


def test_plugin_registers_a_model_without_editing_cramlm(tmp_path, monkeypatch):
    (tmp_path / "my_plugin.py").write_text(textwrap.dedent('''
        from typing import Literal
        import torch
        from cramlm.config import register
        from cramlm.models.base import ModelConfig

        class BagConfig(ModelConfig):
            type: Literal["bag"] = "bag"
            width: int = 8

        @register("model", "bag", BagConfig)
        def build_bag(cfg, vocab_size):
            return torch.nn.EmbeddingBag(vocab_size, cfg.width)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = pretrain_cfg("plugins=[my_plugin]", "arch={type: bag, width: 4}")
    assert type(cfg.arch).__name__ == "BagConfig" and cfg.arch.width == 4
    assert "bag" in names("model")
    assert cfg.model_dump()["arch"]["width"] == 4  # the concrete class is dumped, not the base


def test_cli_config_show_and_error_exit_code(in_tmp):
    ok = subprocess.run([sys.executable, "-m", "cramlm", "config", "show", "pretrain", "train.optim.lr=3e-4"],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and "lr: 0.0003" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "cramlm", "config", "show", "pretrain", "arch.hiden_size=3"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "arch.hiden_size: unknown key" in bad.stderr


def test_plugins_are_documented_as_trusted_code():
    """Issue 20 item 12: a plugin module runs on import; the README, `--help` and the field say so."""
    from pathlib import Path

    from click.testing import CliRunner

    from cramlm.cli import main
    from cramlm.run.config import PretrainConfig

    for command in ("pretrain", "eval"):
        out = CliRunner().invoke(main, [command, "--help"]).output
        assert "trusted code" in " ".join(out.split()), out
    assert "trusted code" in PretrainConfig.model_fields["plugins"].description
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "Plugins are trusted code" in readme


def test_a_plugin_that_cannot_be_imported_is_an_error_line(in_tmp):
    """plugins=[...] or CRAMLM_PLUGINS naming a module that is not importable (not on PYTHONPATH,
    a typo): one Error: line naming it, for every command that takes plugins, never a traceback."""
    import os

    from click.testing import CliRunner

    from cramlm.cli import main

    for command in (["data", "prepare"], ["pretrain"], ["eval"], ["config", "show", "pretrain"]):
        result = CliRunner().invoke(main, [*command, "plugins=[no_such_plugin_module]"])
        assert result.exit_code == 1 and isinstance(result.exception, SystemExit), (command, result.exception)
        assert "Error: plugins: cannot import 'no_such_plugin_module'" in result.output, (command, result.output)
    result = CliRunner().invoke(main, ["config", "show", "data", "plugins=my_plugin"])  # not a list: not its letters
    assert result.exit_code == 1 and "plugins: a list of module names" in result.output, result.output
    env = dict(os.environ, CRAMLM_PLUGINS="no_such_plugin_module")
    proc = subprocess.run([sys.executable, "-m", "cramlm", "config", "show", "data"], capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "Error: plugins: cannot import 'no_such_plugin_module'" in proc.stderr, proc.stderr


def test_a_plugin_config_class_of_the_wrong_base_is_refused_when_registered(tmp_path, monkeypatch):
    """A source config subclassing ComponentConfig (not SourceConfig) was refused only when a config
    used it, as 'Input should be a valid dictionary or instance of SourceConfig'; registering it now
    names the base class to subclass, and the command that imports the plugin says it in one line."""
    from click.testing import CliRunner

    from cramlm.cli import main
    from cramlm.config.registry import BASES, RegistryError, register
    from cramlm.config.base import ComponentConfig

    class Plain(ComponentConfig):
        type: str = "plain"

    with pytest.raises(RegistryError, match=r"source 'plain': its config class Plain must subclass cramlm.data.sources.SourceConfig"):
        register("source", "plain", Plain)(lambda cfg, report: iter(()))
    for kind, base in BASES.items():  # every base is where the table says
        module, name = base.rsplit(".", 1)
        assert getattr(__import__(module, fromlist=[name]), name).__name__ == name
    (tmp_path / "wrong_base_plugin.py").write_text(textwrap.dedent('''
        from cramlm.config import ComponentConfig, register

        class CsvConfig(ComponentConfig):
            type: str = "csv-wrong-base"

        @register("source", "csv-wrong-base", CsvConfig)
        def read(cfg, report):
            yield from ()
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(main, ["config", "show", "data", "plugins=[wrong_base_plugin]"])
    assert result.exit_code == 1 and "must subclass cramlm.data.sources.SourceConfig" in result.output, result.output
