"""Resolve a config from YAML presets, group selections and ``key=value`` overrides.

The command line follows cramming (Hydra): ``arch=crammed-bert`` selects the preset
``recipes/arch/crammed-bert.yaml`` for the group ``arch`` (a path to a YAML file works too), and
``train.optim.lr=1e-4`` sets one value. Every error names the full key path (or the file).

The rules, in the order they apply (``cramlm config show pretrain ...`` prints the result):

1. **Group picks first.** An override whose key is a group (``arch``, ``train``, ``data``,
   ``eval``, ``impl``) and whose value is a name picks that group's preset, whatever its position
   on the command line: ``train.optim.lr=1e-4 train=bert-o4`` keeps lr 1e-4.
2. **Presets extend presets.** A preset whose top-level key ``extends`` names another preset of
   its group (or a YAML file, relative to the preset's folder) is that base with the preset's keys
   merged on top, recursively; a cycle or an unknown base is an error naming the file. Merging
   (:func:`deep_merge`): mappings merge key by key; lists and scalars replace; a mapping whose
   ``type`` differs from the base's replaces the base's mapping whole, since the fields of one
   component (``optim: {type: adam}``) mean nothing to another (``adamw``).
3. **Overrides set one key each, in order.** The value is parsed as YAML (``1e-4`` is a float,
   ``[a,b]`` a list, ``null`` None); text YAML cannot parse is taken as written (``*.jsonl``), but
   an unclosed ``[``, ``{`` or quote is an error. A mapping value replaces the whole subtree
   (``train.optim={type: adam, lr: 1e-4}``), it is not merged; a number in the key indexes an
   existing list item (``data.sources.0.text_key=body``); a leading ``+`` is ignored (Hydra's).
   A component's ``type`` set to another type (``train.schedule.type=constant``) starts that
   component from the new type's defaults, keeping only keys earlier overrides set on it.
4. **Interpolations last.** ``${data.seq_length}`` and ``${oc.env:VAR,default}`` are resolved by
   OmegaConf after every override, so they see the final values. The resolved value is what every
   record of a run holds (config.yaml, checkpoints' state.json, eval.json, the report): an
   environment variable's value is written out as text, so a secret never goes through ``oc.env``.
5. **Validation** against the command's root class (:func:`validate`): unknown keys (with a close
   match), wrong types and out-of-range values are errors naming their key path; a component's
   ``type`` picks the config class its other keys are checked against.

A run recipe (``recipes/run/*.yaml``, :mod:`cramlm.pipeline.recipe`) is a tree of this kind whose
``overrides:`` mapping (dotted key -> value) is applied as ``key=<value as JSON>`` overrides
(JSON is YAML, so every value keeps its type) before the command line's own overrides.
"""

from __future__ import annotations

import typing
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ValidationError

from cramlm.config.base import ComponentConfig
from cramlm.io import did_you_mean

GROUPS = ("arch", "train", "data", "eval", "impl")


class ConfigError(ValueError):
    """A config could not be resolved; the message names the key path (and a close match)."""


def recipes_dir() -> Path:
    return Path(str(resources.files("cramlm") / "recipes"))


def available_presets(group: str) -> list[str]:
    folder = recipes_dir() / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


# What one YAML file may expand to. A config is a few hundred values; a "billion laughs" file (a
# few hundred bytes of anchors whose aliases nest: 14 levels x 9 aliases) expands to billions, and
# everything after parsing (merging, OmegaConf, validation) copies the expanded tree.
MAX_YAML_BYTES = 10_000_000
MAX_YAML_NODES = 100_000  # values after expanding every alias
MAX_YAML_DEPTH = 100  # nested mappings and lists


def safe_load_text(text: str, source: str, what: str = "") -> Any:
    """``yaml.safe_load`` of ``text`` with what it may expand to bounded (size, nodes after
    expanding aliases, depth, no alias that contains itself): the node graph is counted before any
    Python object is built. Errors are ConfigErrors naming ``source`` (a file, usually), after
    ``what`` (a config group) when given."""
    if what:
        try:
            return safe_load_text(text, source)
        except ConfigError as e:
            raise ConfigError(f"{what}: {e}") from None
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(f"{source}: {len(text):,} characters of YAML, more than a config may hold ({MAX_YAML_BYTES:,})")
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise ConfigError(f"{source}: YAML nested deeper than a config may be ({MAX_YAML_DEPTH} levels)") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"invalid YAML in {source}: {e}") from None
        if node is None:
            return None
        _check_expansion(node, source)
        try:
            return loader.construct_document(node)
        except yaml.YAMLError as e:
            raise ConfigError(f"invalid YAML in {source}: {e}") from None
    finally:
        loader.dispose()


def _check_expansion(root: yaml.Node, source: str) -> None:
    """Refuse a node graph whose expansion (every alias replaced by its anchor's value) has more
    than MAX_YAML_NODES values or MAX_YAML_DEPTH levels, or an alias inside its own anchor. Each
    distinct node is visited once (its expanded size is remembered), so counting is linear in the
    file, not in what it expands to."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    # iterative post-order walk: (node, children visited?)
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children)
            depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
            if size[key] > MAX_YAML_NODES and len(size) >= MAX_YAML_NODES:  # that many written out
                raise ConfigError(f"{source}: YAML holds more than {MAX_YAML_NODES:,} values; a config is far smaller")
            if size[key] > MAX_YAML_NODES:
                raise ConfigError(
                    f"{source}: YAML expands to more than {MAX_YAML_NODES:,} values (aliases of anchors that "
                    "hold aliases: a 'billion laughs' file?); a config is far smaller"
                )
            if depth[key] > MAX_YAML_DEPTH:
                raise ConfigError(f"{source}: YAML nested deeper than a config may be ({MAX_YAML_DEPTH} levels)")
            continue
        if key in size:
            continue
        if key in on_path:
            raise ConfigError(f"{source}: a YAML alias refers to an anchor that contains it (a recursive value)")
        on_path.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in on_path:
                raise ConfigError(f"{source}: a YAML alias refers to an anchor that contains it (a recursive value)")
            if id(child) not in size:
                stack.append((child, False))


def load_yaml(path: Path, what: str) -> dict[str, Any]:
    data = safe_load_text(path.read_text(encoding="utf-8"), str(path), what)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what}: {path} must hold a mapping, not {type(data).__name__}")
    return data


def _no_preset(group: str, name: str) -> str:
    known = available_presets(group)
    return f"no preset '{name}'; available: {', '.join(known)}.{did_you_mean(name, known)}"


def preset_path(group: str, name: str, folder: Path | None = None) -> Path:
    """The file of preset ``name`` of ``group``, or ``name`` itself when it is a YAML file (relative
    to ``folder`` when given: the folder of a preset that extends it)."""
    if name.endswith((".yaml", ".yml")):
        path = Path(name).expanduser()
        if folder is not None and not path.is_absolute():
            path = folder / path
        if path.is_file():
            return path
        if not (recipes_dir() / group / f"{name}.yaml").is_file():
            what = "is a folder, not a file" if path.is_dir() else "does not exist"
            raise ConfigError(f"{group}: {path} {what} (a YAML file for '{group}', or one of its presets: "
                              f"{', '.join(available_presets(group))})")
    path = recipes_dir() / group / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"{group}: {_no_preset(group, name)}")
    return path


def load_preset(group: str, name: str) -> dict[str, Any]:
    """``name`` is a preset of ``group`` or a path to a YAML file; its ``extends`` chain is resolved."""
    return _load_extending(group, preset_path(group, name), ())


def _load_extending(group: str, path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    here = path.resolve()
    if here in chain:
        cycle = " -> ".join(p.name for p in (*chain[chain.index(here):], here))
        raise ConfigError(f"{group}: {chain[-1]}: 'extends' makes a cycle: {cycle}")
    data = load_yaml(path, group)
    if "extends" not in data:
        return data
    base = data.pop("extends")
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{group}: {path}: 'extends' must name one preset of '{group}' or a YAML file, not {base!r}")
    try:
        base_path = preset_path(group, base, folder=path.parent)
    except ConfigError:
        raise ConfigError(f"{group}: {path}: extends {_no_preset(group, base)}") from None
    return deep_merge(_load_extending(group, base_path, (*chain, here)), data)


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``update`` on top of ``base``: mappings merge key by key, anything else replaces; a mapping
    whose ``type`` differs from the base's replaces it whole (another component's fields)."""
    out = dict(base)
    for key, value in update.items():
        old = out.get(key)
        if isinstance(value, dict) and isinstance(old, dict) and value.get("type", old.get("type")) == old.get("type"):
            out[key] = deep_merge(old, value)
        else:
            out[key] = value
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like key=value (e.g. train.optim.lr=1e-4)")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("+")
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override '{text}': empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        # A value that opens a YAML list, mapping or quoted string must close it: `data.name=[1,` is a
        # typo, not the name "[1,". Other unparsable text (a glob like `*.jsonl`) is taken as written.
        if raw.strip()[:1] in ("[", "{", '"', "'"):
            problem = str(getattr(e, "problem", None) or e).strip()
            raise ConfigError(
                f"{key}: invalid YAML value {raw!r} ({problem}); quote it to pass it as text: {key}=\"'{raw}'\""
            ) from None
        value = raw
    return key.split("."), value


def _list_index(node: list, part: str, path: list[str], i: int) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ConfigError(f"{'.'.join(path)}: '{'.'.join(path[:i])}' is a list of {len(node)}; no item '{part}'")
    return int(part)


def set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    """Set ``tree[a][b]... = value`` for the key path; a number indexes an existing list item
    (``data.sources.0.text_key=body``)."""
    node: Any = tree
    for i, part in enumerate(path[:-1]):
        if isinstance(node, list):
            child = node[_list_index(node, part, path, i)]
        else:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
        if not isinstance(child, (dict, list)):
            raise ConfigError(f"{'.'.join(path)}: '{'.'.join(path[: i + 1])}' is not a mapping")
        node = child
    if isinstance(node, list):
        node[_list_index(node, path[-1], path, len(path) - 1)] = value
    else:
        node[path[-1]] = value


def _node(tree: Any, path: list[str]) -> Any:
    """The value at ``path`` (digits index lists), or None where there is none."""
    node = tree
    for part in path:
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _switch_type(tree: dict[str, Any], path: list[str], value: Any, applied: list[list[str]]) -> None:
    """``x.type=<another type>`` on the command line: the component ``x`` starts from that type's
    own defaults (as a preset's mapping with another ``type`` does, rule 2), keeping only the keys
    earlier overrides set on it: ``train.schedule.type=constant`` alone is a valid constant schedule,
    not one carrying the cosine schedule's other keys."""
    node = _node(tree, path[:-1])
    if not isinstance(node, dict) or node.get("type") in (None, value):
        return
    depth = len(path) - 1
    kept = {p[depth] for p in applied if len(p) > depth and p[:depth] == path[:-1]}
    for key in [k for k in node if k not in kept]:
        del node[key]


def compose(defaults: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply group selections then key overrides to a command's ``defaults`` (a dict whose group
    keys hold preset names)."""
    tree = dict(defaults)
    parsed = [parse_override(o) for o in overrides]
    for path, value in parsed:  # group selections first, whatever their order on the command line
        if len(path) == 1 and path[0] in GROUPS and isinstance(value, str):
            tree[path[0]] = value
    for group in GROUPS:
        if isinstance(tree.get(group), str):
            tree[group] = load_preset(group, tree[group])
    applied: list[list[str]] = []
    for path, value in parsed:
        if len(path) == 1 and path[0] in GROUPS and isinstance(value, str):
            continue
        if path[-1] == "type" and len(path) > 1:
            _switch_type(tree, path, value, applied)
        set_path(tree, path, value)
        applied.append(path)
    try:  # OmegaConf resolves ${...} interpolations between keys, e.g. ${data.seq_length}
        return OmegaConf.to_container(OmegaConf.create(tree), resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        raise ConfigError(f"{getattr(e, 'full_key', '') or 'config'}: {e.msg if hasattr(e, 'msg') else e}") from None


# ---------------------------------------------------------------- validation with full key paths


def _unwrap(annotation: Any) -> list[type]:
    """Model classes an annotation can hold (through Optional, list, Annotated, ...)."""
    origin = typing.get_origin(annotation)
    if origin is None:
        return [annotation] if isinstance(annotation, type) and issubclass(annotation, BaseModel) else []
    return [c for arg in typing.get_args(annotation) for c in _unwrap(arg)]


def _model_at(root: type[BaseModel], loc: tuple[Any, ...], data: Any) -> type[BaseModel] | None:
    """The config class that owns the key at ``loc[-1]`` (for close-match hints)."""
    cls: type[BaseModel] | None = root
    node = data
    for part in loc[:-1]:
        if cls is None:
            return None
        if isinstance(part, int):
            node = node[part] if isinstance(node, list) and part < len(node) else None
        else:
            field = cls.model_fields.get(part)
            node = node.get(part) if isinstance(node, dict) else None
            if field is None:
                return None
            candidates = _unwrap(field.annotation)
            cls = candidates[0] if candidates else None
        # a component (also an item of a list of them, e.g. data.sources.0): the class of its type
        if cls is not None and issubclass(cls, ComponentConfig) and isinstance(node, dict):
            from cramlm.config.registry import RegistryError, config_class

            try:
                cls = config_class(cls.kind, node.get("type"))
            except RegistryError:  # an unknown type: its own error says so
                return cls
    return cls


def _clean_loc(e: dict[str, Any], data: Any) -> tuple[Any, ...]:
    """The error's key path without pydantic's validator and union-branch tags
    (``train.batch_size.constrained-int`` -> ``train.batch_size``): a string part that is not a key of
    the input at that point is a tag, except the last part of a missing-key error."""
    loc = [p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
    out: list[Any] = []
    node = data
    for i, part in enumerate(loc):
        if isinstance(part, int):
            node = node[part] if isinstance(node, (list, tuple)) and part < len(node) else None
        elif isinstance(node, dict) and part in node:
            node = node[part]
        elif not (i == len(loc) - 1 and e["type"] == "missing"):
            continue  # a tag: the input has no such key here
        out.append(part)
    return tuple(out)


def format_errors(root: type[BaseModel], err: ValidationError, data: Any, prefix: str = "") -> str:
    lines = []
    value_errors: dict[str, tuple[list[str], Any]] = {}  # path -> (messages of each union branch, input)
    for e in err.errors():
        loc = _clean_loc(e, data)
        path = prefix + ".".join(str(p) for p in loc)
        if e["type"] == "extra_forbidden":
            owner = _model_at(root, loc, data)
            known = sorted(owner.model_fields) if owner else []
            hint = did_you_mean(loc[-1], known, path.rsplit(".", 1)[0] + "." if "." in path else "")
            lines.append(f"{path}: unknown key.{hint} Known keys here: {', '.join(known)}")
        else:
            msg = e["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, ") :]
            messages, _ = value_errors.setdefault(path, ([], e.get("input")))
            if msg not in messages:
                messages.append(msg)
    for path, (messages, got) in value_errors.items():
        shown = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
        # an error of the whole config (a check across keys) names its keys itself
        text = ", or ".join(m if i == 0 else m[:1].lower() + m[1:] for i, m in enumerate(messages))
        lines.append(f"{path}: {text}{shown}" if path else text)
    return "invalid config:\n  " + "\n  ".join(lines)


def validate(root: type[BaseModel], data: dict[str, Any]) -> BaseModel:
    """Validate ``data`` into ``root``; any error becomes a ConfigError naming the key paths."""
    from cramlm.config.registry import RegistryError, load_builtins, load_plugins

    plugins = data.get("plugins") or []
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise ConfigError(f"invalid config:\n  plugins: a list of module names, e.g. plugins=[my_package.my_module] "
                          f"(got {plugins!r})")
    try:
        load_builtins()  # CRAMLM_PLUGINS too
        load_plugins(plugins)
        return root.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_errors(root, err, data)) from None
    except RegistryError as err:  # raised by load_plugins
        raise ConfigError(str(err)) from None


def resolve(root: type[BaseModel], defaults: dict[str, Any], overrides: list[str]) -> BaseModel:
    return validate(root, compose(defaults, overrides))


def to_yaml(cfg: BaseModel) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
