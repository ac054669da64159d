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

    from cramlm.run.config import readable_budget

    cfg = resolve_or_exit(command, overrides, check_extras=False)
    tree = readable_budget(cfg.model_dump(mode="json"))  # '1m', not 0.016666666666666666 (parses back)
    if doc:
        from cramlm.config.doc import describe, format_docs

        sys.stdout.write(format_docs(describe(cfg, tree)))
    else:
        sys.stdout.write(yaml.safe_dump(tree, sort_keys=False))

