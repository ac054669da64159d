"""Base classes for the typed config tree.

Every config class forbids unknown keys, so a typo fails before any work starts. A *component*
config (a model, optimizer, schedule, data source, ...) carries a ``type`` field that names the
registered class to build; see :mod:`cramlm.config.registry`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, SerializeAsAny

# Range-checked field types for the config classes (floats are finite anyway: see Config)
PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
UnitFloat = Annotated[float, Field(ge=0, le=1)]  # a fraction in [0, 1]
Probability = Annotated[float, Field(gt=0, le=1)]


class Config(BaseModel):
    """A node of the config tree: unknown keys are errors, assignments are validated, and no float
    may be inf or NaN (``lr=.inf`` would silently train a NaN model)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=(), allow_inf_nan=False)


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


_NAME = re.compile(r"\w[\w.+=@,-]*")


def _safe_name(value: str) -> str:
    """One plain folder name: it can neither leave its parent (``..``, ``/``, an absolute path) nor
    be empty, hidden or an option (``.x``, ``-x``)."""
    if not _NAME.fullmatch(value) or len(value.encode()) > 200:
        raise ValueError(
            "must be one folder name (letters, digits and . _ - + = @ , ; starting with a letter or digit; "
            "no '/', '..' or leading '.')"
        )
    return value


# a run name: the folder <base_dir>/<name> of a run, never anything outside base_dir
SafeName = Annotated[str, AfterValidator(_safe_name)]
