"""``cramlm pretrain``: the pretraining stage on its own."""

from __future__ import annotations

import click

from cramlm.cli.common import OVERRIDES, resolve_or_exit, run_or_exit, with_allowed_changes


@click.command("pretrain", context_settings=OVERRIDES)
@click.option("--resume", default=None, help="'auto' (newest checkpoint of the run, if any) or a checkpoint folder; same as resume=...")
@click.option("--allow-change", "allow_change", multiple=True, metavar="KEY",
              help="With --resume: a config key (or key prefix) the resumed run may change although it changes the "
                   "maths, e.g. train.optim.lr; repeatable; recorded (docs/training.md); same as allow_change=[...]")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def pretrain_command(overrides: tuple[str, ...], resume: str | None, allow_change: tuple[str, ...]) -> None:
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
      cramlm pretrain --resume auto --allow-change train.optim.lr train.optim.lr=5e-4 name=bert24
      torchrun --nproc_per_node 2 -m cramlm pretrain ...   (docs/training.md)
    """
    from cramlm.run.pretrain import pretrain

    overrides = (*overrides, *with_allowed_changes(resume, allow_change))
    run_or_exit(pretrain, resolve_or_exit("pretrain", overrides))
