"""``cramlm eval``: fine-tune and score a checkpoint on labelled tasks."""

from __future__ import annotations

import click

from cramlm.cli.common import OVERRIDES, resolve_or_exit, run_or_exit


@click.command("eval", context_settings=OVERRIDES)
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def eval_command(overrides: tuple[str, ...]) -> None:
    """Fine-tune a checkpoint on labelled tasks (N seeds, median) and print the dev scores.

    \b
    checkpoint=  latest | run name | run folder | HF folder | hf://name  (+ "-untrained")
    eval=        default | glue-sane | glue | cpu-quick   (eval.overrides.<task>.<key>=value)
    eval.minimal_pairs.paths=[dir|file.jsonl]: zero-shot minimal pairs (BLiMP), no fine-tuning
    plugins=     [my.module]: imported first; trusted code (importing runs it)
    Examples:
      cramlm eval checkpoint=bert24 eval=glue-sane eval.glue_dir=glue_data
      cramlm eval checkpoint=bert24-untrained eval=cpu-quick eval.tasks=[path/to/task]
      cramlm eval checkpoint=bert24 eval.tasks=[] eval.minimal_pairs.paths=[../shared/data/minimal_pairs/blimp]
    """
    from cramlm.eval.evaluate import evaluate

    run_or_exit(evaluate, resolve_or_exit("eval", overrides))
