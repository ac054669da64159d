"""``cramlm eval``: fine-tune and score a checkpoint on labelled tasks."""

from __future__ import annotations

import click

from cramlm.cli_utils import OVERRIDES, resolve_or_exit, run_or_exit


@click.command("eval", context_settings=OVERRIDES)
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def eval_command(overrides: tuple[str, ...]) -> None:
    """Fine-tune a pretrained run on labelled tasks and print dev scores.

    Example: cramlm eval name=bert24 eval=glue-sane eval.tasks=[path/to/task]
    """
    from cramlm.evaluate import evaluate

    run_or_exit(evaluate, resolve_or_exit("eval", overrides))
