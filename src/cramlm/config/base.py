"""Base classes for the typed config tree.

Every config class forbids unknown keys, so a typo fails before any work starts. A *component*
config (a model, optimizer, schedule, data source, ...) carries a ``type`` field that names the
registered class to build; see :mod:`cramlm.config.registry` (and its :func:`component` slots).
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

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


# What a resume may change, as a property of each field (``Field(..., json_schema_extra=RESUME_FREE)``);
# every other field changes the maths and a resume refuses its change unless allowed (train/checkpoint.py)
RESUME_FREE = {"resume": "free"}  # changes no maths: where the run lives, how it is watched, stored or run
RESUME_GROW = {"resume": "grow"}  # a budget: a resume may let the run go on at least as long (null: no limit)


# A field added after results were recorded: at its default it is left out of every key a stage or
# data cache is found by (``key_dump``), so what was made before it existed is found again
KEYLESS_DEFAULT = {"key": "omit-default"}


def key_dump(cfg: BaseModel) -> dict:
    """``cfg.model_dump(mode="json")`` without the ``KEYLESS_DEFAULT`` fields that hold their default,
    through nested configs: what stage and cache keys hash."""
    dump = cfg.model_dump(mode="json")
    for name, field in type(cfg).model_fields.items():
        value = getattr(cfg, name)
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if extra.get("key") == KEYLESS_DEFAULT["key"] and value == field.get_default(call_default_factory=True):
            del dump[name]
        elif isinstance(value, BaseModel):
            dump[name] = key_dump(value)
    return dump


def resume_policy(cls: type[BaseModel], prefix: str = "") -> dict[str, str]:
    """{dotted key: 'free' | 'grow'} for each field of ``cls``, through its nested configs, that
    carries a resume policy (a policy on a nested config's field covers all of it: ``impl``)."""
    out: dict[str, str] = {}
    for name, field in cls.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if "resume" in extra:
            out[prefix + name] = extra["resume"]
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out.update(resume_policy(field.annotation, f"{prefix}{name}."))
    return out


class ComponentConfig(Config):
    """Config of a registered component. ``kind`` is the registry section (set on the base class
    of each section), ``type`` the registered name of the concrete component."""

    kind: ClassVar[str] = ""
    type: str = Field(description="the registered name of the component to build")


_NAME = re.compile(r"\w[\w.+=@,-]*")
MAX_NAME_BYTES = 200


def _safe_name(value: str) -> str:
    """One plain folder name: it can neither leave its parent (``..``, ``/``, an absolute path) nor
    be empty, hidden or an option (``.x``, ``-x``)."""
    rule = (f"one folder name of at most {MAX_NAME_BYTES} bytes: letters, digits and the characters . _ - + = @ , "
            "starting with a letter or digit (no '/', '..', ';', spaces or leading '.')")
    if not value:
        raise ValueError(f"must be {rule}; it is empty")
    if len(value.encode()) > MAX_NAME_BYTES:
        raise ValueError(f"must be {rule}; it is {len(value.encode())} bytes")
    if not _NAME.fullmatch(value):
        bad = sorted({c for c in value if not (c.isalnum() or c in "._-+=@,")})
        what = f"{', '.join(repr(c) for c in bad)} not allowed" if bad else "it must start with a letter or digit"
        raise ValueError(f"must be {rule}; {what}")
    return value


# a run name: the folder <base_dir>/<name> of a run, never anything outside base_dir
SafeName = Annotated[str, AfterValidator(_safe_name)]
