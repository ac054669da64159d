"""`cramlm data ...` end to end on a tiny corpus."""

from __future__ import annotations

import json

from click.testing import CliRunner

from cramlm.cli import main
from cramlm.data.modalities import write_pbin

from .conftest import document, write_jsonl


def _run(*args) -> dict:
    result = CliRunner().invoke(main, ["data", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])  # progress bars go to stderr


def test_data_commands(in_tmp):
    records = [{"text": document(i % 25)} for i in range(30)]
    write_jsonl(in_tmp / "c.jsonl", records)
    common = [f"data.sources=[{{type: jsonl, path: {in_tmp / 'c.jsonl'}}}]", "data.tokenizer.vocab_size=200",
              "data.tokenizer.min_frequency=1", "data.dedup.exact=true", "cache=cache"]
    shard = _run("prepare", "--num-shards", "2", "--shard-index", "1", "--quiet", *common)
    assert shard["shard"] == [1, 2] and shard["read"] == 15
    _run("prepare", "--num-shards", "2", "--shard-index", "0", "--quiet", *common)
    merged = _run("merge", "--num-shards", "2", *common)
    assert merged["read"] == 30 and merged["packed"] == 25 and merged["skipped_reasons"] == {"duplicate": 5}
    again = _run("prepare", "--quiet", *common)  # same config: the cached folder
    assert again["folder"] == merged["folder"]

    stats = _run("inspect", merged["folder"], "--samples", "1")
    assert stats["checksum"] == "ok" and stats["tokenizer_matches"] and stats["samples"][0].startswith("doc0")

    tok = _run("tokenizer", "--out", "tok.json", *common[:3], "data.tokenizer.kind=unigram")
    assert tok["kind"] == "unigram" and (in_tmp / "tok.json").is_file()
    packed = _run("pack", "c.jsonl", "--tokenizer", "tok.json", "--out", "c.cramtok")
    assert packed["packed"] == 30 and (in_tmp / "c.cramtok.manifest.json").is_file()

    index = _run("index", "c.jsonl")
    assert index["lines"] == 30
    dedup = _run("dedup", *common[:1], "--out", "kept.jsonl")
    assert dedup["kept"] == 25 and len((in_tmp / "kept.jsonl").read_text().splitlines()) == 25

    write_pbin(in_tmp / "m.pbin", [[1, 2, 3], [4, 5]])
    conv = _run("convert-modalities", "m.pbin", "m.cramtok", "--tokenizer", "tok.json")
    assert conv["documents"] == 2 and conv["vocab_size"] == tok["vocab_size"]

    bad = CliRunner().invoke(main, ["data", "inspect", "m.pbin"])
    assert bad.exit_code == 1 and "not a cramlm packed-token file" in bad.output
