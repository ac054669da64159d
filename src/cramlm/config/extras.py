"""Optional dependencies a config asks for, checked right after a command resolves its config: a
missing one stops the command before any data is prepared or any run folder is made, and names the
pip extra that installs it (``pip install 'cramlm[tensorboard]'``)."""

from __future__ import annotations

import importlib.util
from typing import Any

from cramlm.config.loader import ConfigError


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it: tensorboard, wandb are slow to load)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        return False


def _sources(data: Any) -> list[Any]:
    return list(getattr(data, "sources", None) or [])


def requirements(cfg: Any) -> list[tuple[str, str, str]]:
    """(config key, module, extra) for every optional dependency ``cfg`` needs. Works on any root
    config (pretrain, data, eval, run): it looks at the groups the root has."""
    need = []
    impl = getattr(cfg, "impl", None)
    if getattr(impl, "tensorboard", False):
        need.append(("impl.tensorboard=true", "tensorboard", "tensorboard"))
    if getattr(impl, "wandb", False):
        need.append(("impl.wandb=true", "wandb", "wandb"))
    data = getattr(cfg, "data", None)
    if data is not None and hasattr(data, "sources"):
        for i, source in enumerate(_sources(data)):
            kind, path = getattr(source, "type", None), str(getattr(source, "path", ""))
            if kind == "parquet":
                need.append((f"data.sources.{i}.type=parquet", "pyarrow", "parquet"))
            elif kind == "hf":
                need.append((f"data.sources.{i}.type=hf", "datasets", "hf-datasets"))
            if path.endswith(".zst"):
                need.append((f"data.sources.{i}.path={path}", "zstandard", "zstd"))
        if getattr(getattr(data, "dedup", None), "near", False):
            need.append(("data.dedup.near=true", "datasketch", "dedup"))
    checkpoint = getattr(cfg, "checkpoint", None)
    if isinstance(checkpoint, str) and checkpoint.startswith("hf://"):
        need.append((f"checkpoint={checkpoint}", "transformers", "hf"))
    ev = getattr(cfg, "eval", None)
    if getattr(ev, "glue_dir", None) == "hf":
        need.append(("eval.glue_dir=hf", "datasets", "glue"))
    return need


def check_extras(cfg: Any) -> None:
    """Raise a ConfigError naming each missing optional dependency, its key and its extra."""
    missing = [(key, module, extra) for key, module, extra in requirements(cfg) if not installed(module)]
    if missing:
        lines = [f"{key} needs the `{module}` package: pip install 'cramlm[{extra}]'" for key, module, extra in missing]
        raise ConfigError("missing optional dependency:\n  " + "\n  ".join(lines))
