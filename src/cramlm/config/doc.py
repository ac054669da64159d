"""Each key of a resolved config with its type, default and description (``cramlm config show
COMMAND ... --doc``). The descriptions are the fields' ``Field(description=...)``; a subclass that
only changes a field's default (``CrammedBertConfig.num_layers``) keeps its base class's text."""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

_BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


@dataclass(frozen=True)
class KeyDoc:
    key: str  # dotted path, e.g. train.optim.lr
    type: str
    default: str  # "required" when the field has none
    value: Any  # the resolved value (JSON)
    description: str


def _bounds(metadata: list[Any]) -> str:
    # a Field(ge=1) inside Annotated (PositiveInt within a union) keeps its bounds in its own metadata
    flat = [c for m in metadata for c in (m.metadata if isinstance(m, FieldInfo) else [m])]
    out = [f"{sign} {getattr(m, name)}" for m in flat for name, sign in _BOUNDS if getattr(m, name, None) is not None]
    return f" {', '.join(out)}" if out else ""


def type_name(annotation: Any, metadata: list[Any] | tuple[Any, ...] = ()) -> str:
    """``PositiveInt | None`` -> ``int >= 1 | null``; ``Literal["a", "b"]`` -> ``a | b``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0], [*args[1:], *metadata])
    if origin is Literal:
        text = " | ".join(str(a) for a in args)
    elif origin in (typing.Union, types.UnionType):
        text = " | ".join(type_name(a) for a in args)
    elif origin is not None:
        text = f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(a) for a in args)}]"
    elif annotation is type(None):
        text = "null"
    else:
        text = getattr(annotation, "__name__", str(annotation))
    return text + _bounds(list(metadata))


def description(cls: type[BaseModel], name: str) -> str:
    for base in cls.__mro__:
        field = getattr(base, "model_fields", {}).get(name) if isinstance(base, type) and issubclass(base, BaseModel) else None
        if field is not None and field.description:
            return field.description
    return ""


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return "(computed)"
    if field.default is PydanticUndefined:
        return "required"
    default = field.default
    extra = field.json_schema_extra
    if isinstance(extra, dict) and "shown_default" in extra:  # as a person writes it: budget 1m, not 0.01666...
        return str(extra["shown_default"])
    if isinstance(default, BaseModel):
        default = default.model_dump(mode="json")
    return json.dumps(default, default=str)


def describe(cfg: BaseModel, values: dict[str, Any] | None = None, prefix: str = "") -> list[KeyDoc]:
    """A :class:`KeyDoc` per leaf key of ``cfg`` (a validated config: components are described by
    the class their ``type`` picked). ``values`` is the dump to show (default: ``cfg.model_dump``)."""
    values = cfg.model_dump(mode="json") if values is None else values
    out: list[KeyDoc] = []
    cls = type(cfg)
    for name, field in cls.model_fields.items():
        key, value = prefix + name, getattr(cfg, name)
        shown = values.get(name)
        if isinstance(value, BaseModel):
            out += describe(value, shown, key + ".")
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, BaseModel) for v in value):
            for i, item in enumerate(value):
                out += describe(item, shown[i], f"{key}.{i}.")
        else:
            out.append(KeyDoc(key, type_name(field.annotation, field.metadata), _default(field), shown,
                              description(cls, name)))
    return out


def format_docs(docs: list[KeyDoc]) -> str:
    """Two lines a key: ``key: value  # type, default: ...`` then the description (if any)."""
    lines = []
    for d in docs:
        lines.append(f"{d.key}: {json.dumps(d.value)}  # {d.type}; default: {d.default}")
        if d.description:
            lines.append(f"    {d.description}")
    return "\n".join(lines) + "\n"
