"""A backfill: one job per nominal time of a schedule in a past range, idempotently."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

from corral import errors, model, quotas, scheduling
from corral.client import jobs, schedules


class Backfill(jobs.Jobs):
    """Fill a schedule's past."""

    async def backfill(
        self,
        name: str,
        *,
        start: str | datetime,
        end: str | datetime,
        tenant: str = "default",
        pool: str | None = None,
        code_version: str | None = None,
        dry_run: bool = False,
        batch: int = 500,
        progress: Callable[[int], None] | None = None,
        limited: bool = False,
    ) -> tuple[int, int]:
        """One job per nominal time of the schedule in [start, end), idempotently: running
        it again creates nothing new. Returns (created, there already); with `dry_run`,
        (how many nominal times, 0) and nothing stored. `limited`: a tenant's request, all
        in one transaction held to the tenant's quotas: all of it stored, or none."""
        from corral import planning

        old = await self.store.schedules.get(name=name, tenant=tenant)
        first = schedules.instant(start, "from", old.tz)
        last = schedules.instant(end, "to", old.tz)
        if last <= first:
            raise errors.InvalidInput(f"to: {model.iso(last)} is not after from {model.iso(first)}")
        overrides = self._overrides(old, pool=pool, code_version=code_version)
        created = there = 0
        quota = quotas.limits(self.settings.tenants, old.tenant) if limited else None
        size = sys.maxsize if limited else batch
        for chunk in _chunks(planning.backfill_fires(old, first, last, **overrides), size):
            made = (len(chunk), 0) if dry_run else await self._backfill(old, chunk, quota)
            created, there = created + made[0], there + made[1]
            if progress is not None:
                progress(len(chunk))
        return created, there

    def _overrides(
        self, old: scheduling.Schedule, *, pool: str | None, code_version: str | None
    ) -> dict[str, Any]:
        """What a backfill's jobs take in place of the template's, checked as any job is."""
        overrides: dict[str, Any] = {}
        if pool is not None:
            overrides["pool"] = pool
        if code_version is not None:
            overrides["code_version"] = code_version
        if overrides:
            self.validate(scheduling.job_from_template(old.template, **overrides))
        return overrides

    async def _backfill(
        self,
        schedule: scheduling.Schedule,
        fires: list[scheduling.Fire],
        quota: quotas.Limits | None,
    ) -> tuple[int, int]:
        return await self.store.schedules.backfill(
            schedule=schedule, fires=fires, now=self.clock.now(), quota=quota
        )


def _chunks(fires: Iterable[scheduling.Fire], size: int) -> Iterator[list[scheduling.Fire]]:
    """`fires` in lists of `size` (the last one shorter), read as they are needed."""
    chunk: list[scheduling.Fire] = []
    for fire in fires:
        chunk.append(fire)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
