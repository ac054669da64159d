"""Shared fixtures. Everything runs offline and on CPU, with tiny configs."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# impl.precision=auto caches its probe per machine; tests (and the processes they start) use their own
os.environ["CRAMLM_CACHE_DIR"] = tempfile.mkdtemp(prefix="cramlm-test-cache-")

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


@pytest.fixture
def shared_data() -> Path:
    """../shared/data when present (tests using it skip cleanly without it)."""
    if not SHARED_DATA.is_dir():
        pytest.skip("shared/data not available")
    return SHARED_DATA


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    """Run in a fresh temporary working directory (outputs/ lands there)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
