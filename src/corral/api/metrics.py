"""GET /metrics: corral.metrics in Prometheus' text format, with what is read from the
store at scrape time: jobs in each live state by queue, and each queue's retry budget.

Queue names are tenant data, so it takes a token of every tenant (tenant None), of any
role. Finished jobs are not counted here (that would scan the table): the dispatcher
counts the completions it writes (corral_completions_total).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime

import prometheus_client
from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from corral import metrics, retry
from corral.api.auth import Client, Refused, Viewer

router = APIRouter()


class Stored(Collector):
    """Jobs by state and queue, and retry budget tokens by queue, as read for one scrape."""

    def __init__(self, jobs: Mapping[tuple[str, str], int], tokens: Mapping[str, float]) -> None:
        self.jobs = jobs
        self.tokens = tokens

    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs = GaugeMetricFamily(
            "corral_jobs",
            "Jobs in each live state (queued, scheduled, running, parked, quarantined),"
            " by queue; finished jobs are not counted.",
            labels=["state", "queue"],
        )
        for (state, queue), count in sorted(self.jobs.items()):
            jobs.add_metric([state, queue], count)
        yield jobs
        tokens = GaugeMetricFamily(
            "corral_retry_budget_tokens",
            "Retries a queue may still make now (its retry budget's bucket; a debt is"
            " negative), counting time's refill but not first attempts since its last retry.",
            labels=["queue"],
        )
        for queue, left in sorted(self.tokens.items()):
            tokens.add_metric([queue], left)
        yield tokens


def tokens_now(
    buckets: Mapping[str, retry.Bucket], budget: retry.Budget, now: datetime
) -> dict[str, float]:
    """Each queue's tokens at `now`: the stored bucket plus time's refill."""
    return {queue: budget.refill(bucket, now, 0) for queue, bucket in buckets.items()}


@router.get("/metrics", include_in_schema=False)
async def scrape(who: Viewer, c: Client) -> Response:
    """The metrics of this process and of the store, for Prometheus."""
    if who.token.tenant is not None:
        raise Refused(
            403, "tenant: /metrics shows every tenant's queues; it takes a token of every tenant"
        )
    jobs = await c.store.jobs.count_live()
    buckets = await c.store.jobs.budgets()
    tokens = tokens_now(buckets, retry.Budget.from_settings(c.settings), c.clock.now())
    stored = prometheus_client.CollectorRegistry(auto_describe=False)
    stored.register(Stored(jobs, tokens))
    body, content_type = metrics.exposition()
    return Response(body + prometheus_client.generate_latest(stored), media_type=content_type)
