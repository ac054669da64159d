"""The ``cramlm`` command line: every subcommand, one module per stage, on top of the libraries.

Arguments are cramming-style ``key=value`` overrides and group selections (``arch=crammed-bert
train=bert-o4 budget=24 train.optim.lr=1e-4``). This package is the only place that knows click;
the stages below it (config -> data -> models -> train -> eval -> report -> pipeline) never import
it. ``common`` holds what every command shares (its root config, failures as one ``Error:`` line);
this file only assembles the group.
"""

from __future__ import annotations

import click

from cramlm.cli.config import config_command
from cramlm.cli.data import data_command
from cramlm.cli.eval import eval_command
from cramlm.cli.export import export_command
from cramlm.cli.pipeline import plan_command, run_command, sweep_command
from cramlm.cli.pretrain import pretrain_command
from cramlm.cli.report import report_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cramlm")
def main() -> None:
    """cramlm: pretrain and evaluate language models under a fixed compute budget."""


for command in (pretrain_command, config_command, data_command, eval_command, export_command, run_command,
                report_command, sweep_command, plan_command):
    main.add_command(command)

if __name__ == "__main__":
    main()
