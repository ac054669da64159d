"""Bad values fail when the config is resolved, with one line naming the key (issue 12: items 1, 3,
10, 11, 13): numeric ranges, finite floats, run names, malformed YAML values, optional dependencies."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from cramlm.cli import main
from cramlm.config.extras import check_extras, installed
from cramlm.config.loader import ConfigError, resolve
from cramlm.run.pretrain import DEFAULTS
from cramlm.run.config import PretrainConfig


def pretrain_cfg(*overrides: str) -> PretrainConfig:
    return resolve(PretrainConfig, DEFAULTS, list(overrides))


@pytest.mark.parametrize("override,key", [
    ("train.grad_clip=-1", "train.grad_clip"),  # trained by gradient ascent
    ("train.grad_clip=0", "train.grad_clip"),  # null switches clipping off
    ("train.optim.lr=.inf", "train.optim.lr"),  # wrote a NaN model and exited 0
    ("train.optim.lr=.nan", "train.optim.lr"),
    ("train.optim.lr=0", "train.optim.lr"),
    ("train.optim.lr=-1e-3", "train.optim.lr"),
    ("train.optim.weight_decay=-0.1", "train.optim.weight_decay"),
    ("train.optim.betas=[0.9,1.5]", "train.optim.betas.1"),
    ("train.optim.eps=0", "train.optim.eps"),
    ("train.optim={type: sgd, momentum: -1}", "train.optim.momentum"),
    ("train.schedule={type: cosine, warmup: 1.5}", "train.schedule.warmup"),
    ("train.schedule={type: warmup-stable-decay, warmup: 0.6, decay: 0.6}", "train.schedule"),
    ("train.schedule={type: budget-triangle2, falloff: 0}", "train.schedule.falloff"),
    ("train.mlm_probability=0", "train.mlm_probability"),
    ("train.mlm_probability=1.5", "train.mlm_probability"),
    ("train.batch_ramp=2", "train.batch_ramp"),
    ("train.validate_every=-0.1", "train.validate_every"),
    ("train.log_every=0", "train.log_every"),
    ("train.keep_checkpoints=-1", "train.keep_checkpoints"),
    ("train.checkpoint_minutes=0", "train.checkpoint_minutes"),
    ("train.batch_size=0", "train.batch_size"),  # was `need at least one array to stack`
    ("train.batch_size=12", "train.batch_size=12 must be a multiple of impl.microbatch_size"),
    ("impl.microbatch_size=0", "impl.microbatch_size"),
    ("impl.microbatch_size=-8", "impl.microbatch_size"),
    ("impl.threads=0", "impl.threads"),
    ("impl.dist_timeout=0", "impl.dist_timeout"),
    ("impl.device=gpu", "impl.device"),
    ("arch.hidden_size=0", "arch.hidden_size"),
    ("arch.num_layers=0", "arch.num_layers"),  # redeclared by crammed-bert's config: still checked
    ("arch.num_heads=0", "arch.num_heads"),
    ("arch.dropout=1", "arch.dropout"),
    ("arch.norm_eps=0", "arch.norm_eps"),
    ("arch.max_seq_length=0", "arch.max_seq_length"),
    ("data.seq_length=0", "data.seq_length"),
    ("data.seq_length=1", "data.seq_length"),
    ("data.seq_length=4096", "data.seq_length=4096 exceeds arch.max_seq_length"),
    ("data.validation_fraction=1.5", "data.validation_fraction"),
    ("data.validation_fraction=1", "data.validation_fraction"),
    ("data.validation_fraction=-0.1", "data.validation_fraction"),
    ("data.max_entries_in_raw_dataset=0", "data.max_entries_in_raw_dataset"),
    ("data.tokenizer.vocab_size=.inf", "data.tokenizer.vocab_size"),
    ("budget=.nan", "budget"),
])
def test_out_of_range_values_name_their_key(override, key):
    with pytest.raises(ConfigError) as e:
        pretrain_cfg(override)
    assert f"\n  {key}" in str(e.value), str(e.value)


def test_union_errors_are_one_line():
    with pytest.raises(ConfigError) as e:
        pretrain_cfg("train.batch_size=0")
    lines = str(e.value).splitlines()[1:]
    assert len(lines) == 1 and "'auto'" in lines[0] and lines[0].strip().startswith("train.batch_size:")


@pytest.mark.parametrize("override", [
    "train.grad_clip=null", "train.keep_checkpoints=0", "data.validation_fraction=0", "train.batch_size=auto",
    "train.schedule={type: constant, warmup: 1}", "impl.device=cpu", "impl.device=cuda:1",
])
def test_boundary_values_stay_valid(override):
    pretrain_cfg(override)


@pytest.mark.parametrize("name", ["..", ".", "", "/tmp/x", "a/b", "../x", ".hidden", "-rf", "a b", "x\\y", "a" * 300])
def test_run_name_is_one_safe_folder_name(name):
    with pytest.raises(ConfigError, match=r"\n  name: must be one folder name"):
        pretrain_cfg(f"name='{name}'")


@pytest.mark.parametrize("name", ["..", "a/../../b"])
def test_data_name_cannot_leave_the_cache(name):
    with pytest.raises(ConfigError, match=r"\n  data.name: must be one folder name"):
        pretrain_cfg(f"data.name='{name}'")


@pytest.mark.parametrize("name", ["e2e", "64x2-30s", "bert_24h.v2", "run=3", "x@y,z+1"])
def test_ordinary_run_names_pass(name):
    assert pretrain_cfg(f"name={name}").name == name


def test_unknown_source_key_lists_the_keys_of_that_source_type():
    with pytest.raises(ConfigError) as e:
        pretrain_cfg("data.sources=[{type: jsonl, path: x.jsonl, txt_key: body}]")
    msg = str(e.value)
    assert "data.sources.0.txt_key: unknown key. Did you mean 'data.sources.0.text_key'?" in msg
    assert "Known keys here: on_error, path, text_key, type, weight" in msg
    with pytest.raises(ConfigError, match="Known keys here: on_error, path, split, type, weight"):
        pretrain_cfg("data.sources=[{type: jsonl, path: x}, {type: text, path: y, txt_key: z}]")


@pytest.mark.parametrize("key,ours", [
    ("train.learning_rate", "train.optim.lr"), ("train.max_grad_norm", "train.grad_clip"),
    ("train.max_steps", "train.budget.steps"), ("arch.num_hidden_layers", "arch.num_layers"),
])
def test_hugging_face_names_get_a_hint(key, ours):
    """HF's TrainingArguments / config names are too far from ours for difflib (issue 22.7)."""
    with pytest.raises(ConfigError, match=f"{key}: unknown key. Did you mean '{ours}'\\? \\(.* Hugging Face's name\\)"):
        pretrain_cfg(f"{key}=1")


@pytest.mark.parametrize("key,ours", [
    ("learning_rate", "lr"), ("num_train_epochs", "epochs"), ("per_device_train_batch_size", "batch_size"),
    ("per_device_eval_batch_size", "eval_batch_size"), ("warmup_ratio", "warmup"), ("lr_scheduler_type", "schedule"),
    ("max_eval_samples", "max_dev_examples"),
])
def test_hugging_face_training_arguments_get_the_eval_key(key, ours):
    from cramlm.eval.evaluate import DEFAULTS as EVAL_DEFAULTS, EvalRunConfig

    with pytest.raises(ConfigError, match=f"eval.{key}: unknown key. Did you mean 'eval.{ours}'"):
        resolve(EvalRunConfig, EVAL_DEFAULTS, [f"eval.{key}=1"])


def test_list_items_can_be_overridden_by_index():
    cfg = pretrain_cfg("data.sources.0.text_key=body")
    assert cfg.data.sources[0].text_key == "body"
    with pytest.raises(ConfigError, match="data.sources.0.txt_key: unknown key. Did you mean 'data.sources.0.text_key'"):
        pretrain_cfg("data.sources.0.txt_key=body")
    with pytest.raises(ConfigError, match=r"data.sources.5.path: 'data.sources' is a list of 1; no item '5'"):
        pretrain_cfg("data.sources.5.path=x")


@pytest.mark.parametrize("raw", ["[1,", "{a: 1", "'unclosed", '"unclosed'])
def test_malformed_yaml_value_is_an_error_naming_the_key(raw):
    with pytest.raises(ConfigError, match=r"^data.name: invalid YAML value"):
        pretrain_cfg(f"data.name={raw}")


def test_plain_text_that_is_not_yaml_is_taken_as_written():
    # `*` starts a YAML alias, but a glob is what is meant
    assert pretrain_cfg("data.sources.0.path=corpus/*.jsonl").data.sources[0].path == "corpus/*.jsonl"


@pytest.mark.parametrize("overrides,module,extra", [
    (["impl.tensorboard=true"], "tensorboard", "tensorboard"),
    (["impl.wandb=true"], "wandb", "wandb"),
    (["data.sources=[{type: parquet, path: x.parquet}]"], "pyarrow", "parquet"),
    (["data.sources=[{type: jsonl, path: x.jsonl.zst}]"], "zstandard", "zstd"),
    (["data.dedup.near=true"], "datasketch", "dedup"),
])
def test_missing_optional_dependency_names_key_and_extra(monkeypatch, overrides, module, extra):
    cfg = pretrain_cfg(*overrides)
    if installed(module):
        check_extras(cfg)  # no error while it is there
    monkeypatch.setitem(sys.modules, module, None)  # now `import module` fails
    with pytest.raises(ConfigError) as e:
        check_extras(cfg)
    assert f"needs the `{module}` package: pip install 'cramlm[{extra}]'" in str(e.value)
    assert overrides[0].split("=")[0].split(".")[0] in str(e.value)


def test_missing_tensorboard_stops_pretrain_before_any_work(in_tmp, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    result = CliRunner().invoke(main, ["pretrain", "impl.tensorboard=true", "name=tb", "impl.data_cache=cache"])
    assert result.exit_code == 1
    assert "Error: missing optional dependency:" in result.output
    assert "impl.tensorboard=true needs the `tensorboard` package: pip install 'cramlm[tensorboard]'" in result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, ConfigError)
    assert list(in_tmp.iterdir()) == []  # no data prepared, no run folder


def test_config_show_needs_no_optional_dependency(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    result = CliRunner().invoke(main, ["config", "show", "pretrain", "impl.tensorboard=true"])
    assert result.exit_code == 0 and "tensorboard: true" in result.output


@pytest.mark.parametrize("override,shown", [
    ("impl.microbatch_size=-8", "impl.microbatch_size: Input should be greater than or equal to 1 (got -8)"),
    ("data.validation_fraction=1.5", "data.validation_fraction: Input should be less than 1 (got 1.5)"),
    ("name=..", "name: must be one folder name"),
    ("data.name=[1,", "Error: data.name: invalid YAML value '[1,'"),
    # issue 20 item 11: the key path and an integer as an integer (was "budget steps must be positive, got 0.0")
    ("train.budget.steps=0", "train.budget.steps: Input should be greater than 0 (got 0)"),
    ("train.budget.tokens=-5", "train.budget.tokens: Input should be greater than 0 (got -5)"),
    # the message listed ';' among the allowed characters and did not state the length limit
    ("name=a;b", "at most 200 bytes: letters, digits and the characters . _ - + = @ , starting"),
    ("name=a;b", "';' not allowed (got 'a;b')"),
    ("name=" + "a" * 201, "name: must be one folder name of at most 200 bytes"),
    ("name=" + "a" * 201, "; it is 201 bytes"),
])
def test_cli_prints_one_error_without_traceback(in_tmp, override, shown):
    result = CliRunner().invoke(main, ["pretrain", override])
    assert result.exit_code == 1 and shown in result.output and "Traceback" not in result.output
    assert result.output.startswith("Error:")
    assert list(in_tmp.iterdir()) == []


def test_adafactor_under_fsdp_is_refused_before_any_work(in_tmp):
    """torch's Adafactor cannot step FSDP2's sharded parameters: one line up front, not a traceback
    from the first step of every process."""
    result = CliRunner().invoke(main, ["pretrain", "impl.distributed=fsdp", "train.optim.type=adafactor"])
    assert result.exit_code == 1 and result.output.startswith("Error:") and "Traceback" not in result.output
    assert "train.optim.type=adafactor does not run under impl.distributed=fsdp" in result.output
    assert list(in_tmp.iterdir()) == []
    ok = CliRunner().invoke(main, ["config", "show", "pretrain", "impl.distributed=ddp", "train.optim.type=adafactor"])
    assert ok.exit_code == 0, ok.output


def test_missing_optional_dependency_stops_cramlm_run_before_any_stage(tmp_path, monkeypatch):
    from cramlm.pipeline.recipe import resolve_recipe, run_pipeline

    monkeypatch.setitem(sys.modules, "tensorboard", None)
    cfg = resolve_recipe("default", [f"base_dir={tmp_path}", f"impl.data_cache={tmp_path / 'cache'}", "impl.tensorboard=true"])
    with pytest.raises(ConfigError, match=r"pip install 'cramlm\[tensorboard\]'"):
        run_pipeline(cfg)
    assert list(tmp_path.iterdir()) == []


def test_a_component_type_on_the_command_line_starts_from_that_types_defaults():
    """Issue 20 item 11: `train.schedule.type=constant` alone was refused (the default schedule's
    other keys stayed); keys set before the type change on the command line are kept."""
    from cramlm.run.config import PretrainConfig
    from cramlm.run.pretrain import DEFAULTS

    from cramlm.config.loader import resolve

    default = resolve(PretrainConfig, DEFAULTS, []).train.schedule
    other = "constant" if default.type != "constant" else "cosine"
    cfg = resolve(PretrainConfig, DEFAULTS, [f"train.schedule.type={other}"])
    assert cfg.train.schedule.type == other
    kept = resolve(PretrainConfig, DEFAULTS, ["train.schedule.warmup=0.25", f"train.schedule.type={other}"])
    assert kept.train.schedule.warmup == 0.25
    same = resolve(PretrainConfig, DEFAULTS, [f"train.schedule.type={default.type}"])  # no change: all keys stay
    assert same.train.schedule == default
    src = resolve(PretrainConfig, DEFAULTS, ["data.sources.0.type=text", "data.sources.0.path=x.txt"])
    assert src.data.sources[0].type == "text" and src.data.sources[0].path == "x.txt"
