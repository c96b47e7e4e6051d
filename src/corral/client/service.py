"""What every service of the client shares: the store, the executors, the settings and
the clock, and what this process keeps read of tokens and sessions.

Each service (client.jobs, client.schedules, ...) is a class over this one, and
`corral.client.Client` is all of them at once: one object, one store, so a caller never
has to know which service a method lives in.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from corral import access, clock, config, loops, store
from corral.executors import registry
from corral.executors.base import Executor


class Service:
    """The state the client's services share."""

    def __init__(
        self,
        *,
        store: store.Store,
        executors: Mapping[str, Executor],
        settings: config.Settings,
        clock: clock.Clock,
        checkers: Mapping[str, registry.SpecChecker] | None = None,
    ) -> None:
        """`executors`, started, cancel runs on their platforms; `checkers` (default: the
        executors) check the specs of jobs to store."""
        self.store = store
        self.executors = executors
        self.settings = settings
        self.clock = clock
        self._attempt_key: str | None = None
        self._tokens: dict[str, tuple[float, access.Token]] = {}  # digest -> (fresh until, token)
        self._sessions: dict[str, tuple[float, access.WebSession]] = {}  # the same, of cookies
        self.checkers = executors if checkers is None else checkers
        self.loops = loops.Service(store, settings, clock)
        """The loops table: this process's pulse, which loops live, work nobody can do."""

    @property
    def database(self) -> str:
        """Where the store is, as its URL says it (the password hidden)."""
        return self.store.database.url

    def since(self) -> datetime:
        """When a worker last heard of is still live (its lease)."""
        return self.clock.now() - self.settings.timeouts.lease_timeout
