"""Counts over the store for the pages that sum it up: the metrics scrape, the pools
list, and the dashboard's overview (its statements on one connection in one call)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from corral import retry
from corral.client import service
from corral.store.overview import Overview, Span


class Counts(service.Service):
    """What the metrics, the pools list and the overview count."""

    async def jobs_live_count(self) -> dict[tuple[str, str], int]:
        """Jobs in each live state, by (state, queue)."""
        return await self.store.jobs.count_live()

    async def budgets(self) -> dict[str, retry.Bucket]:
        """Every queue's retry budget as stored (time's refill not added)."""
        return await self.store.jobs.budgets()

    async def pools_running(
        self, pools: Sequence[str], *, tenant: str | None = None
    ) -> dict[str, int]:
        """The jobs running in each of `pools` (of `tenant`; None: of every tenant)."""
        return await self.store.jobs.pool_running(pools=pools, tenant=tenant)

    async def overview(
        self,
        *,
        tenant: str | None,
        spans: Sequence[tuple[datetime, timedelta, int]],
        quarantined: int,
        pools: Sequence[str] = (),
        budgets: bool = False,
    ) -> Overview:
        """What the overview shows of `tenant` (None: every tenant): job ends counted over
        each span (since, bucket width, buckets), the newest `quarantined` jobs, the
        running jobs of `pools`, and (`budgets`) each queue's retry budget."""
        return await self.store.jobs.overview(
            tenant=tenant,
            spans=[Span(since, width, count) for since, width, count in spans],
            quarantined=quarantined,
            pools=pools,
            budgets=budgets,
        )
