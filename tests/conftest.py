"""Shared fixtures. Everything runs offline and on CPU, with tiny configs."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# prepared data goes to a per-user cache (~/.cache/cramlm) by default: never the real one in tests
# (each test gets its own below; this covers anything outside a test)
os.environ["CRAMLM_CACHE"] = tempfile.mkdtemp(prefix="cramlm-test-cache-")
atexit.register(shutil.rmtree, os.environ["CRAMLM_CACHE"], ignore_errors=True)

def _find_shared_data() -> Path:
    """$CRAMLM_SHARED_DATA, else the first shared/data folder above the checkout."""
    if os.environ.get("CRAMLM_SHARED_DATA"):
        return Path(os.environ["CRAMLM_SHARED_DATA"])
    for parent in Path(__file__).resolve().parents:
        if (parent / "shared" / "data").is_dir():
            return parent / "shared" / "data"
    return Path("/nonexistent/shared/data")


SHARED_DATA = _find_shared_data()

# overrides that make `cramlm pretrain` tiny and quick (a few seconds on 2 cores)
TINY_PRETRAIN = [
    "arch.hidden_size=32",
    "arch.num_layers=2",
    "arch.num_heads=2",
    "arch.intermediate_size=64",
    "arch.max_seq_length=32",
    "data.seq_length=32",
    "data.tokenizer.vocab_size=512",
    "data.max_entries_in_raw_dataset=20",
    "train.batch_size=8",
    "impl.microbatch_size=8",
    "impl.progress=false",
    "impl.precision=fp32",  # not the machine-dependent auto probe: same numbers everywhere
]


@pytest.fixture(autouse=True)
def _own_data_cache(tmp_path_factory, monkeypatch) -> None:
    """Each test prepares data into its own cache folder (as it did under its own ./outputs)."""
    monkeypatch.setenv("CRAMLM_CACHE", str(tmp_path_factory.mktemp("cramlm-cache")))


@pytest.fixture
def shared_data() -> Path:
    """../shared/data when present (tests using it skip cleanly without it)."""
    if not SHARED_DATA.is_dir():
        pytest.skip("shared/data not available")
    return SHARED_DATA


@pytest.fixture
def fresh_dynamo():
    """torch.compile's caches emptied before and after: a test's compiled frames neither meet earlier
    ones nor stay behind for later tests in the same process."""
    import torch

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    """Run in a fresh temporary working directory (outputs/ lands there)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
