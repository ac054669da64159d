"""Base classes for the typed config tree.

Every config class forbids unknown keys, so a typo fails before any work starts. A *component*
config (a model, optimizer, schedule, data source, ...) carries a ``type`` field that names the
registered class to build; see :mod:`cramlm.config.registry`.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, SerializeAsAny


class Config(BaseModel):
    """A node of the config tree: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())


class ComponentConfig(Config):
    """Config of a registered component. ``kind`` is the registry section (set on the base class
    of each section), ``type`` the registered name of the concrete component."""

    kind: ClassVar[str] = ""
    type: str


def _resolve_component(kind: str):
    def resolve(value: Any) -> Any:
        if isinstance(value, dict):
            from cramlm.config.registry import config_class

            return config_class(kind, value.get("type")).model_validate(value)
        return value

    return resolve


def component(base: type[ComponentConfig]) -> Any:
    """Field annotation for a component slot: a dict is validated with the config class registered
    under its ``type`` and the concrete subclass is kept (and dumped with all its fields)."""
    return Annotated[SerializeAsAny[base], BeforeValidator(_resolve_component(base.kind))]
