"""Plug-ins: the entry-point groups where packages register with corral, read once.

corral registers its own executors the same way a package outside corral would (in its
pyproject.toml), so there is one table to read, whoever wrote the entry. Reading names
imports nothing; loading one imports just the module that entry names.
"""

from __future__ import annotations

import functools
from importlib import metadata
from typing import Any

from corral import errors

EXECUTORS = "corral.executors"
"""The group executors register in (see corral.executors.registry)."""


@functools.cache
def _entries(group: str) -> tuple[metadata.EntryPoint, ...]:
    """The entries of `group`, read once: each read walks every installed distribution."""
    return tuple(metadata.entry_points(group=group))


@functools.cache
def names(group: str) -> tuple[str, ...]:
    """The names registered in `group`, sorted."""
    return tuple(sorted({ep.name for ep in _entries(group)}))


@functools.cache
def load(group: str, name: str) -> Any:
    """The object entry `name` of `group` points at. ConfigError when there is none, when
    two packages registered the name, or when it cannot be imported."""
    found = [ep for ep in _entries(group) if ep.name == name]
    if not found:
        known = ", ".join(names(group)) or "none: is corral installed (pip install -e .)?"
        raise errors.ConfigError(f"no {group} entry named {name!r}; registered: {known}")
    if len({ep.value for ep in found}) > 1:
        raise errors.ConfigError(
            f"{group} {name!r} is registered twice: {', '.join(ep.value for ep in found)}"
        )
    try:
        return found[0].load()
    except (ImportError, AttributeError) as exc:
        raise errors.ConfigError(f"{group} {name!r} ({found[0].value}) cannot load: {exc}") from exc
