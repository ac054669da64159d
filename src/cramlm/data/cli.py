"""``cramlm data ...``: the data stage on its own."""

from __future__ import annotations

import json

import click

from cramlm.cli_utils import OVERRIDES, resolve_or_exit, run_or_exit


@click.group()
def data() -> None:
    """The data stage on its own."""


@data.command("prepare", context_settings=OVERRIDES)
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def prepare(overrides: tuple[str, ...]) -> None:
    """Read sources, train the tokenizer, write packed train/val files (cached by config hash).

    Example: cramlm data prepare data=default data.tokenizer.vocab_size=4096 cache=outputs/data
    """
    from cramlm.data.prepare import prepare_data

    cfg = resolve_or_exit("data", overrides)
    prepared = run_or_exit(prepare_data, cfg.data, cfg.cache)
    m = prepared.manifest
    print(json.dumps({"folder": str(prepared.folder), **m["documents"], "train_tokens": m["train"]["tokens"],
                      "val_tokens": m["val"]["tokens"], "skipped_reasons": m["skipped"]}))
