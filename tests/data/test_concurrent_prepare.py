"""Two `cramlm data prepare` of one config into one cache at once: both succeed with one cache entry
(issue 39 item 6: the first to merge used to remove the other's shard in progress)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_two_concurrent_prepares_of_one_config_both_succeed(tmp_path):
    cache = tmp_path / "cache"
    # the whole shipped corpus: packing takes long enough that the two preparations overlap
    args = [sys.executable, "-m", "cramlm", "data", "prepare", f"cache={cache}", "data.tokenizer.vocab_size=512",
            "--quiet"]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, (out, err)
    entries = [p.name for p in cache.iterdir()]  # no lock file, shards or temporary folder left either
    assert len(entries) == 1 and (cache / entries[0] / "manifest.json").is_file(), entries
    assert not [p.name for p in cache.iterdir() if p.name.endswith(".shards") or ".tmp-" in p.name]
