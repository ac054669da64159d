"""`cramlm config show COMMAND --doc`: each key with its type, default and the field's description."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from cramlm.cli import main
from cramlm.config.doc import describe, type_name
from cramlm.config.loader import resolve
from cramlm.pretrain import DEFAULTS, PretrainConfig
from cramlm.train.config import TrainConfig
from cramlm.train.impl import ImplConfig


def docs(*overrides: str) -> dict:
    return {d.key: d for d in describe(resolve(PretrainConfig, DEFAULTS, list(overrides)))}


def test_every_leaf_key_with_type_default_value_and_description():
    d = docs()
    batch = d["train.batch_size"]
    assert (batch.type, batch.default, batch.value) == ("int >= 1 | auto", "8192", 64)
    assert batch.description == "sequences per optimizer step, all processes together"
    assert d["train.grad_clip"].type == "float > 0 | null"
    assert d["impl.precision"].type == "auto | fp32 | bf16 | fp16"
    assert d["impl.microbatch_size"].description.startswith("sequences per forward/backward per process")
    assert d["data.seq_length"].type == "int >= 2" and "tokens per sequence" in d["data.seq_length"].description
    assert d["budget"].description.startswith("wall-clock hours of training")
    assert d["data.sources.0.path"].default == "required"  # list items of components are walked too
    assert "train.optim" not in d and "train.optim.lr" in d  # leaves only


def test_components_are_described_by_the_class_their_type_picks():
    d = docs("arch=llama-tiny", "train=bert-original")
    assert d["arch.intermediate_size"].description == "gate + up halves, 2 x 2048"  # LlamaConfig's own
    assert d["arch.intermediate_size"].default == "4096"
    assert d["train.optim.type"].type == "adam" and "train.optim.fused" in d
    assert d["train.schedule.type"].value == "polynomial"
    # a subclass that only changes a default keeps its base class's description
    bert = docs("arch=crammed-bert")
    assert bert["arch.embedding_norm"].default == "true"
    assert bert["arch.embedding_norm"].description == "a norm right after token + position embedding"


def test_the_commented_fields_of_the_main_classes_are_documented():
    for cls, names in ((TrainConfig, ["budget", "batch_ramp", "min_updates", "on_nonfinite", "max_nonfinite"]),
                       (ImplConfig, ["device", "data_cache", "compile", "distributed", "dist_timeout", "wandb"])):
        for name in names:
            assert cls.model_fields[name].description, f"{cls.__name__}.{name}"


def test_type_names():
    from typing import Literal

    from cramlm.config.base import PositiveInt, UnitFloat

    assert type_name(PositiveInt | None) == "int >= 1 | null"
    assert type_name(UnitFloat) == "float >= 0, <= 1"
    assert type_name(list[str]) == "list[str]"
    assert type_name(Literal["a", "b"]) == "a | b"


def test_cli_config_show_doc():
    result = CliRunner().invoke(main, ["config", "show", "pretrain", "--doc", "train.batch_size=128"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    at = lines.index("train.batch_size: 128  # int >= 1 | auto; default: 8192")
    assert lines[at + 1] == "    sequences per optimizer step, all processes together"
    assert 'budget: "1m"' in result.output  # the value as `config show` writes it
    plain = CliRunner().invoke(main, ["config", "show", "pretrain"])
    assert "sequences per optimizer step" not in plain.output and "batch_size: 64" in plain.output


def test_config_show_doc_imports_no_torch(tmp_path):
    script = ("import sys; from click.testing import CliRunner; from cramlm.cli import main; "
              "r = CliRunner().invoke(main, ['config', 'show', 'eval', '--doc']); "
              "print(r.exit_code, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert out.stdout.split() == ["0", "False"], out.stdout + out.stderr
