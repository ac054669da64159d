"""Typed config tree, YAML presets with overrides, and the component registry."""

from cramlm.config.base import ComponentConfig, Config
from cramlm.config.loader import ConfigError, compose, resolve, to_yaml, validate
from cramlm.config.registry import build, component, register

__all__ = [
    "ComponentConfig",
    "Config",
    "ConfigError",
    "build",
    "component",
    "compose",
    "register",
    "resolve",
    "to_yaml",
    "validate",
]
