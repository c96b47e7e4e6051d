"""mkdocs hook: the settings reference, generated from corral.config.Settings and the models
of its groups (corral.timeouts, corral.alert_settings, each executor's own).

A page that holds the line `<!-- corral-settings -->` gets, in its place, one section per
settings model (Settings, then each nested model) and in it every field: its TOML name,
description, type, default and environment variable. A setting added to the models
appears in the docs without anyone editing a page, and a field without a description (or
a nested model without a docstring) fails the build, so the models keep their docs.
"""

from __future__ import annotations

import html
import inspect
import types
import typing
from datetime import timedelta
from pathlib import Path
from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from mkdocs.exceptions import PluginError
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from corral import config

PLACEHOLDER = "<!-- corral-settings -->"
_UNITS = (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0))


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Replace the placeholder with the generated reference."""
    if PLACEHOLDER not in markdown:
        return markdown
    return markdown.replace(PLACEHOLDER, settings_reference(config.Settings))


OPENAPI = "reference/openapi.json"


def on_files(files: Any, config: Any, **_: Any) -> Any:
    """Publish the API's OpenAPI document with the docs, made from the app itself."""
    import json

    from mkdocs.structure.files import File

    from corral.api import create_app

    document = create_app(None).openapi()  # type: ignore[arg-type]  # the routes only
    files.append(File.generated(config, OPENAPI, content=json.dumps(document, indent=2)))
    return files


def on_post_build(config: Any, **_: Any) -> None:
    """Fail when no page asked for the reference, so it cannot quietly vanish."""
    docs = Path(config["docs_dir"])
    if not any(PLACEHOLDER in p.read_text(encoding="utf-8") for p in docs.rglob("*.md")):
        raise PluginError(f"no page in {docs} holds {PLACEHOLDER}: the settings reference is gone")


class _Section:
    """One table: a model's fields under a TOML table name (`timeouts`, ...)."""

    def __init__(
        self, model: type[BaseModel], toml: str, env: str | None, within: str = ""
    ) -> None:
        self.model, self.toml, self.env = model, toml, env
        self.within = within  # the variable whose JSON holds this table, when env is None


def settings_reference(root: type[BaseModel]) -> str:
    root.model_rebuild()  # Settings learns the executors' tables from their registrations
    prefix = str(root.model_config.get("env_prefix", ""))
    delimiter = str(root.model_config.get("env_nested_delimiter", "__"))
    pending = [_Section(root, "", prefix)]
    out: list[str] = []
    while pending:
        section = pending.pop(0)
        out += _table(section, delimiter, pending)
    return "\n".join(out) + "\n"


def _table(section: _Section, delimiter: str, pending: list[_Section]) -> list[str]:
    model = section.model
    doc = inspect.getdoc(model)
    if not doc or model.__doc__ is None:
        raise PluginError(
            f"{model.__qualname__} has no docstring: describe it in {model.__module__}"
        )
    heading = f"`[{section.toml}]`" if section.toml else "Top level"
    if section.toml.endswith("[]"):
        heading = f"Each item of `{section.toml[:-2]}`"
    lines = [f"## {heading}", "", _flatten(doc), ""]
    nested: list[_Section] = []
    for name, field in model.model_fields.items():
        dotted = f"{section.toml}.{name}" if section.toml else name
        env = f"{section.env}{name.upper()}" if section.env is not None else None
        if (sub := _model_of(field.annotation)) is not None:
            inner_env = f"{env}{delimiter}" if env is not None else None
            nested.append(_Section(sub, dotted, inner_env, section.within))
            continue
        if field.description is None:
            raise PluginError(
                f"{model.__qualname__}.{name} ({dotted}) has no description: add"
                f" description= to its Field in {model.__module__}"
            )
        if (inner := _collection_model(field.annotation)) is not None:
            item = f"{dotted}.NAME" if _is_mapping(field.annotation) else f"{dotted}[]"
            nested.append(_Section(inner, item, None, env or section.within))
        lines += [
            # The anchor is the setting's dotted name; the table of contents shows its last part.
            f"### `{dotted}` {{ #{dotted.replace('[]', '')} data-toc-label='{name}' }}",
            "",
            _flatten(field.description),
            "",
            f"**type** {_type(field)} · **default** {_default(field)}"
            f" · **environment** {_env(env, field, section)}",
            "",
        ]
    pending[:0] = nested
    return lines


def _env(env: str | None, field: FieldInfo, section: _Section) -> str:
    if env is None:
        return f"in the JSON of `{section.within}`"
    json = " (JSON)" if _model_of(field.annotation) is None and _is_container(field) else ""
    return f"`{env}`{json}"


def _flatten(text: str) -> str:
    """One line of Markdown; `<state_dir>` and the like stay text, not HTML."""
    return " ".join(text.split()).replace("<", "&lt;").replace(">", "&gt;")


def _args(annotation: Any) -> tuple[Any, ...]:
    return typing.get_args(annotation)


def _is_optional(annotation: Any) -> bool:
    return _is_union(annotation) and type(None) in _args(annotation)


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _is_mapping(annotation: Any) -> bool:
    return typing.get_origin(annotation) is dict


def _is_container(field: FieldInfo) -> bool:
    return typing.get_origin(field.annotation) in (dict, tuple, list)


def _collection_model(annotation: Any) -> type[BaseModel] | None:
    if typing.get_origin(annotation) in (dict, tuple, list):
        for arg in _args(annotation):
            if (found := _model_of(arg)) is not None:
                return found
    return None


def _type(field: FieldInfo) -> str:
    text = _type_name(field.annotation)
    bounds = []
    for meta in field.metadata:
        if isinstance(meta, Ge | Gt):
            low = meta.ge if isinstance(meta, Ge) else meta.gt
            bounds.append(f"{'≥' if isinstance(meta, Ge) else '>'} {_number(low)}")
        elif isinstance(meta, Le | Lt):
            high = meta.le if isinstance(meta, Le) else meta.lt
            bounds.append(f"{'≤' if isinstance(meta, Le) else '<'} {_number(high)}")
        elif pattern := getattr(meta, "pattern", None):
            bounds.append(f"matches <code>{html.escape(pattern)}</code>")
    return text + (f" ({', '.join(bounds)})" if bounds else "")


def _type_name(annotation: Any) -> str:
    if _is_optional(annotation):
        rest = [a for a in _args(annotation) if a is not type(None)]
        return " or ".join(_type_name(a) for a in rest) + ", or unset"
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(f'`"{v}"`' for v in _args(annotation))
    if origin is dict:
        return f"table of {_type_name(_args(annotation)[1])}"
    if origin in (tuple, list):
        return f"list of {_type_name(_args(annotation)[0])}"
    if (model := _model_of(annotation)) is not None:
        return f"`{model.__name__}`"
    names = {timedelta: "duration", int: "integer", float: "number", str: "string"}
    names |= {bool: "boolean", Path: "path"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    return _toml(value)


def _toml(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, timedelta):
        return f'`"{_duration(value)}"`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str | Path):
        return f'`"{value}"`'
    if isinstance(value, dict) and not value:
        return "`{}`"
    if isinstance(value, tuple | list):
        return "`[" + ", ".join(_toml(v).strip("`") for v in value) + "]`"
    if isinstance(value, float):
        return f"`{_number(value)}`"
    return f"`{value}`"


def _number(value: Any) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _duration(value: timedelta) -> str:
    seconds = value.total_seconds()
    for unit, size in _UNITS:
        if seconds >= size and (seconds / size).is_integer():
            return f"{seconds / size:g}{unit}"
    return f"{seconds * 1000:g}ms"
