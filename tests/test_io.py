"""io.atomic_dir: a folder appears complete under its name or not at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cramlm.io import atomic_dir, write_result


def test_a_folder_appears_only_when_complete(tmp_path):
    final = tmp_path / "out"
    with atomic_dir(final) as tmp:
        (tmp / "a.txt").write_text("a")
        assert tmp.name.startswith(".") and not final.exists()  # hidden while written
    assert (final / "a.txt").read_text() == "a" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_failed_write_leaves_nothing_and_keeps_the_old_folder(tmp_path):
    final = tmp_path / "out"
    final.mkdir()
    (final / "old.txt").write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_dir(final) as tmp:
            (tmp / "half.txt").write_text("x")
            raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and (final / "old.txt").is_file()


def test_replace_or_keep_an_existing_folder(tmp_path):
    final = tmp_path / "out"
    final.mkdir()
    (final / "first.txt").write_text("1")
    with atomic_dir(final, if_exists="keep") as tmp:  # another process finished first: its result stands
        (tmp / "second.txt").write_text("2")
    assert [p.name for p in final.iterdir()] == ["first.txt"]
    with atomic_dir(final, durable=True) as tmp:
        (tmp / "second.txt").write_text("2")
    assert [p.name for p in final.iterdir()] == ["second.txt"] and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_keep_when_another_writer_finishes_between_the_check_and_the_rename(tmp_path, monkeypatch):
    """Two merges of one config: the other one's folder appears after this one looked and before its
    rename (was: 'Directory not empty' naming the hidden temporary folder, which stayed behind)."""
    import os

    import cramlm.io as io_module

    final, real = tmp_path / "out", os.replace

    def the_other_writer_first(src, dst):
        if Path(dst) == final and not final.exists():
            final.mkdir()
            (final / "theirs.txt").write_text("2")
        return real(src, dst)

    monkeypatch.setattr(io_module.os, "replace", the_other_writer_first)
    with atomic_dir(final, if_exists="keep") as tmp:
        (tmp / "mine.txt").write_text("1")
    assert [p.name for p in final.iterdir()] == ["theirs.txt"] and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_killed_writers_leftover_is_cleared(tmp_path):
    leftover = tmp_path / ".out.tmp-1"
    leftover.mkdir()
    (leftover / "junk").write_text("x")
    with atomic_dir(tmp_path / "out", tmp=leftover) as tmp:
        assert list(tmp.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_benchmark_result_is_strict_json_with_its_table_beside(tmp_path):
    out = tmp_path / "new" / "result.json"
    write_result(out, {"loss": float("nan"), "run": Path("a/b")}, "| a |\n|---|", default=str)
    assert json.loads(out.read_text()) == {"loss": None, "run": "a/b"}  # NaN is no JSON: null
    assert out.with_suffix(".md").read_text() == "| a |\n|---|\n"



@pytest.mark.parametrize("failing", ["aside", "into place"])
def test_a_failed_rename_puts_the_earlier_folder_back(tmp_path, monkeypatch, failing):
    """The earlier folder is moved aside before the new one is renamed into place: when that rename
    fails, the earlier one goes back under its name (was: left as .out.old-PID); when moving it aside
    fails (a mount point: EBUSY), the temporary folder goes too."""
    import errno
    import os

    import cramlm.io as io_module

    final, real = tmp_path / "out", os.replace
    final.mkdir()
    (final / "earlier.txt").write_text("1")

    def replace(src, dst):
        if (Path(src) == final) if failing == "aside" else (Path(dst) == final and ".tmp-" in Path(src).name):
            raise OSError(errno.EBUSY, "Device or resource busy")
        return real(src, dst)

    monkeypatch.setattr(io_module.os, "replace", replace)
    with pytest.raises(OSError, match="busy"):
        with atomic_dir(final) as tmp:
            (tmp / "new.txt").write_text("2")
    assert [p.name for p in final.iterdir()] == ["earlier.txt"] and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_full_disk_inside_a_librarys_own_error_is_one_error_line():
    """safetensors and torch wrap ENOSPC in errors of their own (not OSError): the command line still
    says "disk full" in one line, where another error of theirs stays a traceback (a bug to see)."""
    import click
    import pytest

    from cramlm.cli.common import run_or_exit
    from cramlm.io import is_disk_full

    def full():
        raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")

    with pytest.raises(click.ClickException, match=r"^disk full: RuntimeError: Error while serializing"):
        run_or_exit(full)

    def other():
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        run_or_exit(other)
    assert is_disk_full(OSError(28, "x")) and not is_disk_full(OSError(2, "x"))


def test_a_full_disk_under_an_atomic_write_names_the_file_not_its_temporary(tmp_path):
    import errno

    import click
    import pytest

    from cramlm.cli.common import run_or_exit

    def full():
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / ".pipeline.json.tmp-4242"))

    with pytest.raises(click.ClickException, match=rf"^{tmp_path}/pipeline.json: disk full: No space left on device$"):
        run_or_exit(full)
