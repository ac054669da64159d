"""What every ``cramlm`` subcommand shares: its root config (resolved with overrides) and failures as one
``Error:`` line."""

from __future__ import annotations

import errno
import json
import importlib
import re
from pathlib import Path
from typing import Any, Callable

import click

# ignore_unknown_options lets `key=value` overrides through untouched
OVERRIDES = {"help_option_names": ["-h", "--help"], "ignore_unknown_options": True}

# command name -> "module:ROOT_CLASS:DEFAULTS"; resolved lazily so `cramlm --help` stays fast
COMMAND_CONFIGS: dict[str, str] = {
    "pretrain": "cramlm.run.pretrain:PretrainConfig:DEFAULTS",
    "eval": "cramlm.eval.evaluate:EvalRunConfig:DEFAULTS",
    "data": "cramlm.data.prepare:PrepareConfig:PREPARE_DEFAULTS",
}


def command_spec(command: str) -> tuple[type, dict[str, Any]]:
    if command not in COMMAND_CONFIGS:
        raise click.BadParameter(f"unknown command '{command}'; choose {', '.join(COMMAND_CONFIGS)}")
    module, root, defaults = COMMAND_CONFIGS[command].split(":")
    mod = importlib.import_module(module)
    return getattr(mod, root), getattr(mod, defaults)


def resolve_or_exit(command: str, overrides: tuple[str, ...] | list[str], check_extras: bool = True):
    """The validated root config of ``command``; a config error exits with its message, and so
    does a missing optional dependency the config needs (unless ``check_extras`` is false: only
    showing a config needs none)."""
    from cramlm.config.extras import check_extras as check
    from cramlm.config.loader import ConfigError, resolve

    root, defaults = command_spec(command)
    try:
        cfg = resolve(root, defaults, list(overrides))
        if check_extras:
            check(cfg)
        return cfg
    except ConfigError as e:
        raise click.ClickException(str(e)) from None


def with_allowed_changes(resume: str | None, allow_change: tuple[str, ...]) -> list[str]:
    """``--resume X --allow-change K ...`` as overrides (``resume=X``, ``allow_change=[K, ...]``)."""
    if allow_change and not resume:
        raise click.UsageError("--allow-change applies to a resume: add --resume auto (or a checkpoint folder)")
    out = [f"resume={json.dumps(resume)}"] if resume else []  # quoted: a path is text, whatever it holds ('#', ': ')
    return out + ([f"allow_change=[{','.join(allow_change)}]"] if allow_change else [])


def final_name(filename: Any) -> Any:
    """The file a temporary was written for (io.atomic_path: ``.<name>.tmp-<pid>``), else ``filename``."""
    path = Path(str(filename))
    found = re.fullmatch(r"\.(.+)\.tmp-\d+", path.name)
    return str(path.with_name(found.group(1))) if found else filename


def run_or_exit(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a stage; expected failures (bad data, bad files, bad values, a file or folder the system
    refuses: missing, no permission, disk full) print one clear line and exit 1."""
    from cramlm.data.cramtok import PackedFormatError
    from cramlm.data.sources import DataError
    from cramlm.eval.tasks import TaskError
    from cramlm.locks import LockHeld

    try:
        return fn(*args)
    except (DataError, PackedFormatError, TaskError, ValueError, LockHeld) as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:
        if not e.filename:  # raised by cramlm with its own message
            raise click.ClickException(str(e)) from None
        full = "disk full: " if e.errno == errno.ENOSPC else ""  # partial outputs are removed on the way out
        raise click.ClickException(f"{final_name(e.filename)}: {full}{e.strerror or e}") from None
    except Exception as e:  # a library's own error around a full disk (safetensors, torch.save): one line still
        from cramlm.io import is_disk_full

        if is_disk_full(e):
            raise click.ClickException(f"disk full: {type(e).__name__}: {e}") from None
        raise
