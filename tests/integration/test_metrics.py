"""Metrics, on both databases: what a scrape of /metrics shows after the dispatcher, the
reconciler, the scheduler and the alerter have worked, and who may scrape it.

prometheus_client's registry is one per process, shared by every test: each test reads
a metric before and after, and checks the difference."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from corral import (
    alerts,
    client,
    config,
    dispatcher,
    errors,
    launching,
    model,
    reconciler,
    recovery,
    retry,
    scheduler,
    store,
)
from corral.api import create_app
from corral.testing import FrozenClock
from tests.integration.test_alerts import Web, listening, quarantine, settings
from tests.integration.test_alerts import web_receiver as web_receiver  # the fixture
from tests.support.net import free_port
from tests.support.noop import NoopExecutor

A, J = model.AttemptState, model.JobState


class Refusing(NoopExecutor):
    """Refuses every launch."""

    kind = "refusing"

    async def launch(self, launch: launching.Launch) -> None:
        raise errors.ExecutorError("the platform said no")


def value(name: str, **labels: str) -> float:
    """A sample of this process's registry now (0 before it is first counted)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Scraper:
    """The API's /metrics over one store, with tokens of each kind."""

    def __init__(self, c: client.Client, http: httpx.AsyncClient) -> None:
        self.c = c
        self.http = http
        self.tokens: dict[str, str] = {}

    async def scrape(self, as_: str = "all-viewer") -> dict[tuple[str, tuple[Any, ...]], float]:
        r = await self.http.get("/metrics", headers=self.auth(as_))
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/plain")
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text)
            for s in family.samples
        }

    def auth(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[name]}"}


@pytest.fixture
async def api(db: store.Store) -> AsyncIterator[Scraper]:
    clock = FrozenClock()
    executors = {"noop": NoopExecutor(clock=clock), "refusing": Refusing()}
    c = client.Client(store=db, executors=executors, settings=config.Settings(), clock=clock)
    transport = httpx.ASGITransport(app=create_app(c))
    async with httpx.AsyncClient(transport=transport, base_url="http://corral.test") as http:
        made = Scraper(c, http)
        for name, tenant, role in (
            ("all-viewer", None, "viewer"),
            ("a-admin", "a", "admin"),
        ):
            _, made.tokens[name] = await c.token_create(name=name, tenant=tenant, role=role)
        yield made


def jobs_shown(scraped: dict[tuple[str, tuple[Any, ...]], float]) -> dict[tuple[str, str], int]:
    return {
        (dict(labels)["state"], dict(labels)["queue"]): int(v)
        for (name, labels), v in scraped.items()
        if name == "corral_jobs"
    }


async def test_a_scrape_after_a_dispatcher_ran_shows_its_latencies_and_the_jobs_by_queue(
    api: Scraper, db: store.Store
) -> None:
    c, clock = api.c, api.c.clock
    assert isinstance(clock, FrozenClock)
    before = {
        "claims": value("corral_claim_duration_seconds_count"),
        "settles": value("corral_settle_duration_seconds_count", write="settle"),
        "refused": value("corral_launch_errors_total", executor="refusing"),
        "succeeded": value(
            "corral_completions_total", attempt_state="succeeded", job_state="succeeded"
        ),
    }
    for queue in ("mail", "mail", "billing"):
        await c.submit(spec={}, executor="noop", queue=queue)
    await c.submit(spec={}, executor="refusing", queue="billing")
    later = clock.now() + timedelta(hours=1)
    for queue in ("mail", "reports", "reports"):
        await c.submit(spec={}, executor="noop", queue=queue, run_at=later)
    d = dispatcher.Dispatcher(
        store=db, executors=c.executors, clock=clock, settings=config.Settings()
    )
    await d.run_once()
    assert await d.completions.poll_once() == 3  # the noop launches finished at once
    await d.completions.flush()

    assert value("corral_claim_duration_seconds_count") - before["claims"] >= 1
    assert value("corral_settle_duration_seconds_count", write="settle") - before["settles"] >= 1
    assert value("corral_launch_errors_total", executor="refusing") - before["refused"] == 1
    done = value("corral_completions_total", attempt_state="succeeded", job_state="succeeded")
    assert done - before["succeeded"] == 3

    scraped = await api.scrape()
    assert scraped[("corral_claim_duration_seconds_count", ())] >= 1
    assert scraped[("corral_launch_errors_total", (("executor", "refusing"),))] >= 1
    # The live jobs, as the store has them: the refused launch's job runs (its attempt is
    # left launching for recovery); finished jobs are not shown.
    expected: dict[tuple[str, str], int] = {}
    for job in await db.jobs.list(model.JobFilter(states=list(J)), limit=100):
        if job.state not in (J.SUCCEEDED, J.FAILED, J.CANCELLED):
            expected[(job.state.value, job.queue)] = (
                expected.get((job.state.value, job.queue), 0) + 1
            )
    assert (
        jobs_shown(scraped)
        == expected
        == {
            ("scheduled", "mail"): 1,
            ("scheduled", "reports"): 2,
            ("running", "billing"): 1,
        }
    )


async def test_the_retry_budget_is_shown_per_queue(api: Scraper, db: store.Store) -> None:
    c, clock = api.c, api.c.clock
    assert isinstance(clock, FrozenClock)
    await c.submit(spec={}, executor="noop", queue="flaky", max_attempts=3)
    [claimed] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
    failed = store.Finish(claimed.attempt.id, A.FAILED, 1, "exited with code 1")
    await db.attempts.finish(
        finishes=[failed], now=clock.now(), retry=retry.Retry.from_settings(c.settings)
    )
    buckets = await db.jobs.budgets()
    assert "flaky" in buckets
    scraped = await api.scrape()
    shown = scraped[("corral_retry_budget_tokens", (("queue", "flaky"),))]
    assert shown == pytest.approx(buckets["flaky"].tokens)
    assert shown < c.settings.retry.budget.burst  # the retry took a token


async def test_metrics_take_a_token_of_every_tenant(api: Scraper) -> None:
    assert (await api.http.get("/metrics")).status_code == 401
    bad = await api.http.get("/metrics", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401
    tenant = await api.http.get("/metrics", headers=api.auth("a-admin"))
    assert tenant.status_code == 403
    assert tenant.json()["field"] == "tenant"
    assert (await api.http.get("/metrics", headers=api.auth("all-viewer"))).status_code == 200
    schema = (await api.http.get("/api/v1/openapi.json")).json()
    assert "/metrics" not in schema["paths"]


async def test_the_reconciler_counts_its_repairs_by_kind(db: store.Store) -> None:
    clock = FrozenClock()
    settings = config.Settings()
    executors = {"noop": NoopExecutor(clock=clock)}
    c = client.Client(store=db, executors=executors, settings=settings, clock=clock)
    for _ in range(3):
        await c.submit(spec={}, executor="noop")
    await db.jobs.claim(now=clock.now(), limit=3, executors=["noop"])  # then "crashed"
    clock.advance(settings.timeouts.launch_grace.total_seconds() + 1)
    kinds = [f for f in recovery.Pass.__dataclass_fields__ if f not in ("looked", "waiting")]
    before = {k: value("corral_repairs_total", kind=k) for k in kinds}
    done = await reconciler.Reconciler(
        store=db, executors=executors, clock=clock, settings=settings
    ).run_once()
    assert done.relaunched == 3
    for k in kinds:
        assert value("corral_repairs_total", kind=k) - before[k] == getattr(done, k), k


async def test_a_late_firing_is_observed_with_its_lateness(db: store.Store) -> None:
    clock = FrozenClock()
    c = client.Client(
        store=db, executors={"noop": NoopExecutor()}, settings=config.Settings(), clock=clock
    )
    await c.schedule_create("hourly", every="1h", spec={}, executor="noop")
    clock.advance(90)  # the first nominal time (its creation) passed 90 seconds ago
    count = value("corral_schedule_lateness_seconds_count")
    total = value("corral_schedule_lateness_seconds_sum")
    late = value("corral_schedule_lateness_seconds_bucket", le="60.0")
    done = await scheduler.Scheduler(store=db, clock=clock, ahead=timedelta(0)).pass_once()
    assert done.fired == 1
    assert value("corral_schedule_lateness_seconds_count") - count == 1
    assert value("corral_schedule_lateness_seconds_sum") - total == pytest.approx(90)
    assert value("corral_schedule_lateness_seconds_bucket", le="60.0") == late  # not within 60s


async def test_alert_deliveries_are_counted_by_channel_kind_and_outcome(
    db: store.Store, web_receiver: Web
) -> None:
    clock = FrozenClock()
    await listening(db)
    s = settings(free_port(), web_receiver.base, channels=["hook", "ops_mail"])  # no SMTP server
    outcomes = [
        ("webhook", "delivered"),
        ("email", "failed"),
        ("email", "given_up"),
        ("webhook", "failed"),
    ]
    before = {
        o: value("corral_alert_deliveries_total", channel=o[0], outcome=o[1]) for o in outcomes
    }
    await quarantine(db, clock)
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)
    try:
        await alerter.read_once()
        for _ in range(alerts.TRIES):
            await alerter.deliver_all()
            clock.advance(alerts.BACKOFF[1])
    finally:
        await alerter.close()
    after = {
        o: value("corral_alert_deliveries_total", channel=o[0], outcome=o[1]) for o in outcomes
    }
    assert {o: after[o] - before[o] for o in outcomes} == {
        ("webhook", "delivered"): 1,
        ("email", "failed"): alerts.TRIES - 1,
        ("email", "given_up"): 1,
        ("webhook", "failed"): 0,
    }
    assert [w["path"] for w in web_receiver.seen] == ["/hook"]
