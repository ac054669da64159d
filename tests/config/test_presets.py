"""Preset inheritance (`extends:`) and the resolved config of every shipped preset.

``fixtures/resolved_presets.json`` holds the fully resolved config of every preset of every group
and every run recipe, taken before the presets were rewritten to extend each other: rewriting a
preset must not change what it resolves to. After an intended change to a preset, regenerate it
with ``python tests/config/test_presets.py`` and review the diff.
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from cramlm.config.loader import GROUPS, ConfigError, available_presets, load_preset, recipes_dir, resolve

SNAPSHOT = Path(__file__).parent / "fixtures" / "resolved_presets.json"
ENV = ("CRAMLM_DATA_DIR", "CRAMLM_GLUE_DIR")  # recipes interpolate these; the snapshot has their defaults


def resolved(group: str, name: str) -> dict:
    """The resolved config a preset gives: a group preset picked on the command line of the
    command that takes it (eval presets: `cramlm eval`, others: `cramlm pretrain`), a run recipe
    through `cramlm run`."""
    if group == "run":
        from cramlm.pipeline.recipe import resolve_recipe

        return resolve_recipe(name).model_dump(mode="json")
    if group == "eval":
        from cramlm.eval.evaluate import DEFAULTS, EvalRunConfig

        return resolve(EvalRunConfig, DEFAULTS, [f"eval={name}"]).model_dump(mode="json")
    from cramlm.run.pretrain import DEFAULTS
    from cramlm.run.config import PretrainConfig

    return resolve(PretrainConfig, DEFAULTS, [f"{group}={name}"]).model_dump(mode="json")


def all_presets() -> list[tuple[str, str]]:
    return [(group, name) for group in (*GROUPS, "run") for name in available_presets(group)]


def snapshot() -> dict[str, dict]:
    for var in ENV:
        os.environ.pop(var, None)
    return {f"{group}/{name}": resolved(group, name) for group, name in all_presets()}


# ------------------------------------------------------------------ the shipped presets


def test_snapshot_covers_every_preset():
    assert sorted(json.loads(SNAPSHOT.read_text())) == sorted(f"{g}/{n}" for g, n in all_presets())


@pytest.mark.parametrize("preset", [f"{g}/{n}" for g, n in all_presets()])
def test_preset_resolves_as_before(preset, monkeypatch):
    for var in ENV:
        monkeypatch.delenv(var, raising=False)
    expected = json.loads(SNAPSHOT.read_text())[preset]
    assert resolved(*preset.split("/")) == expected


def test_shipped_variants_keep_only_their_differences():
    raw = yaml.safe_load((recipes_dir() / "train" / "bert-o4-cpu.yaml").read_text())
    assert raw["extends"] == "bert-o4" and len(raw) <= 6  # was 29 keys, 4 of them different
    for name in ("crammed-bert-tiny", "crammed-bert-small", "crammed-bert-base", "crammed-bert-large"):
        assert yaml.safe_load((recipes_dir() / "arch" / f"{name}.yaml").read_text())["extends"] == "crammed-bert"


# ------------------------------------------------------------------ extends


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def pretrain(*overrides: str):
    from cramlm.run.pretrain import DEFAULTS
    from cramlm.run.config import PretrainConfig

    return resolve(PretrainConfig, DEFAULTS, list(overrides))


def test_extends_a_shipped_preset_changes_only_its_keys(tmp_path):
    mine = write(tmp_path, "mine.yaml", """\
        extends: bert-o4-cpu   # which extends bert-o4: the chain resolves
        optim: {lr: 3.0e-4}    # same optimizer type: merged, betas etc. kept
        batch_size: 128
        """)
    cfg = pretrain(f"train={mine}")
    base = pretrain("train=bert-o4-cpu")
    assert cfg.train.batch_size == 128 and cfg.train.optim.lr == 3e-4
    assert cfg.train.optim.betas == base.train.optim.betas and cfg.train.optim.eps == base.train.optim.eps
    assert cfg.train.model_dump(exclude={"batch_size", "optim"}) == base.train.model_dump(exclude={"batch_size", "optim"})
    assert pretrain(f"train={mine}", "train.batch_size=192").train.batch_size == 192  # overrides still come last
    assert "extends" not in load_preset("train", str(mine))


def test_another_component_type_replaces_the_base_mapping(tmp_path):
    mine = write(tmp_path, "sgd.yaml", """\
        extends: bert-o4
        optim: {type: sgd, lr: 0.1}
        """)
    optim = load_preset("train", str(mine))["optim"]
    assert optim == {"type": "sgd", "lr": 0.1}  # not adamw's betas/eps, which sgd does not know
    assert pretrain(f"train={mine}").train.optim.momentum == 0.9


def test_extends_a_file_relative_to_the_preset(tmp_path):
    write(tmp_path, "base.yaml", "extends: crammed-bert-tiny\nnum_layers: 3\n")
    (tmp_path / "sub").mkdir()
    child = write(tmp_path / "sub", "child.yaml", "extends: ../base.yaml\nhidden_size: 64\nnum_heads: 2\n")
    arch = pretrain(f"arch={child}").arch
    assert (arch.hidden_size, arch.num_layers, arch.num_heads, arch.intermediate_size) == (64, 3, 2, 512)


def test_extends_cycle_is_an_error_naming_the_files(tmp_path):
    write(tmp_path, "a.yaml", "extends: b.yaml\nbatch_size: 1\n")
    write(tmp_path, "b.yaml", "extends: a.yaml\n")
    with pytest.raises(ConfigError, match=r"train: .*a.yaml: 'extends' makes a cycle: b.yaml -> a.yaml -> b.yaml"):
        pretrain(f"train={tmp_path / 'b.yaml'}")
    write(tmp_path, "self.yaml", "extends: self.yaml\n")
    with pytest.raises(ConfigError, match=r"cycle: self.yaml -> self.yaml"):
        pretrain(f"train={tmp_path / 'self.yaml'}")


def test_extends_an_unknown_base_names_the_file_and_a_close_match(tmp_path):
    mine = write(tmp_path, "mine.yaml", "extends: bert-o5\n")
    with pytest.raises(ConfigError) as e:
        pretrain(f"train={mine}")
    assert str(mine) in str(e.value) and "no preset 'bert-o5'" in str(e.value) and "Did you mean 'bert-o4'" in str(e.value)
    bad = write(tmp_path, "bad.yaml", "extends: [bert-o4]\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: 'extends' must name one preset of 'train'"):
        pretrain(f"train={bad}")


def test_cli_extends_error_is_one_line(tmp_path):
    from click.testing import CliRunner

    from cramlm.cli import main

    write(tmp_path, "a.yaml", "extends: a.yaml\n")
    result = CliRunner().invoke(main, ["config", "show", "pretrain", f"arch={tmp_path / 'a.yaml'}"])
    assert result.exit_code == 1 and result.output.startswith("Error: arch: ") and "cycle" in result.output
    assert "Traceback" not in result.output


def test_run_recipe_extends_another_and_merges_its_overrides(tmp_path, monkeypatch):
    from cramlm.pipeline.recipe import resolve_recipe

    for var in ENV:
        monkeypatch.delenv(var, raising=False)
    mine = write(tmp_path, "mine.yaml", """\
        extends: cpu-1h
        budget: 2h
        overrides:
          train.batch_size: 128
        """)
    cfg, base = resolve_recipe(str(mine)), resolve_recipe("cpu-1h")
    assert cfg.budget == 2 and cfg.train.batch_size == 128 and cfg.name == "mine"  # its own name (the file's), never the base's folder
    assert cfg.eval.max_train_examples == base.eval.max_train_examples == 4000 and cfg.data.name == "shared-corpus"  # the base's overrides kept


@pytest.mark.parametrize("recipe", available_presets("run"))
def test_run_recipes_hold_only_their_real_differences(recipe, monkeypatch):
    """Every override of a shipped run recipe changes its resolved config: none restates what its
    presets already give (cpu-1h restated 10 preset values and rebuilt the shared corpus inline); a
    recipe that extends another holds only what differs from that recipe (its overrides replace the
    base's same keys, so each is checked against what the base resolves to)."""
    from cramlm.pipeline.recipe import PipelineConfig, recipe_tree, resolve_recipe
    from cramlm.train.checkpoint import flat

    for var in ENV:
        monkeypatch.delenv(var, raising=False)
    raw = yaml.safe_load((recipes_dir() / "run" / f"{recipe}.yaml").read_text())
    if "extends" in raw:
        base = flat(resolve_recipe(raw["extends"]).model_dump(mode="json"))
        for key, value in flat(raw.get("overrides") or {}).items():
            assert base.get(key) != value, f"run/{recipe}.yaml: override {key} restates {raw['extends']}'s value"
        return
    tree, overrides = recipe_tree(recipe)
    full = resolve(PipelineConfig, copy.deepcopy(tree), overrides).model_dump(mode="json")
    for i, override in enumerate(overrides):
        without = resolve(PipelineConfig, copy.deepcopy(tree), overrides[:i] + overrides[i + 1:]).model_dump(mode="json")
        assert without != full, f"run/{recipe}.yaml: override {override.partition('=')[0]} restates its preset's value"


def test_cpu_1h_trains_on_the_shared_corpus_preset():
    raw = yaml.safe_load((recipes_dir() / "run" / "cpu-1h.yaml").read_text())
    assert raw["data"] == "shared-corpus" and not any(key.startswith("data.") for key in raw["overrides"])


def header(path: Path) -> list[str]:
    """A recipe's header: its comment lines before its first key."""
    lines = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            break
        lines += [line] if line.startswith("#") else []
    return lines


@pytest.mark.parametrize("recipe", available_presets("run"))
def test_a_run_recipe_says_what_it_is_for_in_ten_lines(recipe):
    """A run recipe's header says what it is for and why in at most 10 lines; its history (each
    change and its measured gain) is docs/results.md's."""
    lines = header(recipes_dir() / "run" / f"{recipe}.yaml")
    assert 0 < len(lines) <= 10, f"run/{recipe}.yaml: a header of {len(lines)} comment lines (at most 10)"


@pytest.mark.parametrize("path", sorted(recipes_dir().glob("*/*.yaml")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_no_recipe_header_carries_a_date(path):
    """A recipe says what it is, not when it changed (dates and histories go to docs/results.md)."""
    dated = [line for line in header(path) if re.search(r"\b\d{4}-\d{2}-\d{2}\b", line)]
    assert not dated, f"{path.parent.name}/{path.name}: a dated header line: {dated[0]}"


if __name__ == "__main__":  # regenerate the snapshot
    SNAPSHOT.write_text(json.dumps(snapshot(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}", file=sys.stderr)
