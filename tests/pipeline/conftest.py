"""Fixtures of the pipeline tests: one tiny end-to-end `cramlm run`, shared by the tests that
only read its outputs (it takes ~15 s on 2 cores)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cramlm.cli import main

# the default recipe shrunk to seconds: tiny model, 20 documents, 3-second budget, 64 fine-tuning examples,
# 16 minimal pairs per paradigm
TINY_RUN = [
    "arch.hidden_size=32", "arch.num_layers=2", "arch.num_heads=2", "arch.intermediate_size=64",
    "arch.max_seq_length=64", "data.seq_length=32", "data.tokenizer.vocab_size=512",  # 64: the longest demo pair fits
    "data.max_entries_in_raw_dataset=20", "train.batch_size=8", "impl.microbatch_size=8",
    "train.log_every=2", "impl.progress=false", "impl.threads=1", "impl.precision=fp32", "budget=3s",
    "eval.epochs=1", "eval.max_train_examples=64", "eval.max_seq_length=32", "eval.minimal_pairs.max_pairs=16",
    "impl.data_cache=data-cache",  # beside outputs/ (not the per-user cache): a copied run tree takes it along
]


def cramlm(*args: str, cwd: Path) -> str:
    """Run the CLI in ``cwd``; returns its output, fails the test on a non-zero exit."""
    import os

    old = os.getcwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    finally:
        os.chdir(old)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """A finished `cramlm run` of the default recipe at tiny size: its run folder."""
    root = tmp_path_factory.mktemp("tiny_run")
    cramlm("run", "default", *TINY_RUN, cwd=root)
    return root / "outputs" / "default"
