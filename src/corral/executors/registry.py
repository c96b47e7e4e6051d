"""The one table of executors: every kind corral can run, read from the entry-point group
`corral.executors`. corral registers its own there (pyproject.toml); a package outside
corral adds one the same way, pointing at a Registration:

    [project.entry-points."corral.executors"]
    nomad = "corral_nomad:REGISTRATION"

Settings (`executors.enabled`, each executor's table), the runtime, the CLI (`--executor`,
`--image`, `--dry-run`), the client (spec checks, heartbeat reach) and the executor contract suite
all read this table, so adding an executor touches nothing else in corral. A registration
must be cheap to import: build the executor, and import heavy clients, only when asked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from corral import entrypoints, errors

if TYPE_CHECKING:  # not at run time: `corral submit --help` lists the kinds, nothing more
    from pydantic import BaseModel

    from corral import clock, config, model
    from corral.executors import rbac
    from corral.executors.base import Executor

GROUP = entrypoints.EXECUTORS


class SpecChecker(Protocol):
    """What checking a job's spec needs of an executor (no platform is asked)."""

    def validate_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]: ...


DryRun: TypeAlias = "Callable[[model.NewJob, config.Settings, datetime], dict[str, Any]]"


@dataclass(frozen=True, slots=True)
class Registration:
    """How corral knows one executor."""

    kind: str
    """The name jobs use (`--executor KIND`, `executors.enabled`): the entry's name."""
    summary: str
    """One line: what an attempt becomes on this platform."""
    build: Callable[[config.Settings, clock.Clock], Executor]
    """The executor these settings make, not yet started."""
    checker: Callable[[config.Settings], SpecChecker] | None = None
    """What checks a spec without starting anything (for --dry-run); default: build it."""
    dry_run: DryRun | None = None
    """The platform object a job's first attempt would create, for `--dry-run`."""
    container: bool = False
    """The spec is an image and a command: the CLI's --image and --placement apply."""
    reach: Callable[[config.Settings], str | None] | None = None
    """Why a job that sends heartbeats cannot reach corral from this platform with these
    settings (what to set), or None when it can."""
    rules: Callable[[], rbac.Rules] | None = None
    """The Kubernetes API calls it makes, for its Role (`corral deploy rbac`); None: none."""
    settings_model: type[BaseModel] | None = None
    """The model of its table, `[executors.<kind>]`, which settings read and validate with
    it (every setting at its default when the table is not given); None: the table is kept
    as given (`ExecutorSettings.section`). It must live in a module as light as this one."""


def known() -> tuple[str, ...]:
    """Every registered kind, sorted (nothing is imported)."""
    return entrypoints.names(GROUP)


def get(kind: str) -> Registration:
    """The registration of `kind`; ConfigError naming the known kinds when there is none."""
    if kind not in known():
        raise errors.ConfigError(
            f"unknown executor {kind!r}; known: {', '.join(known()) or 'none'}"
        )
    found = entrypoints.load(GROUP, kind)
    if not isinstance(found, Registration) or found.kind != kind:
        raise errors.ConfigError(
            f"executor entry {kind!r} must point at a Registration with kind {kind!r},"
            f" not {found!r}"
        )
    return found


def checker(kind: str, settings: config.Settings, clk: clock.Clock) -> SpecChecker:
    """What checks `kind`'s specs under these settings, without starting anything."""
    reg = get(kind)
    return reg.checker(settings) if reg.checker else reg.build(settings, clk)


class Checkers(Mapping[str, SpecChecker]):
    """The spec checkers of the executors these settings enable, each made when first
    asked for: a command that stores a job checks its spec without importing, or
    reaching, the platforms of the others."""

    def __init__(self, settings: config.Settings, clk: clock.Clock) -> None:
        self._settings, self._clock = settings, clk
        self._made: dict[str, SpecChecker] = {}

    def __getitem__(self, kind: str) -> SpecChecker:
        if kind not in self._settings.executors.enabled:
            raise KeyError(kind)
        if (made := self._made.get(kind)) is None:
            made = self._made[kind] = checker(kind, self._settings, self._clock)
        return made

    def __iter__(self) -> Iterator[str]:
        return iter(self._settings.executors.enabled)

    def __len__(self) -> int:
        return len(self._settings.executors.enabled)


def containers() -> tuple[str, ...]:
    """The kinds whose spec is an image and a command."""
    return tuple(k for k in known() if get(k).container)
