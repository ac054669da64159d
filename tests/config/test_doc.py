"""`cramlm config show COMMAND --doc`: each key with its type, default and the field's description."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from cramlm.cli import main
from cramlm.config.doc import describe, type_name
from cramlm.config.loader import resolve
from cramlm.run.pretrain import DEFAULTS
from cramlm.run.config import PretrainConfig
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


def config_classes(root: type, seen: set | None = None) -> set:
    """Every config class reachable from ``root``: its fields' types, and for a component slot every
    class registered under that kind (a plugin's classes are not walked: they are not ours)."""
    import typing

    from pydantic import BaseModel

    from cramlm.config import registry
    from cramlm.config.base import ComponentConfig

    seen = set() if seen is None else seen

    def visit(annotation):
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if issubclass(annotation, ComponentConfig) and annotation.kind:
                for name in registry.names(annotation.kind):
                    config_classes(registry.config_class(annotation.kind, name), seen)
            config_classes(annotation, seen)
        for arg in typing.get_args(annotation):
            visit(arg)

    if root not in seen:
        seen.add(root)
        for field in root.model_fields.values():
            visit(field.annotation)
    return seen


def test_every_field_of_every_config_root_has_a_description():
    from cramlm.config.doc import description
    from cramlm.data.prepare import PrepareConfig
    from cramlm.eval.evaluate import EvalRunConfig
    from cramlm.pipeline.recipe import PipelineConfig

    classes = set()
    for root in (PretrainConfig, EvalRunConfig, PrepareConfig, PipelineConfig):  # pretrain, eval, data, run
        config_classes(root, classes)
    names = {c.__name__ for c in classes}
    assert {"CrammedBertConfig", "LlamaConfig", "LionConfig", "PolynomialConfig", "HFSourceConfig", "TaskSpec",
            "Columns", "HparamsOverride", "BudgetConfig", "TokenizerConfig", "DedupConfig"} <= names  # the walk is deep
    ours = [c for c in classes if c.__module__.startswith("cramlm.")]  # other tests register plugins of their own
    missing = sorted(f"{c.__module__}.{c.__name__}.{n}" for c in ours for n in c.model_fields if not description(c, n))
    assert not missing, f"{len(missing)} config fields without Field(description=...): {missing}"


def test_config_show_doc_describes_every_key_of_every_command_and_recipe():
    from cramlm.pipeline.recipe import resolve_recipe

    for command in ("pretrain", "eval", "data"):
        result = CliRunner().invoke(main, ["config", "show", command, "--doc"])
        assert result.exit_code == 0, result.output
        keys = [line for line in result.output.splitlines() if not line.startswith("    ")]
        described = [line for line in result.output.splitlines() if line.startswith("    ")]
        assert keys and len(described) == len(keys), (command, set(keys) - set(described))
    for recipe in ("default", "cpu-1h", "gpt2-60m"):
        undocumented = [d.key for d in describe(resolve_recipe(recipe)) if not d.description]
        assert not undocumented, (recipe, undocumented)
