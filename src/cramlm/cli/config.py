"""``cramlm config show``: the fully resolved config of a command, or each key documented."""

from __future__ import annotations

import sys

import click

from cramlm.cli.common import OVERRIDES, resolve_or_exit


@click.group("config")
def config_command() -> None:
    """Inspect configs."""


@config_command.command("show", context_settings=OVERRIDES)
@click.option("--doc", is_flag=True, help="Each key with its type, default and description.")
@click.argument("command")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def config_show(command: str, overrides: tuple[str, ...], doc: bool) -> None:
    """Print the fully resolved config of COMMAND (pretrain, eval, data) with OVERRIDES."""
    import yaml

    cfg = resolve_or_exit(command, overrides, check_extras=False)
    tree = cfg.model_dump(mode="json")
    if isinstance(tree.get("budget"), float):
        tree["budget"] = format_hours(tree["budget"])  # '1m', not 0.016666666666666666 (parses back)
    if doc:
        from cramlm.config.doc import describe, format_docs

        sys.stdout.write(format_docs(describe(cfg, tree)))
    else:
        sys.stdout.write(yaml.safe_dump(tree, sort_keys=False))


def format_hours(hours: float) -> str:
    """Hours in the unit a person would write: 24h, 1.5h, 5m, 90s (what `budget=` accepts)."""
    seconds = round(hours * 3600, 6)
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and (seconds / size * 100).is_integer():  # at most two decimals
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
