"""``cramlm pretrain``: the pretraining stage on its own."""

from __future__ import annotations

import click

from cramlm.cli.common import OVERRIDES, resolve_or_exit, run_or_exit


@click.command("pretrain", context_settings=OVERRIDES)
@click.option("--resume", default=None, help="'auto' (newest checkpoint of the run, if any) or a checkpoint folder; same as resume=...")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def pretrain_command(overrides: tuple[str, ...], resume: str | None) -> None:
    """Pretrain a model. Defaults: arch=crammed-bert-tiny train=bert-o4-cpu data=default budget=1m.

    OVERRIDES are group picks (arch=gpt2-tiny) and dotted keys (train.optim.lr=1e-3);
    `cramlm config show pretrain ...` prints the resolved config. plugins=[my.module] imports
    the module first (to register components): it is trusted code, run like any Python import.

    \b
    Examples:
      cramlm pretrain arch=crammed-bert train=bert-o4 budget=24 name=bert24
      cramlm pretrain arch=gpt2-tiny budget=5m name=gpt
      cramlm pretrain budget=null train.budget.tokens=2e9
      cramlm pretrain dryrun=true
      torchrun --nproc_per_node 2 -m cramlm pretrain ...   (docs/training.md)
    """
    from cramlm.pretrain import pretrain

    if resume:
        overrides = (*overrides, f"resume={resume}")
    run_or_exit(pretrain, resolve_or_exit("pretrain", overrides))
