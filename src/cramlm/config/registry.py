"""A small, explicit registry: (kind, type name) -> (config class, builder).

Kinds used by cramlm: ``model``, ``objective``, ``optimizer``, ``schedule``, ``source``. Registering
a component from your own module::

    from cramlm.config import register
    from cramlm.models.base import ModelConfig      # each kind's base class: BASES below

    class MyModelConfig(ModelConfig):
        type: Literal["my-model"] = "my-model"
        width: int = 256

    @register("model", "my-model", MyModelConfig)
    def build_my_model(cfg: MyModelConfig, vocab_size: int) -> torch.nn.Module: ...

and then ``cramlm pretrain plugins=[my_package.my_module] arch.type=my-model`` (or set the
``CRAMLM_PLUGINS`` environment variable to a comma-separated list of modules).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Annotated, Any, Callable

from pydantic import BeforeValidator, SerializeAsAny

from cramlm.config.base import ComponentConfig
from cramlm.io import did_you_mean


@dataclass(frozen=True)
class Entry:
    config: type[ComponentConfig]
    builder: Callable[..., Any] | None  # None: declared, builder not imported yet


_REGISTRY: dict[str, dict[str, Entry]] = {}
# Modules that register (or declare) cramlm's own components; imported lazily so that `import cramlm`
# and `cramlm --help` stay fast. None of them imports torch: validating a config never does.
_BUILTIN_MODULES = (
    "cramlm.models.config",
    "cramlm.models.objectives.config",
    "cramlm.train.config",
    "cramlm.train.schedules",
    "cramlm.data.sources",
)
# where the builders of declared components live (these import torch); imported on the first build
_BUILDER_MODULES = {"model": ("cramlm.models.crammed_bert", "cramlm.models.gpt"), "optimizer": ("cramlm.train.optim",),
                    "objective": tuple(f"cramlm.models.objectives.{name}" for name in ("mlm", "clm", "rtd", "hybrid"))}
_loaded_builtins = False
# Kinds whose built-in components all live in one light module: resolving one of those needs no
# other import (so `cramlm data ...` never imports torch: ~180 MB and ~2 s less)
_LIGHT_KINDS = {"source": "cramlm.data.sources"}


class RegistryError(ValueError):
    """Unknown or clashing registration (a ValueError, so config validation reports its key path)."""


# the class every config of a kind subclasses (named, not imported: the modules that define them register too)
BASES = {"model": "cramlm.models.base.ModelConfig", "objective": "cramlm.models.objectives.config.ObjectiveConfig",
         "optimizer": "cramlm.train.config.OptimizerConfig", "schedule": "cramlm.train.schedules.ScheduleConfig",
         "source": "cramlm.data.sources.SourceConfig"}


def _check_base(kind: str, name: str, config: type) -> None:
    base = BASES.get(kind)
    if base is not None and not any(f"{c.__module__}.{c.__qualname__}" == base for c in getattr(config, "__mro__", ())):
        raise RegistryError(f"{kind} '{name}': its config class {getattr(config, '__name__', config)} must subclass {base}")


def register(kind: str, name: str, config: type[ComponentConfig]):
    """Decorator registering ``builder`` under ``(kind, name)`` with its config class."""
    _check_base(kind, name, config)

    def wrap(builder: Callable[..., Any]) -> Callable[..., Any]:
        section = _REGISTRY.setdefault(kind, {})
        declared = name in section and section[name].builder is None and section[name].config is config
        if name in section and section[name].builder is not builder and not declared:
            raise RegistryError(f"{kind} '{name}' is already registered by {section[name].builder!r}")
        section[name] = Entry(config, builder)
        return builder

    return wrap


def declare(kind: str, name: str, config: type[ComponentConfig]) -> None:
    """Register ``config`` under ``(kind, name)`` before its builder (which ``register`` adds later,
    from a module in ``_BUILDER_MODULES``), so that configs validate without importing torch."""
    _check_base(kind, name, config)
    section = _REGISTRY.setdefault(kind, {})
    if name not in section:
        section[name] = Entry(config, None)
    elif section[name].config is not config:
        raise RegistryError(f"{kind} '{name}' is already registered with {section[name].config.__name__}")


def load_builtins() -> None:
    global _loaded_builtins
    if not _loaded_builtins:
        _loaded_builtins = True
        for module in _BUILTIN_MODULES:
            importlib.import_module(module)
        load_plugins(os.environ.get("CRAMLM_PLUGINS", "").split(","))


def load_plugins(modules: list[str]) -> None:
    for module in modules:
        module = module.strip()
        if module:
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise RegistryError(f"plugins: cannot import '{module}': {e}") from e


def names(kind: str) -> list[str]:
    load_builtins()
    return sorted(_REGISTRY.get(kind, {}))


def entry(kind: str, name: str | None) -> Entry:
    if kind in _LIGHT_KINDS:
        importlib.import_module(_LIGHT_KINDS[kind])
    if name not in _REGISTRY.get(kind, {}):
        load_builtins()
    section = _REGISTRY.get(kind, {})
    if name not in section:
        known = sorted(section)
        hint = did_you_mean(name, known) or " A plugin's type is registered once its module is imported: plugins=[my_module]."
        raise RegistryError(f"unknown {kind} type '{name}'; registered: {', '.join(known)}.{hint}")
    return section[name]


def config_class(kind: str, name: str | None) -> type[ComponentConfig]:
    return entry(kind, name).config


def builder(kind: str, name: str) -> Callable[..., Any]:
    """The builder registered under ``(kind, name)`` (a component only declared so far: its builder
    module registers it on import)."""
    found = entry(kind, name)
    if found.builder is None:
        for module in _BUILDER_MODULES.get(kind, ()):
            importlib.import_module(module)
        found = entry(kind, name)
        if found.builder is None:
            raise RegistryError(f"{kind} '{name}' is declared but no builder was registered for it")
    return found.builder


def build(kind: str, cfg: ComponentConfig, *args: Any, **kwargs: Any) -> Any:
    """Build the component described by ``cfg`` (its ``type`` selects the builder)."""
    return builder(kind, cfg.type)(cfg, *args, **kwargs)


def _resolve_component(kind: str):
    def resolve(value: Any) -> Any:
        if isinstance(value, dict):
            return config_class(kind, value.get("type")).model_validate(value)
        return value

    return resolve


def component(base: type[ComponentConfig]) -> Any:
    """Field annotation for a component slot: a dict is validated with the config class registered
    under its ``type`` and the concrete subclass is kept (and dumped with all its fields)."""
    return Annotated[SerializeAsAny[base], BeforeValidator(_resolve_component(base.kind))]
