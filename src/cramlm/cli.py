"""The ``cramlm`` command line. Arguments are cramming-style ``key=value`` overrides and group
selections (``arch=crammed-bert train=bert-o4 budget=24 train.optim.lr=1e-4``)."""

from __future__ import annotations

import sys

import click

CONTEXT = {"help_option_names": ["-h", "--help"], "ignore_unknown_options": True}


def _command_spec(command: str):
    """(root config class, defaults) of a pipeline command; imported lazily to keep --help fast."""
    if command == "pretrain":
        from cramlm.pretrain import DEFAULTS, PretrainConfig

        return PretrainConfig, DEFAULTS
    if command == "eval":
        from cramlm.evaluate import DEFAULTS, EvalRunConfig

        return EvalRunConfig, DEFAULTS
    if command == "data":
        from cramlm.data.prepare import DataConfig

        return DataConfig, {}
    raise click.BadParameter(f"unknown command '{command}'; choose pretrain, eval or data")


def _resolve(command: str, overrides: tuple[str, ...]):
    from cramlm.config.loader import ConfigError, load_preset, resolve

    root, defaults = _command_spec(command)
    try:
        if command == "data":  # the data stage alone: `data=<preset>` picks the preset, keys are top-level
            picks = [o for o in overrides if o.startswith("data=")]
            base = load_preset("data", picks[-1].split("=", 1)[1]) if picks else load_preset("data", "default")
            rest = [o[len("data."):] if o.startswith("data.") else o for o in overrides if not o.startswith("data=")]
            return resolve(root, base, rest)
        return resolve(root, defaults, list(overrides))
    except ConfigError as e:
        raise click.ClickException(str(e)) from None


def _run(fn, *args):
    """Run a stage; expected failures (bad data, bad files) print one clear line and exit 1."""
    from cramlm.data.packed import PackedFormatError
    from cramlm.data.sources import DataError
    from cramlm.eval.tasks import TaskError

    try:
        return fn(*args)
    except (DataError, PackedFormatError, TaskError, FileNotFoundError, ValueError) as e:
        raise click.ClickException(str(e)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cramlm")
def main() -> None:
    """cramlm: pretrain and evaluate language models under a fixed compute budget."""


@main.command(context_settings=CONTEXT)
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def pretrain(overrides: tuple[str, ...]) -> None:
    """Pretrain a model. Defaults: arch=crammed-bert-tiny train=bert-o4-cpu data=default budget=1m.

    Example: cramlm pretrain arch=crammed-bert train=bert-o4 budget=24 name=bert24
    """
    from cramlm.pretrain import pretrain as run_pretrain

    _run(run_pretrain, _resolve("pretrain", overrides))


@main.command("eval", context_settings=CONTEXT)
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def eval_(overrides: tuple[str, ...]) -> None:
    """Fine-tune a pretrained run on labelled tasks and print dev scores.

    Example: cramlm eval name=bert24 eval=glue-sane eval.tasks=[path/to/task]
    """
    from cramlm.evaluate import evaluate

    _run(evaluate, _resolve("eval", overrides))


@main.group()
def data() -> None:
    """The data stage on its own."""


@data.command("prepare", context_settings=CONTEXT)
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@click.option("--cache", default="outputs/data", show_default=True, help="cache folder")
def data_prepare(overrides: tuple[str, ...], cache: str) -> None:
    """Read sources, train the tokenizer, write packed train/val files (cached by config hash).

    Example: cramlm data prepare data=default tokenizer.vocab_size=4096
    """
    import json

    from cramlm.data.prepare import prepare_data

    prepared = _run(prepare_data, _resolve("data", overrides), cache)
    print(json.dumps({"folder": str(prepared.folder), **prepared.manifest["documents"],
                      "train_tokens": prepared.manifest["train"]["tokens"],
                      "val_tokens": prepared.manifest["val"]["tokens"], "skipped": prepared.manifest["skipped"]}))


@main.group()
def config() -> None:
    """Inspect configs."""


@config.command("show", context_settings=CONTEXT)
@click.argument("command")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def config_show(command: str, overrides: tuple[str, ...]) -> None:
    """Print the fully resolved config of COMMAND (pretrain, eval, data) with OVERRIDES."""
    from cramlm.config.loader import to_yaml

    sys.stdout.write(to_yaml(_resolve(command, overrides)))


if __name__ == "__main__":
    main()
