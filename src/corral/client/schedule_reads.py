"""What the schedules list and a schedule's page read: schedules a page at a time by name,
the last run of each, a schedule's firings a page at a time with what each job came to, and
its stats over the last 24 hours and 30 days (its closed hours kept as they close, so a view
counts only the open ones). Each read is bounded by what it shows, however many schedules
or firings there are."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from corral import errors, firing_stats, scheduling
from corral.client import service

log = logging.getLogger("corral.client")

FIRINGS_PAGE = 50
"""Firings on one page of a schedule's history, unless asked for another number."""
MAX_FIRINGS_PAGE = 1000
"""The most firings one page of history holds."""
SCHEDULES_PAGE = 50
"""Schedules on one page of the list, unless asked for another number."""
MAX_SCHEDULES_PAGE = 1000
"""The most schedules one page of the list holds."""


@dataclass(frozen=True, slots=True)
class FiringPage:
    """A page of a schedule's firings, the latest first, and the nominal time to ask the
    next page `before` (None: this is the last page)."""

    rows: list[firing_stats.FiringRow]
    next: datetime | None


def firing_cursor(text: str, field: str = "before") -> datetime:
    """A page's `before` as given (an ISO 8601 time with an offset, e.g. a page's `next`),
    in UTC; InvalidInput naming `field` otherwise."""
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise errors.InvalidInput(
            f"{field}: {text!r} is not an ISO 8601 time, e.g. 2026-12-24T08:00:00Z"
        ) from None
    if at.utcoffset() is None:
        raise errors.InvalidInput(f"{field}: must carry a timezone, e.g. 2026-12-24T08:00:00Z")
    return at.astimezone(UTC)


def list_cursor(given: str | None, tenant: str | None) -> tuple[str, str] | None:
    """The schedules list's `after` as (tenant, name): a name within `tenant`'s list,
    TENANT/NAME within every tenant's (as `list_next` writes it); InvalidInput naming
    `after` when it is neither."""
    if not given:
        return None
    if tenant is not None:
        return tenant, given
    whose, sep, name = given.partition("/")
    if not sep:
        raise errors.InvalidInput(
            f"after: {given!r} must be TENANT/NAME (a page's next) when the list is every tenant's"
        )
    return whose, name


def list_next(more: tuple[str, str] | None, tenant: str | None) -> str | None:
    """The schedules list's next page's `after`: the last name of this one (TENANT/NAME
    when the list is every tenant's); None on the last page."""
    if more is None:
        return None
    return more[1] if tenant is not None else f"{more[0]}/{more[1]}"


def _checked(limit: int, most: int) -> int:
    if not 1 <= limit <= most:
        raise errors.InvalidInput(f"limit: {limit} must be between 1 and {most}")
    return limit


class ScheduleReads(service.Service):
    """The reads behind the schedules list and a schedule's page."""

    async def schedules_page(
        self,
        *,
        tenant: str | None,
        after: tuple[str, str] | None = None,
        limit: int = SCHEDULES_PAGE,
    ) -> tuple[list[scheduling.Schedule], tuple[str, str] | None]:
        """Up to `limit` schedules of `tenant` (None: of every tenant) by tenant and name,
        after (tenant, name) `after`; and the (tenant, name) to ask the next page after
        (None: this is the last page)."""
        limit = _checked(limit, MAX_SCHEDULES_PAGE)
        found = await self.store.schedules.list(tenant=tenant, limit=limit + 1, after=after)
        more, found = len(found) > limit, found[:limit]
        return found, (found[-1].tenant, found[-1].name) if more else None

    async def last_runs(
        self, schedules: Sequence[scheduling.Schedule]
    ) -> dict[int, firing_stats.JobRun]:
        """What the last firing's job of each schedule came to, by schedule id (one read
        for them all; a schedule whose last job is gone, or that has none, is left out)."""
        jobs = {s.last_job_id: s.id for s in schedules if s.last_job_id is not None}
        runs = await self.store.schedules.job_runs(job_ids=sorted(jobs))
        return {jobs[job_id]: run for job_id, run in runs.items()}

    async def firing_history(
        self,
        name: str,
        *,
        tenant: str = "default",
        before: datetime | None = None,
        limit: int = FIRINGS_PAGE,
    ) -> FiringPage:
        """`tenant`'s schedule `name`'s firings before `before` (None: from the newest), a
        page of `limit`, the latest first."""
        found = await self.store.schedules.get(name=name, tenant=tenant)
        return await self.history_of(found, before=before, limit=limit)

    async def history_of(
        self, found: scheduling.Schedule, *, before: datetime | None, limit: int = FIRINGS_PAGE
    ) -> FiringPage:
        """firing_history of a schedule read already."""
        limit = _checked(limit, MAX_FIRINGS_PAGE)
        rows = await self.store.schedules.history(
            schedule_id=found.id, before=before, limit=limit + 1
        )
        more, rows = len(rows) > limit, rows[:limit]
        return FiringPage(rows=rows, next=rows[-1].nominal_at if more else None)

    async def page_of(
        self, found: scheduling.Schedule, *, before: datetime | None, limit: int = FIRINGS_PAGE
    ) -> tuple[FiringPage, firing_stats.Stats]:
        """history_of and stats_of of a schedule read already, in one read (its page)."""
        limit, now = _checked(limit, MAX_FIRINGS_PAGE), self.clock.now()
        rows, counted = await self.store.schedules.page(
            schedule_id=found.id, before=before, limit=limit + 1, now=now
        )
        more, rows = len(rows) > limit, rows[:limit]
        await self._keep_closed(found, counted, now)
        page = FiringPage(rows=rows, next=rows[-1].nominal_at if more else None)
        return page, firing_stats.stats(counted, now)

    async def schedule_stats(self, name: str, *, tenant: str = "default") -> firing_stats.Stats:
        """`tenant`'s schedule `name`'s stats over the last 24 hours and 30 days."""
        return await self.stats_of(await self.store.schedules.get(name=name, tenant=tenant))

    async def stats_of(self, found: scheduling.Schedule) -> firing_stats.Stats:
        """schedule_stats of a schedule read already; the hours found closed are kept on
        the way."""
        now = self.clock.now()
        counted = await self.store.schedules.stats_read(schedule_id=found.id, now=now)
        await self._keep_closed(found, counted, now)
        return firing_stats.stats(counted, now)

    async def _keep_closed(
        self, found: scheduling.Schedule, counted: firing_stats.Counted, now: datetime
    ) -> None:
        """Keep the hours `counted` found closed (a write only when one closed since the
        last view). A help, not a need: if it fails, what was counted is right all the same."""
        if (closing := firing_stats.closing(counted, now)) is None:
            return
        try:
            await self.store.schedules.hours_close(
                schedule_id=found.id, closing=closing, keep_from=firing_stats.since(now)
            )
        except errors.StoreError as exc:
            log.warning("schedule %r: its closed hours are not kept now: %s", found.name, exc)
