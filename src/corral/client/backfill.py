"""A backfill: one job per nominal time of a schedule in a past range, idempotently."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

from corral import errors, model, scheduling
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
    ) -> tuple[int, int]:
        """One job per nominal time of the schedule in [start, end), idempotently: running
        it again creates nothing new. Returns (created, there already); with `dry_run`,
        (how many nominal times, 0) and nothing stored."""
        from corral import planning

        old = await self.store.schedules.get(name=name, tenant=tenant)
        first = schedules.instant(start, "from", old.tz)
        last = schedules.instant(end, "to", old.tz)
        if last <= first:
            raise errors.InvalidInput(f"to: {model.iso(last)} is not after from {model.iso(first)}")
        overrides: dict[str, Any] = {}
        if pool is not None:
            overrides["pool"] = pool
        if code_version is not None:
            overrides["code_version"] = code_version
        if overrides:  # checked as any job is
            sample = scheduling.job_from_template(old.template, **overrides)
            self.validate(sample)
        created = there = 0
        for chunk in _chunks(planning.backfill_fires(old, first, last, **overrides), batch):
            made = (len(chunk), 0) if dry_run else await self._backfill(old, chunk)
            created, there = created + made[0], there + made[1]
            if progress is not None:
                progress(len(chunk))
        return created, there

    async def _backfill(
        self, schedule: scheduling.Schedule, fires: list[scheduling.Fire]
    ) -> tuple[int, int]:
        return await self.store.schedules.backfill(
            schedule=schedule, fires=fires, now=self.clock.now()
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
