"""Every source type round-trips its documents; presets parse offline; mixtures, caps and orderings."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from cramlm.cli.common import resolve_or_exit
from cramlm.config.registry import build
from cramlm.data.prepare import DataConfig, prepare_data
from cramlm.data.sources import DataError, SkipReport

from .conftest import document, tiny_data, write_jsonl

TEXTS = [document(i) for i in range(12)]


def _read(source: dict, shard=(0, 1)) -> tuple[list[str], SkipReport]:
    cfg = DataConfig.model_validate({"sources": [source]}).sources[0]
    report = SkipReport(shard)
    return list(build("source", cfg, report)), report


def test_jsonl_plain_gz_zst_and_key_path(tmp_path):
    import zstandard

    raw = "".join(json.dumps({"meta": {"body": t}, "id": i}) + "\n" for i, t in enumerate(TEXTS)).encode()
    (tmp_path / "a.jsonl").write_bytes(raw)
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    for name in ("a.jsonl", "b.jsonl.gz", "c.jsonl.zst"):
        docs, report = _read({"type": "jsonl", "path": str(tmp_path / name), "text_key": "meta.body"})
        assert docs == TEXTS and report.read == 12, name
    docs, _ = _read({"type": "jsonl", "path": str(tmp_path / "*.jsonl*"), "text_key": "meta.body"})  # glob
    assert docs == TEXTS * 3
    with pytest.raises(DataError, match="no string field 'text'"):
        _read({"type": "jsonl", "path": str(tmp_path / "a.jsonl")})
    # frames one after another read as one stream; a file cut inside a frame is an error, as a cut .gz is
    frames = b"".join(zstandard.ZstdCompressor().compress(raw[i:i + 300]) for i in range(0, len(raw), 300))
    (tmp_path / "d.jsonl.zst").write_bytes(frames)
    assert _read({"type": "jsonl", "path": str(tmp_path / "d.jsonl.zst"), "text_key": "meta.body"})[0] == TEXTS
    for cut, name in ((len(frames) - 7, "e"), (len(frames) // 2, "f")):
        (tmp_path / f"{name}.txt.zst").write_bytes(frames[:cut])
        with pytest.raises(DataError, match=rf"{name}.txt.zst: cannot read \(EOFError: the file ends inside a zstd frame"):
            _read({"type": "text", "path": str(tmp_path / f"{name}.txt.zst")})  # was: the documents before, nothing said


def test_text_per_file_and_per_block_in_a_directory(tmp_path):
    folder = tmp_path / "texts"
    (folder / "sub").mkdir(parents=True)
    (folder / "one.txt").write_text("\n\n".join(TEXTS[:3]) + "\n\n\n")
    (folder / "sub" / "two.txt").write_text(TEXTS[3])
    (folder / "sub" / "empty.txt").write_text("  \n")
    docs, report = _read({"type": "text", "path": str(folder)})
    assert docs == ["\n\n".join(TEXTS[:3]), TEXTS[3]] and report.read == 3 and report.skipped == {"empty": 1}
    docs, report = _read({"type": "text", "path": str(folder), "split": "blank-line"})
    assert docs == TEXTS[:4] and report.read == 5 and report.skipped == {"empty": 1}


def test_parquet_column_and_struct_path(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"text": TEXTS, "meta": [{"body": t.upper()} for t in TEXTS]})
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=5)
    assert _read({"type": "parquet", "path": str(tmp_path / "d.parquet")})[0] == TEXTS
    assert _read({"type": "parquet", "path": str(tmp_path / "d.parquet"), "text_key": "meta.body"})[0] == [t.upper() for t in TEXTS]
    with pytest.raises(DataError, match="no column 'body'"):
        _read({"type": "parquet", "path": str(tmp_path / "d.parquet"), "text_key": "body"})


def test_sharded_reading_partitions_records(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in TEXTS])
    parts = [_read({"type": "jsonl", "path": str(path)}, (i, 3))[0] for i in range(3)]
    assert sorted(sum(parts, [])) == sorted(TEXTS) and parts[1] == TEXTS[1::3]


@pytest.mark.parametrize("preset", ["bookcorpus-wikipedia", "the-pile", "c4", "openwebtext", "wikipedia"])
def test_hub_presets_parse_offline(preset):
    cfg = resolve_or_exit("data", [f"data={preset}"], check_extras=False).data  # datasets may be missing here
    assert cfg.name == preset and all(s.type == "hf" for s in cfg.sources)
    with pytest.raises(DataError, match="hf|datasets"):  # offline: a clear error, not a hang or a traceback
        next(iter(build("source", cfg.sources[0], SkipReport())))


def test_mixture_weights_cap_and_curriculum(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"text": document(i)} for i in range(40)])
    b = write_jsonl(tmp_path / "b.jsonl", [{"text": document(100 + i)} for i in range(40)])
    cfg = tiny_data([{"type": "jsonl", "path": str(a), "weight": 2.0}, {"type": "jsonl", "path": str(b), "weight": 0.5}],
                    ordering="sentence-length-curriculum")
    p = prepare_data(cfg, tmp_path / "cache", progress=False)
    m = p.manifest
    subsampled = m["skipped"]["subsampled"]
    assert 8 < subsampled < 32 and m["documents"]["packed"] == 80 - subsampled
    assert m["train"]["copies_written"] == 80 + (40 - subsampled)  # source a twice, half of b once
    lengths = p.train.lengths()
    assert np.all(np.diff(lengths) >= 0)  # shortest documents first
    capped = prepare_data(tiny_data([{"type": "jsonl", "path": str(a)}], max_seq_in_tokenized_dataset=10), tmp_path / "cache", progress=False)
    assert 10 * 15 <= capped.train.num_tokens < 10 * 15 + capped.train.lengths().max()
    mc = capped.manifest
    assert mc["skipped"]["capped"] == 40 - mc["train"]["documents"]
    assert mc["documents"]["read"] == mc["documents"]["packed"] + mc["documents"]["skipped"]


def _mixed_folder(folder):
    """Two .jsonl files (one gzipped), a .txt file, a hidden file and a hidden folder, in nested folders."""
    (folder / "sub").mkdir(parents=True)
    write_jsonl(folder / "a.jsonl", [{"text": t} for t in TEXTS[:4]])
    (folder / "sub" / "b.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in TEXTS[4:7]).encode()))
    (folder / "sub" / "c.txt").write_text(TEXTS[7])
    (folder / ".hidden.jsonl").write_text("not read\n")
    (folder / ".git" / "objects").mkdir(parents=True)  # a hidden folder's files are left out too (were read)
    (folder / ".git" / "objects" / "notes.txt").write_text("not read either\n")
    return folder


def test_auto_source_reads_each_file_by_its_name(tmp_path):
    from cramlm.data.sources import infer_format

    assert [infer_format(n) for n in ("x.jsonl", "x.JSONL.gz", "x.json", "x.ndjson.zst", "x.parquet", "x.txt", "x.md.gz", "x")] == [
        "jsonl", "jsonl", "jsonl", "jsonl", "parquet", "text", "text", "text"]
    folder = _mixed_folder(tmp_path / "mixed")
    docs, report = _read({"type": "auto", "path": str(folder)})
    assert docs == TEXTS[:8] and report.read == 8
    docs, _ = _read({"type": "jsonl", "path": str(folder / "sub" / "*.jsonl*")})  # typed sources are unchanged
    assert docs == TEXTS[4:7]


def test_pack_reads_a_folder_as_prepare_does(tmp_path):
    """`cramlm data pack <folder>` reads the .jsonl files in it as JSONL (it used to pack each file
    as one raw-text document), the same documents as `prepare` with an auto source."""
    from cramlm.data.commands import pack_files
    from cramlm.data.cramtok import read_packed
    from cramlm.data.tokenizer import TokenizerConfig, train_tokenizer

    folder = _mixed_folder(tmp_path / "mixed")
    tok = train_tokenizer(TokenizerConfig(vocab_size=200, min_frequency=1), TEXTS)
    tok.save(str(tmp_path / "tok.json"))
    out = str(tmp_path / "c.cramtok")
    info = pack_files([str(folder)], str(tmp_path / "tok.json"), out)
    assert info["read"] == info["packed"] == 8
    packed = read_packed(out)
    decoded = [tok.decode(packed.document(i).tolist()) for i in range(packed.num_documents)]
    assert not any('"text"' in d for d in decoded) and decoded[0].startswith("doc0")
    prepared = prepare_data(tiny_data([{"type": "auto", "path": str(folder)}], tokenizer={"path": str(tmp_path / "tok.json")}),
                            tmp_path / "cache", progress=False)
    assert np.array_equal(prepared.train.tokens, packed.tokens)


def test_a_byte_order_mark_starting_a_text_file_is_not_text(tmp_path):
    """Issue 20 item 9: it became an [UNK] token; the JSONL reader already dropped it."""
    from cramlm.data.commands import pack_files
    from cramlm.data.cramtok import read_packed
    from cramlm.data.tokenizer import TokenizerConfig, train_tokenizer

    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbf" + TEXTS[0].encode())
    docs, _ = _read({"type": "text", "path": str(tmp_path / "bom.txt")})
    assert docs == [TEXTS[0]]
    tok = train_tokenizer(TokenizerConfig(vocab_size=200, min_frequency=1), TEXTS)
    tok.save(str(tmp_path / "tok.json"))
    pack_files([str(tmp_path / "bom.txt")], str(tmp_path / "tok.json"), str(tmp_path / "b.cramtok"))
    ids = read_packed(tmp_path / "b.cramtok").document(0).tolist()
    assert tok.token_to_id("[UNK]") not in ids and ids[:-1] == tok.encode(TEXTS[0], add_special_tokens=False).ids


def test_dangling_symlink_and_truncated_gz_are_skipped_sources(tmp_path):
    """Issue 20 item 9: a dangling symlink in a corpus folder is counted with its reason (it was
    passed over without a word); with on_error: skip a truncated .gz keeps the documents before the
    damage and is counted (it aborted the whole pack); without skip it is still an error."""
    from cramlm.data.commands import pack_files
    from cramlm.data.tokenizer import TokenizerConfig, train_tokenizer

    folder = tmp_path / "corpus"
    folder.mkdir()
    write_jsonl(folder / "good.jsonl", [{"text": t} for t in TEXTS[:3]])
    raw = gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in TEXTS * 20).encode())
    (folder / "cut.jsonl.gz").write_bytes(raw[: len(raw) // 2])
    (folder / "gone.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    tok = train_tokenizer(TokenizerConfig(vocab_size=200, min_frequency=1), TEXTS)
    tok.save(str(tmp_path / "tok.json"))
    with pytest.raises(DataError, match="cut.jsonl.gz: cannot read"):
        pack_files([str(folder)], str(tmp_path / "tok.json"), str(tmp_path / "a.cramtok"))
    info = pack_files([str(folder)], str(tmp_path / "tok.json"), str(tmp_path / "b.cramtok"), on_error="skip")
    manifest = json.loads((tmp_path / "b.cramtok.manifest.json").read_text())
    reasons = {Path(s["path"]).name: s["reason"] for s in manifest["skipped_sources"]}
    assert set(reasons) == {"cut.jsonl.gz", "gone.jsonl"} and info["skipped_sources"] == manifest["skipped_sources"]
    assert "EOFError" in reasons["cut.jsonl.gz"] and "dangling symlink" in reasons["gone.jsonl"]
    assert 3 < info["packed"] == info["read"] < 3 + 12 * 20  # the readable part of the .gz is kept
    # prepare (sharded) lists each skipped file once
    prepared = prepare_data(tiny_data([{"type": "auto", "path": str(folder), "on_error": "skip"}],
                                      tokenizer={"path": str(tmp_path / "tok.json")}), tmp_path / "cache", progress=False)
    assert [Path(s["path"]).name for s in prepared.manifest["skipped_sources"]] == ["cut.jsonl.gz", "gone.jsonl"]


def test_train_subset_thins_training_documents_only(tmp_path):
    """data.train_subset (the repetition study: the same FLOPs on less text): a hash-chosen share of the
    training documents, each skipped one counted; validation and the tokenizer as without it."""
    a = write_jsonl(tmp_path / "a.jsonl", [{"text": document(i)} for i in range(200)])
    whole = prepare_data(tiny_data([{"type": "jsonl", "path": str(a)}], validation_fraction=0.2), tmp_path / "cache", progress=False)
    half = prepare_data(tiny_data([{"type": "jsonl", "path": str(a)}], validation_fraction=0.2, train_subset=0.5),
                        tmp_path / "cache", progress=False)
    w, h = whole.manifest, half.manifest
    dropped = h["skipped"]["train_subset"]
    assert 0.35 < dropped / w["train"]["documents"] < 0.65 and h["train"]["documents"] == w["train"]["documents"] - dropped
    assert h["documents"]["read"] == h["documents"]["packed"] + h["documents"]["skipped"]  # nothing lost
    assert half.identity()["val.cramtok"] == whole.identity()["val.cramtok"]  # the same held-out set
    assert half.identity()["tokenizer"] == whole.identity()["tokenizer"]
    again = prepare_data(tiny_data([{"type": "jsonl", "path": str(a)}], validation_fraction=0.2, train_subset=0.5),
                         tmp_path / "cache2", progress=False)
    assert again.identity() == half.identity()  # the same documents: a hash draw, not a random one
    # the whole split keeps the cache key that data prepared before the field existed had
    import hashlib
    import json

    from cramlm.data.prepare import PIPELINE_VERSION

    cfg = tiny_data([{"type": "jsonl", "path": str(a)}])
    before = {k: v for k, v in cfg.model_dump(mode="json").items() if k != "train_subset"}
    old_key = hashlib.sha256(json.dumps([PIPELINE_VERSION, before], sort_keys=True).encode()).hexdigest()[:12]
    assert cfg.cache_key() == old_key != cfg.model_copy(update={"train_subset": 0.5}).cache_key()


def test_a_missing_shared_data_folder_says_which_variable_names_it(tmp_path, monkeypatch):
    """The shared-corpus preset's default path (../shared/data) missing: the Error names
    CRAMLM_DATA_DIR, which sets it (the README's presets need it outside this checkout's layout)."""
    from cramlm.data.sources import DataError, expand_paths

    monkeypatch.delenv("CRAMLM_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=r"no files match; the shared-corpus .* read \$CRAMLM_DATA_DIR \(unset: default ../shared/data\)"):
        expand_paths("../shared/data/corpus/*.jsonl.gz")
    with pytest.raises(DataError) as other:
        expand_paths(str(tmp_path / "elsewhere" / "*.jsonl"))
    assert "CRAMLM_DATA_DIR" not in str(other.value)
