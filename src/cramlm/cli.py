"""The ``cramlm`` command line. Arguments are cramming-style ``key=value`` overrides and group
selections (``arch=crammed-bert train=bert-o4 budget=24 train.optim.lr=1e-4``). Each stage keeps
its subcommands in ``<stage>/cli.py``; this file only assembles them."""

from __future__ import annotations

import sys

import click

from cramlm.cli_common import OVERRIDES, resolve_or_exit, run_or_exit
from cramlm.data.cli import data
from cramlm.eval.cli import eval_command
from cramlm.models.cli import export
from cramlm.pipeline.cli import plan_command, run_command, sweep_command
from cramlm.report.cli import report_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cramlm")
def main() -> None:
    """cramlm: pretrain and evaluate language models under a fixed compute budget."""


@main.command(context_settings=OVERRIDES)
@click.option("--resume", default=None, help="'auto' (newest checkpoint of the run, if any) or a checkpoint folder; same as resume=...")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def pretrain(overrides: tuple[str, ...], resume: str | None) -> None:
    """Pretrain a model. Defaults: arch=crammed-bert-tiny train=bert-o4-cpu data=default budget=1m.

    OVERRIDES are group picks (arch=gpt2-tiny) and dotted keys (train.optim.lr=1e-3);
    `cramlm config show pretrain ...` prints the resolved config.

    \b
    Examples:
      cramlm pretrain arch=crammed-bert train=bert-o4 budget=24 name=bert24
      cramlm pretrain arch=gpt2-tiny budget=5m name=gpt
      cramlm pretrain budget=null train.budget.tokens=2e9
      cramlm pretrain dryrun=true
      torchrun --nproc_per_node 2 -m cramlm pretrain ...   (docs/training.md)
    """
    from cramlm.pretrain import pretrain as run_pretrain

    if resume:
        overrides = (*overrides, f"resume={resume}")
    run_or_exit(run_pretrain, resolve_or_exit("pretrain", overrides))


@main.group()
def config() -> None:
    """Inspect configs."""


@config.command("show", context_settings=OVERRIDES)
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


main.add_command(data)
main.add_command(eval_command)
main.add_command(export)
main.add_command(run_command)
main.add_command(report_command)
main.add_command(sweep_command)
main.add_command(plan_command)

if __name__ == "__main__":
    main()
