"""A source registered by a plugin (docs/data.md, "Your own source"): one that numbers its records
with ``report.claim()`` packs like a built-in one; one that does not is an ``Error:`` line naming
its type and the rule, not a traceback from inside the packing pass."""

from __future__ import annotations

import csv
import sys
import textwrap

import pytest
from click.testing import CliRunner

from .conftest import document

PLUGIN = '''
import csv
from typing import Literal

from cramlm.config import register
from cramlm.data.sources import SourceConfig, checked_text, expand_paths


class CsvConfig(SourceConfig):
    type: Literal["csv-test"] = "csv-test"
    column: str = "text"


@register("source", "csv-test", CsvConfig)
def csv_documents(cfg, report):
    for path in expand_paths(cfg.path, report):
        with open(path, newline="", encoding="utf-8") as f:
            for row, record in enumerate(csv.DictReader(f), 2):
                if report.done:
                    return
                if not report.claim():
                    continue
                text = checked_text(cfg, report, record, cfg.column, f"{path}:{row}")
                if text is not None:
                    yield text


class UnnumberedConfig(SourceConfig):
    type: Literal["unnumbered-test"] = "unnumbered-test"


@register("source", "unnumbered-test", UnnumberedConfig)
def unnumbered(cfg, report):
    with open(cfg.path, newline="", encoding="utf-8") as f:
        for record in csv.DictReader(f):
            yield record["body"]  # never claims its records
'''


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("plugin")
    (tmp_path / "plugin_sources_test.py").write_text(textwrap.dedent(PLUGIN))
    sys.path.insert(0, str(tmp_path))  # imported once: a module registers its types once per process
    with open(tmp_path / "corpus.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "body"])
        writer.writerows([i, document(i)] for i in range(30))
    yield tmp_path
    sys.path.remove(str(tmp_path))


def _prepare(tmp_path, source: str, *extra: str):
    from cramlm.cli import main

    return CliRunner().invoke(main, [
        "data", "prepare", "--quiet", "plugins=[plugin_sources_test]", f"data.sources=[{source}]", "data.name=plugin",
        "data.tokenizer.vocab_size=200", "data.seq_length=16", f"cache={tmp_path / 'cache'}", *extra])


def test_a_plugin_source_that_claims_its_records_prepares(plugin):
    result = _prepare(plugin, f"{{type: csv-test, path: {plugin / 'corpus.csv'}, column: body}}")
    assert result.exit_code == 0, result.output
    assert '"read": 30, "packed": 30' in result.output


@pytest.mark.parametrize("shards", [[], ["--num-shards", "2"]])
def test_a_plugin_source_that_does_not_claim_its_records_is_an_error_line(plugin, shards):
    result = _prepare(plugin, f"{{type: unnumbered-test, path: {plugin / 'corpus.csv'}}}", *shards)
    assert result.exit_code == 1 and not isinstance(result.exception, (ArithmeticError, AssertionError)), result.output
    assert "Error: data.sources.0 (type unnumbered-test) yielded a document without claiming" in result.output and "report.claim()" in result.output, result.output
