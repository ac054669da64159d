"""``cramlm run``, ``cramlm sweep`` and ``cramlm plan``: the whole pipeline, grids of it, and the model a budget buys."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from cramlm.cli.common import OVERRIDES, run_or_exit, with_allowed_changes


def split_recipe(args: tuple[str, ...], default: str) -> tuple[str, list[str]]:
    """The first argument without '=' is the recipe; the rest are key=value overrides."""
    if args and "=" not in args[0]:
        return args[0], list(args[1:])
    return default, list(args)


def resolve_recipe_or_exit(recipe: str, overrides: list[str], plan_arch: dict | None = None):
    from cramlm.config.loader import ConfigError
    from cramlm.pipeline.recipe import resolve_recipe

    try:
        return resolve_recipe(recipe, overrides, plan_arch)
    except (ConfigError, ValueError) as e:
        raise click.ClickException(str(e)) from None


@click.command("run", context_settings=OVERRIDES)
@click.option("--list", "list_", is_flag=True, help="List the shipped recipes and exit.")
@click.option("--show", is_flag=True, help="Print the resolved config and exit.")
@click.option("--resume", default=None, help="'auto' or a checkpoint folder: the pretrain stage continues it; same as resume=...")
@click.option("--allow-change", "allow_change", multiple=True, metavar="KEY",
              help="With --resume: a config key the resumed pretraining may change (see `cramlm pretrain --help`)")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run_command(list_: bool, show: bool, resume: str | None, allow_change: tuple[str, ...], args: tuple[str, ...]) -> None:
    """Prepare data, pretrain under the budget, evaluate and write the report, in one command.

    ARGS: an optional RECIPE (a shipped name or a YAML path; default: `default`, the one-minute demo)
    then key=value overrides. Finished stages are skipped on a re-run (force=[eval] redoes one).

    \b
    Examples:
      cramlm run
      cramlm run cpu-1h
      cramlm run cpu-1h budget=15m arch=auto
      cramlm run crammed-bert-24h eval.tasks=[glue/SST-2]
    """
    from cramlm.pipeline.recipe import DEFAULT_RECIPE, describe, list_recipes, results_summary, run_pipeline

    if list_:
        for name, text in list_recipes():
            click.echo(f"{name:20s} {text}")
        return
    recipe, overrides = split_recipe(args, DEFAULT_RECIPE)
    overrides = [*overrides, *with_allowed_changes(resume, allow_change)]
    # arch=auto plans here (--show applies a recorded plan only: showing must not take minutes)
    cfg = resolve_recipe_or_exit(recipe, overrides, plan_arch={"say": click.echo, "reuse_only": show})
    if show:
        sys.stdout.write(describe(cfg))
        return
    run_or_exit(run_pipeline, cfg, Path(recipe).stem)
    if "eval" in cfg.stages and (summary := results_summary(cfg)):
        click.echo("\n" + summary)
    wrote = (f"; report: {cfg.run_dir / 'report.html'}" if "report" in cfg.stages
             else f" (no report stage: cramlm report {cfg.run_dir})" if "pretrain" in cfg.stages else "")
    click.echo(f"cramlm run: finished{wrote}")


@click.command("sweep", context_settings=OVERRIDES)
@click.option("--sizes", default="64x2,128x2,128x4", show_default=True,
              help="Comma-separated model sizes HIDDENxLAYERS (crammed-bert widths/depths).")
@click.option("--budgets", default="30s,1m,2m", show_default=True,
              help="Comma-separated budgets: wall clock ('90s', '2m', '1h') or tokens ('250ktok', '1Mtok').")
@click.option("--name", default="sweep", show_default=True, help="Folder under base_dir for the grid's runs.")
@click.option("--report/--no-report", default=True, show_default=True, help="Also write report.html comparing the runs.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def sweep_command(sizes: str, budgets: str, name: str, report: bool, args: tuple[str, ...]) -> None:
    """Pretrain a grid of sizes x budgets and fit final loss against compute, L = E + A*C^-alpha.

    ARGS: an optional RECIPE (default: `default`) then key=value overrides for every grid point.
    Prints a table and the fit; writes <base_dir>/<name>/sweep.json, sweep.png and report.html;
    finished points are skipped. A grid with fewer than 4 points or 3 distinct compute values is
    refused before anything runs.

    \b
    Example:
      cramlm sweep --sizes 64x2,128x4,256x4 --budgets 250ktok,1Mtok,4Mtok impl.threads=2
    """
    from cramlm.pipeline.recipe import DEFAULT_RECIPE
    from cramlm.pipeline.sweep import sweep

    recipe, overrides = split_recipe(args, DEFAULT_RECIPE)
    resolve_recipe_or_exit(recipe, overrides)  # a config error exits before any training
    run_or_exit(sweep, recipe, [s.strip() for s in sizes.split(",") if s.strip()],
                [b.strip() for b in budgets.split(",") if b.strip()], name, overrides, report)


@click.command("plan", context_settings=OVERRIDES)
@click.option("--sizes", default=None, help="Comma-separated candidate shapes HIDDENxLAYERS (default: 64x2 ... 384x6).")
@click.option("--law", default=None, help="Fitted L(N, D): a YAML like recipes/plan/scaling-cpu.yaml or a sweep.json.")
@click.option("--throughput", default=None, help="Skip the measurement: SHAPE=TOKENS_PER_S,... (e.g. 128x4=4000,256x4=1500).")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def plan_command(sizes: str | None, law: str | None, throughput: str | None, args: tuple[str, ...]) -> None:
    """Pick the model shape, batch, lr and masking that a budget buys on this machine.

    Measures tokens/s of a few training steps per candidate shape, predicts each one's validation
    loss (val_loss) from a scaling law fitted to this project's sweeps, prints the table it chose from, why,
    and the `cramlm run` command. ARGS: an optional RECIPE (default: cpu-1h) then overrides.

    \b
    Examples:
      cramlm plan budget=1h
      cramlm plan default budget=15m --sizes 64x2,128x4
    """
    from cramlm.pipeline.plan import plan

    recipe, overrides = split_recipe(args, "cpu-1h")
    cfg = resolve_recipe_or_exit(recipe, overrides)  # arch=auto stays the planner's starting shape here
    table = None
    if throughput:
        try:
            table = {k.strip(): float(v) for k, v in (item.split("=") for item in throughput.split(",") if item)}
        except ValueError:
            raise click.ClickException(f"--throughput '{throughput}': expected SHAPE=TOKENS_PER_S,...") from None
    run_or_exit(plan, cfg, recipe, [s for s in sizes.split(",") if s] if sizes else None, law, table)
