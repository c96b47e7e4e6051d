"""GET /metrics: corral.metrics in Prometheus' text format, with what is read from the
store at scrape time: jobs in each live state by queue, each queue's retry budget, each
tenant's use of its quotas beside their limits (one grouped read for every tenant), and
the monitors in each state.

Queue and tenant names are tenant data, so it takes a token of every tenant (tenant None),
of any role. Finished jobs are not counted here (that would scan the table): the
dispatcher counts the completions it writes (corral_completions_total).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime

import prometheus_client
from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from corral import errors, metrics, retry, usage
from corral.api.auth import Client, Viewer

router = APIRouter()


class Stored(Collector):
    """Jobs by state and queue, retry budget tokens by queue, and each tenant's quotas and
    their use, as read for one scrape."""

    def __init__(
        self,
        jobs: Mapping[tuple[str, str], int],
        tokens: Mapping[str, float],
        tenants: Sequence[usage.View] = (),
        monitors: Mapping[str, int] | None = None,
    ) -> None:
        self.jobs = jobs
        self.tokens = tokens
        self.tenants = tenants
        self.monitors = monitors or {}

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
        yield from tenant_gauges(self.tenants)
        monitors = GaugeMetricFamily(
            "corral_monitors",
            "Monitors (corral monitors) in each state: up, late, down, failed, paused.",
            labels=["state"],
        )
        for state, count in self.monitors.items():
            monitors.add_metric([state], count)
        yield monitors


def tenant_gauges(views: Sequence[usage.View]) -> Iterator[GaugeMetricFamily]:
    """Each tenant's use of each quota (not max_payload_bytes: nothing uses it up), each
    quota's limit (not a limit of none), and each tenant's weight."""
    use = GaugeMetricFamily(
        "corral_tenant_quota_use",
        "What a tenant uses of a quota now: max_running (jobs running), max_queued (jobs"
        " queued, scheduled or parked), max_schedules, max_monitors, submit_rate (its"
        " bucket's use, jobs a minute), run_log_bytes (bytes of run logs kept).",
        labels=["tenant", "quota"],
    )
    limit = GaugeMetricFamily(
        "corral_tenant_quota_limit",
        "A tenant's quota, as its settings say (a quota of none has no sample).",
        labels=["tenant", "quota"],
    )
    weight = GaugeMetricFamily(
        "corral_tenant_weight", "A tenant's share of the claims when tenants wait together.",
        labels=["tenant"],
    )  # fmt: skip
    for view in views:
        weight.add_metric([view.tenant], view.weight)
        for quota in view.quotas:
            if quota.use is not None:
                use.add_metric([view.tenant, quota.name], quota.use)
            if quota.limit is not None:
                limit.add_metric([view.tenant, quota.name], quota.limit)
    yield from (use, limit, weight)


def tokens_now(
    buckets: Mapping[str, retry.Bucket], budget: retry.Budget, now: datetime
) -> dict[str, float]:
    """Each queue's tokens at `now`: the stored bucket plus time's refill."""
    return {queue: budget.refill(bucket, now, 0) for queue, bucket in buckets.items()}


@router.get("/metrics", include_in_schema=False)
async def scrape(who: Viewer, c: Client) -> Response:
    """The metrics of this process and of the store, for Prometheus."""
    if who.token.tenant is not None:
        raise errors.RequestRefused(
            403,
            "tenant: /metrics shows every tenant's queues and quotas; it takes a token of every"
            " tenant (a tenant's own quotas: GET /api/v1/tenant)",
        )
    jobs = await c.jobs_live_count()
    buckets = await c.budgets()
    tokens = tokens_now(buckets, retry.Budget.from_settings(c.settings), c.clock.now())
    stored = prometheus_client.CollectorRegistry(auto_describe=False)
    monitors = await c.monitors_counted()
    stored.register(Stored(jobs, tokens, await c.tenant_views(), monitors))
    body, content_type = metrics.exposition()
    return Response(body + prometheus_client.generate_latest(stored), media_type=content_type)
