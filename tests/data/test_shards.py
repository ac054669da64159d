"""Sharded prepare: N shards + merge give byte-identical output to one; finished shards are kept."""

from __future__ import annotations

import json

from cramlm.data.prepare import merge_prepared, prepare_data, prepare_shard, shards_folder
from cramlm.data.tokenizer import TokenizerConfig, train_tokenizer

from .conftest import document, tiny_data, write_jsonl


def _corpus(tmp_path):
    records = [{"text": document(i % 40)} for i in range(60)]  # 20 exact duplicates
    records[11]["text"] = ""
    return write_jsonl(tmp_path / "c.jsonl", records)


def test_two_shards_plus_merge_equal_one_shard(tmp_path):
    path = _corpus(tmp_path)
    # HF tokenizer training is not deterministic, so both runs share one trained tokenizer (as the
    # shards of one run do)
    tok = train_tokenizer(TokenizerConfig(vocab_size=200, min_frequency=1), [document(i) for i in range(40)])
    tok.save(str(tmp_path / "tok.json"))
    cfg = tiny_data([{"type": "jsonl", "path": str(path)}], validation_fraction=0.1, tokenizer={"path": str(tmp_path / "tok.json")},
                    dedup={"exact": True}, ordering="random", seed=3)
    one = prepare_data(cfg, tmp_path / "one", progress=False)

    infos = [prepare_shard(cfg, tmp_path / "two", 2, i, progress=False) for i in (1, 0)]
    assert sum(i["read"] for i in infos) == 60 and [i["read"] for i in infos] == [30, 30]
    marker = shards_folder(cfg, tmp_path / "two") / "shard-00000-of-00002" / "shard.json"
    before = marker.stat().st_mtime_ns
    prepare_shard(cfg, tmp_path / "two", 2, 0, progress=False)  # finished: skipped
    assert marker.stat().st_mtime_ns == before
    two = merge_prepared(cfg, tmp_path / "two", 2)

    for name in ("train.cramtok", "val.cramtok", "tokenizer.json"):
        assert (one.folder / name).read_bytes() == (two.folder / name).read_bytes(), name
    m1, m2 = (json.loads((p.folder / "manifest.json").read_text()) for p in (one, two))
    for key in ("documents", "skipped", "train", "val"):
        assert m1[key] == m2[key], key
    assert m1["skipped"] == {"empty": 1, "duplicate": 19} and m1["documents"]["packed"] == 40  # record 51 repeats the emptied 11
    assert not shards_folder(cfg, tmp_path / "two").exists()  # cleaned up after the merge


def test_a_kept_single_shard_stays_whole_after_its_merge(tmp_path):
    """One shard, nothing removed: the merge takes the shard's file as the output; with --keep-shards
    the shard must keep it (it was moved out, leaving a shard that later merges could not read)."""
    cfg = tiny_data([{"type": "jsonl", "path": str(write_jsonl(tmp_path / "c.jsonl", [{"text": document(i)} for i in range(30)]))}])
    prepare_shard(cfg, tmp_path / "cache", 1, 0, progress=False)
    shard = shards_folder(cfg, tmp_path / "cache") / "shard-00000-of-00001"
    merged = merge_prepared(cfg, tmp_path / "cache", 1, keep_shards=True)
    assert (shard / "train.cramtok").read_bytes() == (merged.folder / "train.cramtok").read_bytes()


def test_a_stale_tokenizer_lock_is_taken_over(tmp_path):
    import socket
    import subprocess

    from cramlm.data.prepare import get_tokenizer

    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / "tokenizer.lock").write_text(f"{socket.gethostname()} {dead.pid}")
    cfg = tiny_data([{"type": "jsonl", "path": str(write_jsonl(tmp_path / "c.jsonl", [{"text": document(i)} for i in range(20)]))}])
    tok = get_tokenizer(cfg, tmp_path, wait_s=5)
    assert tok.get_vocab_size() > 5 and not (tmp_path / "tokenizer.lock.owner").exists()  # released


def test_merge_with_a_corrupt_shard_record_names_the_file(tmp_path):
    import pytest

    from cramlm.data.packing import read_shard_info

    folder = tmp_path / "shard-00000-of-00002"
    folder.mkdir()
    (folder / "shard.json").write_text('{"shard": [0, 2], "read": ')  # cut short
    with pytest.raises(ValueError, match=r"shard-00000-of-00002/shard.json: unreadable .*prepare it again"):
        read_shard_info(folder)
    (folder / "shard.json").write_text('{"shard": [0, 2]}')
    with pytest.raises(ValueError, match=r"shard.json: not a finished shard record \(missing read, skipped"):
        read_shard_info(folder)
    (folder / "shard.json").unlink()
    with pytest.raises(FileNotFoundError, match="no shard.json"):
        read_shard_info(folder)


def test_a_stopped_preparations_temporary_folder_is_removed_by_the_next(tmp_path, capsys, monkeypatch):
    """A preparation killed while merging (SIGKILL, a lost machine) leaves ``.<entry>.tmp-<pid>``, as
    large as the packed tokens; the next preparation of that entry, holding its lock, removes it and
    says so. Another entry's temporary folder is not touched."""
    from cramlm.data.prepare import output_folder

    cfg = tiny_data([{"type": "jsonl", "path": str(write_jsonl(tmp_path / "c.jsonl", [{"text": document(i)} for i in range(30)]))}])
    folder = output_folder(cfg, tmp_path / "cache")
    folder.parent.mkdir(parents=True)
    stale = folder.with_name(f".{folder.name}.tmp-4194000")
    (stale / "train.cramtok").parent.mkdir()
    (stale / "train.cramtok").write_bytes(b"\0" * 3_000_000)
    other = folder.with_name(f".{folder.name}x.tmp-4194000")
    other.mkdir()
    from cramlm.data import prepare as prep

    packed_with_it = []
    real = prep.prepare_shard

    def pack(*args, **kwargs):  # the space it holds may be what packing needs: removed first
        packed_with_it.append(stale.exists())
        return real(*args, **kwargs)

    monkeypatch.setattr(prep, "prepare_shard", pack)
    prepared = prepare_data(cfg, tmp_path / "cache", progress=False)
    assert (prepared.folder / "manifest.json").is_file() and not stale.exists() and other.is_dir() and packed_with_it == [False]
    assert f"removed {stale} (3.0 MB), left by a preparation of {folder.name} that was stopped" in capsys.readouterr().err
    assert sorted(p.name for p in folder.parent.iterdir()) == sorted([folder.name, other.name])  # no lock file left


def test_merge_holds_the_entrys_lock(tmp_path):
    """`cramlm data merge` takes the entry's lock as a preparation does: one held elsewhere makes it wait."""
    import multiprocessing

    import pytest

    from cramlm.data import prepare as prep
    from cramlm.locks import LockHeld

    cfg = tiny_data([{"type": "jsonl", "path": str(write_jsonl(tmp_path / "c.jsonl", [{"text": document(i)} for i in range(30)]))}])
    prepare_shard(cfg, tmp_path / "cache", 1, 0, progress=False)
    folder = prep.output_folder(cfg, tmp_path / "cache")
    with prep.preparation_lock(folder), multiprocessing.get_context("spawn").Pool(1) as pool:
        with pytest.raises(LockHeld, match="data cache entry .* is in use by pid"):
            pool.apply(_merge_waiting_briefly, (cfg, tmp_path / "cache"))  # another process: waits 0.5 s, then refused
    assert (merge_prepared(cfg, tmp_path / "cache", 1).folder / "manifest.json").is_file()


def _merge_waiting_briefly(cfg, cache):
    from cramlm.data import prepare as prep

    prep.PREPARE_WAIT_S = 0.5
    return prep.merge_prepared(cfg, cache, 1)


def test_a_merge_leaves_the_shards_of_another_count_in_place(tmp_path):
    """An array job packing 2 shards while `cramlm run` prepares the same config in one: the run's
    merge removes its own shard, not the array job's (nor their shared tokenizer); the array job's
    merge then removes the rest."""
    cfg = tiny_data([{"type": "jsonl", "path": str(write_jsonl(tmp_path / "c.jsonl", [{"text": document(i)} for i in range(30)]))}])
    cache = tmp_path / "cache"
    prepare_shard(cfg, cache, 2, 0, progress=False)  # the array job, one shard packed so far
    root = shards_folder(cfg, cache)
    stale = root / ".shard-00000-of-00001.tmp-4194000"  # a killed packer of the run's own count
    stale.mkdir()
    prepare_data(cfg, cache, progress=False)
    assert sorted(p.name for p in root.iterdir() if p.name != "tokenizer.lock") == ["shard-00000-of-00002", "tokenizer.json"]
    prepare_shard(cfg, cache, 2, 1, progress=False)
    merge_prepared(cfg, cache, 2)  # the entry exists: reused, and the array job's shards go
    assert not root.exists()


def test_a_full_disk_while_packing_names_the_folder_and_leaves_nothing_half_written(tmp_path, monkeypatch):
    """The OS error names no file, and closing the buffered file it could not flush raised again
    (hiding the first error and the other writers' cleanup): one DataError naming the shard folder and
    the free space; no partial shard; the shared tokenizer, complete, stays."""
    import errno

    import pytest

    from cramlm.data import cramtok
    from cramlm.data.sources import DataError

    def full(self, flat, lengths):
        real = self.file

        class Unflushable:  # a buffered file whose close flushes into the full disk
            def close(self):
                real.close()
                raise OSError(errno.ENOSPC, "No space left on device")

        self.file = Unflushable()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cramtok.PackedWriter, "add_batch", full)
    cfg = tiny_data([{"type": "jsonl", "path": str(write_jsonl(tmp_path / "c.jsonl", [{"text": document(i)} for i in range(30)]))}])
    with pytest.raises(DataError, match=r"disk full while packing .*shard-00000-of-00001 \([\d,.]+ MB free on that disk\); its partial files"):
        prepare_data(cfg, tmp_path / "cache", progress=False)
    root = shards_folder(cfg, tmp_path / "cache")
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith("tokenizer.lock")) == ["tokenizer.json"]


def test_a_full_disk_while_closing_the_packed_files_closes_every_writer(tmp_path, monkeypatch):
    """The last bytes of a packed file go out when it is closed: a full disk there left the other
    writers' files open (held on the disk after their folder was removed)."""
    import errno

    import pytest

    from cramlm.data import cramtok
    from cramlm.data.sources import DataError

    seen = []
    real_init = cramtok.PackedWriter.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        seen.append(self)

    def full(self):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cramtok.PackedWriter, "__init__", init)
    monkeypatch.setattr(cramtok.PackedWriter, "_close", full)
    cfg = tiny_data([{"type": "jsonl", "path": str(write_jsonl(tmp_path / "c.jsonl", [{"text": document(i)} for i in range(30)]))}],
                    validation_fraction=0.2)
    with pytest.raises(DataError, match="disk full while packing"):
        prepare_data(cfg, tmp_path / "cache", progress=False)
    assert len(seen) == 2 and all(w.file.closed and w.offsets_file.closed for w in seen)
