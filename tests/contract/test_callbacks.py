"""Callbacks on both databases: the callback job is made in the transaction that ends its
job, by every path that ends one (the hot settle and the general one, a success, a failure,
a quarantine), never for a cancel, never for a callback job itself; it belongs to the job's
tenant and counts toward no quota."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from corral import callbacks, client, config, errors, launching, model, retry, store
from corral.executors import http_outcome
from corral.store import Finish
from corral.testing import FrozenClock
from tests.support.noop import NoopExecutor

A, J, FC = model.AttemptState, model.JobState, model.FailureClass
HOOK = "https://hooks.example.com/done"
FAILED_HOOK = "https://hooks.example.com/failed"


async def _claimed(
    db: store.Store, clock: FrozenClock, *, tenant: str = "acme", **given: Any
) -> model.Claimed:
    new = model.NewJob(
        executor="noop",
        spec={},
        tenant=tenant,
        max_attempts=1,
        callback=HOOK,
        failure_callback=FAILED_HOOK,
        **given,
    )
    [(job_id, _)] = await db.jobs.submit(new=[new], now=clock.now())
    [claimed] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
    assert claimed.job.id == job_id
    return claimed


async def _callbacks(db: store.Store) -> list[model.Job]:
    return [j for j in await db.jobs.list() if j.callback_of is not None]


def _response() -> launching.RunLog:
    outcome = http_outcome.Outcome(
        200,
        "OK",
        "93.184.216.34",
        0.25,
        b"\x00\xffbinary",
        headers=(("Content-Type", "application/octet-stream"), ("Set-Cookie", "s=secret")),
    )
    return http_outcome.run_log(None, outcome)


@pytest.mark.parametrize("launched", [False, True])
async def test_a_success_makes_one_callback_job_with_the_result(
    db: store.Store, clock: FrozenClock, launched: bool
) -> None:
    """Settled on the hot path's route (every finish a success), launched in the same tick
    or not: the job's success is left to the general settle, which makes its callback."""
    c = await _claimed(db, clock, payload={"corral": {"schedule": "s", "nominal_time": "t"}})
    won = Finish(
        c.attempt.id, A.SUCCEEDED, None, "HTTP 200 OK", http_status=200, output=_response()
    )
    ran, outcomes = await db.attempts.settle(
        launched=[c.attempt.id] if launched else [], finishes=[won], now=clock.now()
    )
    assert ran == []
    assert [(o.job_id, o.job_state) for o in outcomes] == [(c.job.id, J.SUCCEEDED)]
    [cb] = await _callbacks(db)
    assert (cb.executor, cb.tenant, cb.state, cb.callback_of) == (
        "http",
        "acme",
        J.QUEUED,
        c.job.id,
    )
    assert cb.spec == {"method": "POST", "url": HOOK, "headers": {}, "expect": ["2xx"]}
    assert cb.labels == {callbacks.LABEL: str(c.job.id)}
    assert cb.idempotency_key == f"callback:{c.job.id}:{c.attempt.id}"
    assert (cb.callback, cb.failure_callback, cb.max_attempts) == (None, None, callbacks.ATTEMPTS)
    body = cb.payload
    assert {k: body[k] for k in ("job", "attempt", "fence", "state", "status", "exit_code")} == {
        "job": c.job.id,
        "attempt": 1,
        "fence": c.attempt.id,
        "state": "succeeded",
        "status": 200,
        "exit_code": None,
    }
    assert (body["schedule"], body["nominal_time"], body["response_time"]) == ("s", "t", 0.25)
    assert base64.b64decode(body["output"]["body_base64"]) == b"\x00\xffbinary"
    assert body["output"]["headers"] == {
        "content-type": "application/octet-stream",
        "set-cookie": "[redacted]",
    }
    view = await db.jobs.record(job_id=c.job.id)
    assert any(e.details.get("callback_job") == cb.id for e in view[2])


@pytest.mark.parametrize(
    ("cls", "ends"),
    [(None, J.FAILED), (FC.PERMANENT, J.QUARANTINED)],
    ids=["failed", "quarantined"],
)
async def test_a_failure_or_a_quarantine_sends_to_the_failure_callback(
    db: store.Store, clock: FrozenClock, cls: model.FailureClass | None, ends: model.JobState
) -> None:
    c = await _claimed(db, clock)
    out = launching.RunLog(streams=(launching.Stream("stdout", "done\n" * 3, 15),), latency=2.0)
    failed = Finish(c.attempt.id, A.FAILED, 3, "exit 3", failure_class=cls, output=out)
    [outcome] = await db.attempts.finish(finishes=[failed], now=clock.now(), retry=retry.Retry())
    assert outcome.job_state == ends
    [cb] = await _callbacks(db)
    assert cb.spec["url"] == FAILED_HOOK
    assert (cb.payload["state"], cb.payload["exit_code"]) == (str(ends), 3)
    assert cb.payload["output"] == {"stdout": "done\n" * 3, "stdout_cut": False}


async def test_a_retry_a_cancel_or_an_end_with_nowhere_to_send_makes_none(
    db: store.Store, clock: FrozenClock
) -> None:
    again = await _claimed(db, clock, queue="a")
    await db.jobs.submit(
        new=[model.NewJob(executor="noop", spec={}, max_attempts=1, queue="b", callback=HOOK)],
        now=clock.now(),
    )
    [only_success] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
    await db.jobs.cancel(job_id=again.job.id, now=clock.now(), reason="by a test")
    failed = Finish(only_success.attempt.id, A.FAILED, 1, "exit 1")
    [outcome] = await db.attempts.finish(finishes=[failed], now=clock.now())
    assert outcome.job_state == J.FAILED
    assert await _callbacks(db) == []


async def test_a_failure_with_attempts_left_sends_nothing_until_the_job_ends(
    db: store.Store, clock: FrozenClock
) -> None:
    new = model.NewJob(executor="noop", spec={}, max_attempts=2, failure_callback=FAILED_HOOK)
    [(job_id, _)] = await db.jobs.submit(new=[new], now=clock.now())
    for n in (1, 2):
        [claimed] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
        await db.attempts.finish(
            finishes=[Finish(claimed.attempt.id, A.FAILED, n, f"exit {n}")],
            now=clock.now(),
            retry=retry.Retry(),
        )
        made = await _callbacks(db)
        assert len(made) == n - 1, "a callback after each attempt, not after the job"
        clock.advance(60)
    assert made[0].payload["attempt"] == 2
    assert made[0].callback_of == job_id


async def test_a_callback_job_has_no_callback_of_its_own(
    db: store.Store, clock: FrozenClock
) -> None:
    c = await _claimed(db, clock)
    await db.attempts.finish(finishes=[Finish(c.attempt.id, A.SUCCEEDED, 0, None)], now=clock.now())
    [cb] = await _callbacks(db)
    [delivery] = await db.jobs.claim(now=clock.now(), limit=1, executors=["http"])
    assert delivery.job.id == cb.id
    quarantined = Finish(delivery.attempt.id, A.FAILED, None, "HTTP 404", FC.PERMANENT)
    [outcome] = await db.attempts.finish(finishes=[quarantined], now=clock.now())
    assert outcome.job_state == J.QUARANTINED
    assert [j.id for j in await _callbacks(db)] == [cb.id]


async def test_callback_jobs_count_toward_no_quota(db: store.Store, clock: FrozenClock) -> None:
    """A tenant at its max_queued still submits while its callbacks wait: they are not
    counted; and the operator's count of what waits leaves them out."""
    c = await _claimed(db, clock)
    await db.attempts.finish(finishes=[Finish(c.attempt.id, A.SUCCEEDED, 0, None)], now=clock.now())
    assert len(await _callbacks(db)) == 1
    assert await db.quotas.waiting(tenants=["acme"]) == {}
    settings = config.Settings(tenants={"acme": {"max_queued": 1}})
    cl = client.Client(store=db, executors={"noop": NoopExecutor()}, settings=settings, clock=clock)
    job = cl.validate(cl.new_job(executor="noop", spec={}, tenant="acme"))
    await cl.submit_many([job], limited=True)
    assert await db.quotas.waiting(tenants=["acme"]) == {"acme": 1}
    with pytest.raises(errors.QuotaExceeded, match="max_queued"):
        await cl.submit_many([job], limited=True)


async def test_another_tenants_job_list_never_shows_a_callback_job(
    db: store.Store, clock: FrozenClock
) -> None:
    c = await _claimed(db, clock, tenant="acme")
    await db.attempts.finish(finishes=[Finish(c.attempt.id, A.SUCCEEDED, 0, None)], now=clock.now())
    [cb] = await _callbacks(db)
    assert cb.tenant == "acme"
    assert await db.jobs.list(model.JobFilter(tenant="other")) == []
