"""Nothing lost: every record is packed or counted as skipped with its reason."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cramlm.cli import main
from cramlm.data.prepare import prepare_data
from cramlm.data.sources import DataError

from .conftest import document, tiny_data, write_jsonl


def _counts_add_up(m: dict) -> None:
    d = m["documents"]
    assert d["read"] == d["packed"] + d["skipped"] == d["packed"] + sum(m["skipped"].values())
    assert d["packed"] == m["train"]["documents"] + m["val"]["documents"]


def test_one_empty_document_in_100(tmp_path):
    records = [{"text": document(i)} for i in range(100)]
    records[37]["text"] = "   \n "
    path = write_jsonl(tmp_path / "c.jsonl", records)
    prepared = prepare_data(tiny_data([{"type": "jsonl", "path": str(path)}], validation_fraction=0.1), tmp_path / "cache", progress=False)
    m = prepared.manifest
    assert m["documents"] == {"read": 100, "packed": 99, "skipped": 1}
    assert m["skipped"] == {"empty": 1}
    assert m["skipped_examples"]["empty"] == [f"{path}:38"]
    _counts_add_up(m)
    assert prepared.train.num_documents + prepared.val.num_documents == 99


def test_every_reason_is_counted_with_its_place(tmp_path):
    records = [{"text": document(i)} for i in range(20)]
    records[3] = {"body": "no text key"}
    records[5] = {"text": document(0)}  # exact duplicate of record 0
    records[6] = {"text": "x"}  # too short
    path = write_jsonl(tmp_path / "c.jsonl", records, {8: b'{"text": "broken', 9: b'{"text": "\xff\xfe"}'})
    cfg = tiny_data([{"type": "jsonl", "path": str(path), "on_error": "skip"}],
                    clean={"min_chars": 5}, dedup={"exact": True})
    m = prepare_data(cfg, tmp_path / "cache", progress=False).manifest
    assert m["skipped"] == {"missing_field": 1, "invalid_json": 1, "invalid_utf8": 1, "too_short": 1, "duplicate": 1}
    assert m["skipped_examples"]["invalid_json"] == [f"{path}:9"]
    assert m["skipped_examples"]["invalid_utf8"] == [f"{path}:10"]
    assert m["skipped_examples"]["duplicate"] == ["record 5"]
    assert m["documents"]["read"] == 20 and m["documents"]["packed"] == 15
    _counts_add_up(m)


def test_bad_record_stops_the_run_unless_skip_is_chosen(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "c.jsonl", [{"text": document(i)} for i in range(10)], {4: b"{not json"})
    with pytest.raises(DataError, match=f"{path}:5: invalid JSON"):
        prepare_data(tiny_data([{"type": "jsonl", "path": str(path)}]), tmp_path / "cache", progress=False)
    assert not list((tmp_path / "cache").glob("t-*/manifest.json"))  # nothing half-written under a final name
    monkeypatch.chdir(tmp_path)
    sources = json.dumps([{"type": "jsonl", "path": str(path)}])
    result = CliRunner().invoke(main, ["data", "prepare", f"data.sources={sources}", "data.tokenizer.vocab_size=200"])
    assert result.exit_code == 1 and f"{path}:5: invalid JSON" in result.output


def test_lone_surrogate_is_invalid_text_not_a_tokenizer_crash(tmp_path):
    """JSON can spell a lone surrogate ("\\ud800"); tokenizers raised a TypeError on it."""
    path = write_jsonl(tmp_path / "c.jsonl", [{"text": document(i)} for i in range(6)],
                       {2: b'{"text": "bad \\ud800 here"}', 3: b'{"text": "a pair \\ud83d\\ude00 is fine"}'})
    with pytest.raises(DataError, match=f"{path}:3: lone surrogate"):
        prepare_data(tiny_data([{"type": "jsonl", "path": str(path)}]), tmp_path / "cache", progress=False)
    m = prepare_data(tiny_data([{"type": "jsonl", "path": str(path), "on_error": "skip"}]), tmp_path / "cache", progress=False).manifest
    assert m["skipped"] == {"invalid_utf8": 1} and m["documents"]["packed"] == 5


def test_cap_on_raw_entries_counts_only_what_was_read(corpus, tmp_path):
    m = prepare_data(tiny_data([{"type": "jsonl", "path": str(corpus)}], max_entries_in_raw_dataset=30),
                     tmp_path / "cache", progress=False).manifest
    assert m["documents"] == {"read": 30, "packed": 30, "skipped": 0}


def test_damaged_compressed_file_is_a_clear_error(tmp_path):
    import gzip

    raw = gzip.compress(b"".join(b'{"text": "%s"}\n' % document(i).encode() for i in range(200)))
    path = tmp_path / "c.jsonl.gz"
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError, match=f"{path}: cannot read"):
        prepare_data(tiny_data([{"type": "jsonl", "path": str(path)}]), tmp_path / "cache", progress=False)
    # on_error: skip keeps what was readable and names the file as a skipped source (issue 20 item 9)
    skipped = prepare_data(tiny_data([{"type": "jsonl", "path": str(path), "on_error": "skip"}]), tmp_path / "cache",
                           progress=False).manifest["skipped_sources"]
    assert [s["path"] for s in skipped] == [str(path)] and "cannot read" in skipped[0]["reason"]


def test_the_data_stage_does_not_import_torch(tmp_path):
    """Keeps `cramlm data` light (torch alone is ~180 MB of resident memory)."""
    import subprocess
    import sys

    code = ("import sys; from cramlm.data.prepare import DataConfig, prepare_data; "
            f"prepare_data(DataConfig(tokenizer={{'vocab_size': 300}}, max_entries_in_raw_dataset=5), {str(tmp_path)!r}, progress=False); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_damaged_cached_manifest_names_the_file(tmp_path):
    cfg = tiny_data([{"type": "jsonl", "path": str(write_jsonl(tmp_path / "c.jsonl", [{"text": document(i)} for i in range(5)]))}])
    folder = prepare_data(cfg, tmp_path / "cache", progress=False).folder
    (folder / "manifest.json").write_text('{"documents": ')
    with pytest.raises(ValueError, match=f"{folder / 'manifest.json'}: unreadable"):
        prepare_data(cfg, tmp_path / "cache", progress=False)


def test_a_cache_is_never_reused_for_other_input_files(tmp_path, monkeypatch, capsys):
    """The cache is keyed by the config, and the manifest lists the files read (by their place under
    their source, with sizes and times): the same relative path read from another folder, a file
    changed, added or removed is refused, naming it; a corpus moved whole is the same input; a file
    only modified (same size) is said in a line."""
    import os
    import shutil

    for name, word in (("a", "alpha"), ("b", "beta-longer")):
        (tmp_path / name).mkdir()
        write_jsonl(tmp_path / name / "c.jsonl", [{"text": f"{word} " + document(i)} for i in range(8)])
    cfg = tiny_data([{"type": "jsonl", "path": "c.jsonl"}])
    monkeypatch.chdir(tmp_path / "a")
    a = prepare_data(cfg, tmp_path / "cache", progress=False)
    assert [f["input"] for f in a.manifest["inputs"]] == ["0:c.jsonl"]
    assert a.manifest["inputs"][0]["path"] == str((tmp_path / "a" / "c.jsonl").resolve())
    monkeypatch.chdir(tmp_path / "b")
    with pytest.raises(DataError, match=r"prepared from other files than data.sources reads now \(changed size: .*b/c.jsonl\); remove"):
        prepare_data(cfg, tmp_path / "cache", progress=False)  # was: b trained on a's tokens
    shutil.copytree(tmp_path / "a", tmp_path / "moved", copy_function=shutil.copy2)  # the same corpus elsewhere
    monkeypatch.chdir(tmp_path / "moved")
    assert prepare_data(cfg, tmp_path / "cache", progress=False).folder == a.folder

    monkeypatch.chdir(tmp_path / "a")
    source = tmp_path / "a" / "c.jsonl"
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched, same text
    capsys.readouterr()
    assert prepare_data(cfg, tmp_path / "cache", progress=False).folder == a.folder
    said = capsys.readouterr()
    assert "c.jsonl was modified since" in said.err and not said.out  # (stdout: cramlm data prepare's JSON)
    with source.open("a") as f:
        f.write(json.dumps({"text": "alpha " + document(99)}) + "\n")
    with pytest.raises(DataError, match=r"\(changed size: .*a/c.jsonl\)"):
        prepare_data(cfg, tmp_path / "cache", progress=False)
    # a run resuming from a checkpoint goes on with the cache's tokens (its checkpoint pins them): said, not refused
    assert prepare_data(cfg, tmp_path / "cache", progress=False, resuming=True).folder == a.folder
    assert "the run resumed goes on with the cache's tokens" in capsys.readouterr().err

    folder_cfg = tiny_data([{"type": "jsonl", "path": str(tmp_path / "b")}])
    prepare_data(folder_cfg, tmp_path / "cache", progress=False)
    write_jsonl(tmp_path / "b" / "d.jsonl", [{"text": document(50)}])
    with pytest.raises(DataError, match=r"\(new: .*d.jsonl\)"):
        prepare_data(folder_cfg, tmp_path / "cache", progress=False)


def test_what_a_run_would_go_on_with_unnoticed_is_warned_and_kept_in_the_manifest(tmp_path, capsys):
    """A tokenizer smaller than asked, an empty validation split and a large share of the documents
    skipped: each one line on stderr and in manifest.json's warnings; a clean preparation has none."""
    records = [{"text": f"call me ishmael {i}"} for i in range(30)] + [{"body": "no text key"}] * 10
    path = write_jsonl(tmp_path / "c.jsonl", records)
    cfg = tiny_data([{"type": "jsonl", "path": str(path), "on_error": "skip"}], validation_fraction=1e-9,
                    tokenizer={"vocab_size": 5000, "min_frequency": 1})
    m = prepare_data(cfg, tmp_path / "cache", progress=False).manifest
    err = capsys.readouterr().err
    small, empty, skipped = m["warnings"]
    assert small == f"the tokenizer has {m['vocab_size']:,} tokens, fewer than the 5,000 asked (data.tokenizer.vocab_size): " \
                    "its training text offers no more merges"
    assert empty.startswith("the validation split is empty (data.validation_fraction=1e-09 chose none of the 30 documents packed)")
    assert skipped == "10 of the 40 documents read were skipped (missing_field 10; manifest.json: skipped, skipped_examples)"
    assert [line.split(": ", 3)[3] for line in err.splitlines() if line.startswith("cramlm: warning:")] == m["warnings"]
    clean = prepare_data(tiny_data([{"type": "jsonl", "path": str(path), "on_error": "skip"}], validation_fraction=0.3,
                                   tokenizer={"vocab_size": 60, "min_frequency": 1}, max_entries_in_raw_dataset=30),
                         tmp_path / "cache", progress=False).manifest
    assert clean["vocab_size"] == 60 and clean["val"]["documents"] and clean["warnings"] == []
    assert clean["train"]["unknown_tokens"] == 0
    # words over WordPiece's 100-character limit: each one [UNK], counted and warned about
    long = write_jsonl(tmp_path / "long.jsonl", [{"text": f"call me ishmael {'x' * 150} {i}"} for i in range(30)])
    unk = prepare_data(tiny_data([{"type": "jsonl", "path": str(long)}], tokenizer={"vocab_size": 60, "min_frequency": 1}),
                       tmp_path / "cache", progress=False).manifest
    assert unk["train"]["unknown_tokens"] == 30
    assert [w for w in unk["warnings"] if "unknown token" in w] == [
        f"30 of the {unk['train']['tokens']:,} training tokens ({100 * 30 / unk['train']['tokens']:.2f}%) are the unknown token: "
        "the tokenizer's vocabulary cannot spell parts of this text (its characters, or words over its length limit), which "
        "the model then never sees"]
    short = prepare_data(tiny_data([{"type": "jsonl", "path": str(path), "on_error": "skip"}], validation_fraction=0.3,
                                   tokenizer={"vocab_size": 60, "min_frequency": 1}, max_entries_in_raw_dataset=30, seq_length=4096),
                         tmp_path / "cache", progress=False).manifest
    assert short["warnings"] == [f"the validation split holds {short['val']['tokens']:,} tokens, less than one sequence of 4096 "
                                 "(data.seq_length): runs on it report no held-out loss; add text or raise data.validation_fraction"]
