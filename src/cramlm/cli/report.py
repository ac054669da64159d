"""``cramlm report RUN [RUN...]``: one run's report, or several runs side by side."""

from __future__ import annotations

from pathlib import Path

import click

from cramlm.cli.common import run_or_exit


@click.command("report")
@click.argument("runs", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for a comparison (default: compare-<run names> beside the first run's folder).")
def report_command(runs: tuple[Path, ...], out: Path | None) -> None:
    """Write report.html (plots embedded) and PNG plots for RUN folders.

    One run: into its folder. Several: a comparison with overlaid curves and side-by-side tables.

    RUN is a run folder, or a run name under outputs/. Example: cramlm report default cpu-1h
    """
    from cramlm.report import write_report
    from cramlm.run.folder import named_run

    runs = tuple(named_run(r) for r in runs)  # names work
    if len(runs) > 1 and out is None:
        out = runs[0].parent / ("compare-" + "-".join(r.name for r in runs))[:120]
    path = run_or_exit(lambda: write_report(*runs, out=out))
    click.echo(f"report: {path}")
