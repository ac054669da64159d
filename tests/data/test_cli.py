"""`cramlm data ...` end to end on a tiny corpus."""

from __future__ import annotations

import json

import pytest

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


def _huge_int_pbin(path):
    """A .pbin whose index holds a 5000-digit integer (Python refuses to print it)."""
    import pickle

    write_pbin(path, [[1, 2, 3], [4, 5]])
    data = path.read_bytes()
    path.write_bytes(data[: 12 + 10] + pickle.dumps([(0, 10**5000), (6, 4)]))


BAD_INPUTS = {  # arguments -> what the one Error: line must name
    "missing tokenizer": (["convert-modalities", "m.pbin", "o.cramtok", "--tokenizer", "/missing.json"], "/missing.json"),
    "binary tokenizer": (["convert-modalities", "m.pbin", "o.cramtok", "--tokenizer", "junk.bin"], "junk.bin"),
    "huge int in .pbin index": (["convert-modalities", "huge.pbin", "o.cramtok"], "huge.pbin"),
    "vocab size 0": (["convert-modalities", "m.pbin", "o.cramtok", "--vocab-size", "0"], "--vocab-size"),
    "out in a missing folder": (["convert-modalities", "m.pbin", "nowhere/o.cramtok"], "nowhere"),
    "pack, binary tokenizer": (["pack", "c.jsonl", "--tokenizer", "junk.bin", "--out", "x.cramtok"], "junk.bin"),
    "pack, out in a missing folder": (["pack", "c.jsonl", "--tokenizer", "tok.json", "--out", "nowhere/x.cramtok"], "nowhere"),
    "tokenizer, out in a missing folder": (["tokenizer", "--out", "nowhere/tok.json", "data.max_entries_in_raw_dataset=3"], "nowhere"),
    "index, out in a missing folder": (["index", "c.jsonl", "--out", "nowhere/i.npy"], "nowhere"),
    "dedup, out in a missing folder": (["dedup", "--out", "nowhere/d.jsonl", "data.max_entries_in_raw_dataset=3"], "nowhere"),
    "inspect, not a prepared folder": (["inspect", "."], "not a prepared data folder"),
    # an output is never one of the inputs (dedup emptied its corpus; pack, convert and index replaced theirs)
    "dedup, out is its source": (["dedup", "--out", "c.jsonl", "data.sources=[{type: jsonl, path: c.jsonl}]"],
                                 "c.jsonl: is a file this command reads (c.jsonl)"),
    "pack, out is its input": (["pack", "c.jsonl", "--tokenizer", "tok.json", "--out", "c.jsonl"], "c.jsonl: is a file this command reads"),
    "pack, out is its tokenizer": (["pack", "c.jsonl", "--tokenizer", "tok.json", "--out", "tok.json"], "tok.json: is a file"),
    "pack, out inside a folder input": (["pack", ".", "--tokenizer", "tok.json", "--out", "c.jsonl"], "c.jsonl: is a file this command reads (.)"),
    "convert, out is its input": (["convert-modalities", "m.pbin", "m.pbin"], "m.pbin: is a file this command reads"),
    "index, out is its input": (["index", "c.jsonl", "--out", "c.jsonl"], "c.jsonl: is a file this command reads"),
    "tokenizer, out is a source": (["tokenizer", "--out", "c.jsonl", "data.sources=[{type: jsonl, path: c.jsonl}]"],
                                   "c.jsonl: is a file this command reads"),
    "prepare, 0 shards": (["prepare", "--num-shards", "0"], "--num-shards"),
    "prepare, binary tokenizer": (["prepare", "data.tokenizer.path=junk.bin", "cache=cache"], "junk.bin"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_inputs_give_one_error_line(in_tmp, case):
    """Issue 12.10 (data): a missing or corrupt input is one `Error:` line naming it, never a
    traceback (CliRunner keeps an uncaught exception in result.exception)."""
    args, named = BAD_INPUTS[case]
    write_jsonl(in_tmp / "c.jsonl", [{"text": document(i)} for i in range(5)])
    write_pbin(in_tmp / "m.pbin", [[1, 2, 3], [4, 5]])
    _huge_int_pbin(in_tmp / "huge.pbin")
    (in_tmp / "junk.bin").write_bytes(bytes(range(256)) * 4)
    from cramlm.data.tokenizer import TokenizerConfig, train_tokenizer

    train_tokenizer(TokenizerConfig(vocab_size=100, min_frequency=1), [document(i) for i in range(5)]).save("tok.json")
    result = CliRunner().invoke(main, ["data", *args])
    assert result.exit_code in (1, 2) and isinstance(result.exception, SystemExit), result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and named in errors[0], result.output
    assert not (in_tmp / "o.cramtok").exists()
    assert (in_tmp / "c.jsonl").read_text().count("\n") == 5 and (in_tmp / "m.pbin").read_bytes()[:8] != b"CRAMTOK\0"
