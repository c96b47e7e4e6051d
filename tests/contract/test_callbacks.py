"""Callbacks on both databases: the callback job is made in the transaction that ends its
job, by every path that ends one (the hot settle and the general one, a success, a failure,
a quarantine), never for a cancel, never for a callback job itself; it belongs to the job's
tenant and counts toward no quota (max_queued, max_running, run_log_bytes). What a job made
that PostgreSQL cannot hold (a NUL) never keeps an end from being written."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import pytest

from corral import callbacks, client, config, dispatcher, errors, launching, model, retry, store
from corral.clock import SystemClock
from corral.executors import http_outcome, process
from corral.store import Finish
from corral.testing import FrozenClock
from corral.worker import ends
from tests.support.noop import NoopExecutor
from tests.support.wait import PATIENCE

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


# --- what a job made that a database cannot hold (PostgreSQL: NUL, in text and JSONB) ---


@pytest.mark.parametrize("code", [0, 3], ids=["succeeded", "failed"])
async def test_a_process_job_printing_a_nul_ends_and_its_callback_job_is_made(
    db: store.Store, clock: FrozenClock, tmp_path: Path, code: int
) -> None:
    """A real command prints a NUL on stdout and stderr (a failure's message is stderr's
    last line): the job ends, with its result sent by a callback job whose payload holds
    U+FFFD where the NUL was, and the other ends of the same batch are written with it."""
    ex = process.ProcessExecutor(
        root=tmp_path / "runs", clock=SystemClock(), poll_interval=0.05, kill_grace=2
    )
    await ex.start()
    try:
        script = f"printf 'bin\\000ary\\n'; printf 'oops\\000\\n' >&2; exit {code}"
        spec = ex.validate_spec({"command": ["sh", "-c", script]})
        jobs = [
            model.NewJob(executor="process", spec=spec, max_attempts=1, callback=HOOK,
                         failure_callback=FAILED_HOOK),
            model.NewJob(executor="process", spec=ex.validate_spec({"command": ["true"]})),
        ]  # fmt: skip
        ids = [job_id for job_id, _ in await db.jobs.submit(new=jobs, now=clock.now())]
        d = dispatcher.Dispatcher(
            store=db, executors={"process": ex}, clock=clock, settings=config.Settings()
        )
        events = ex.events()
        assert (await d.run_once()).launched == 2
        for _ in range(2):
            d.completions.offer(await asyncio.wait_for(anext(events), PATIENCE))
        await d.completions.flush()
    finally:
        await ex.close()
    ended = J.SUCCEEDED if code == 0 else J.FAILED
    assert [(await db.jobs.get(job_id=i)).state for i in ids] == [ended, J.SUCCEEDED]
    [cb] = await _callbacks(db)
    assert (cb.callback_of, cb.payload["state"]) == (ids[0], str(ended))
    assert cb.payload["output"]["stdout"] == "bin\ufffdary\n"
    [attempt] = await db.attempts.list(job_id=ids[0])
    assert "\x00" not in (attempt.reason or "")


async def test_a_tasks_return_value_with_a_nul_ends_its_job_with_its_callback(
    db: store.Store, clock: FrozenClock
) -> None:
    """A Python task returns text with a NUL, a lone surrogate and NaN (its worker's run log,
    corral.worker.ends), and its exception-like reason holds a NUL: all are written."""
    c = await _claimed(db, clock)
    returned = {"text\x00": "a\x00b", "odd": "\ud800", "ratio": float("nan")}
    out = ends.run_log(SystemClock().monotonic(), {}, SystemClock(), returned=returned)
    won = Finish(c.attempt.id, A.SUCCEEDED, None, "returned \x00", output=out)
    [outcome] = await db.attempts.finish(finishes=[won], now=clock.now())
    assert outcome.job_state == J.SUCCEEDED
    [cb] = await _callbacks(db)
    assert cb.payload["output"]["returned"] == {
        "text\ufffd": "a\ufffdb",
        "odd": "\ufffd",
        "ratio": "NaN",
    }
    assert cb.payload["reason"] == "returned \ufffd"
    [attempt] = await db.attempts.list(job_id=c.job.id)
    assert attempt.reason == "returned \ufffd"


async def test_a_failure_quoting_a_nul_is_written_with_the_rest_of_its_batch(
    db: store.Store, clock: FrozenClock
) -> None:
    """An HTTP job's failed expect_body quotes a body with a NUL in its reason and message;
    written in one batch with another tenant's end, both end."""
    spec = {"method": "GET", "url": HOOK, "headers": {}, "expect": ["2xx"], "expect_body": "ok"}
    sent = http_outcome.Outcome(200, "OK", "93.184.216.34", 0.01, b"\x00\x01 binary")
    judged = http_outcome.verdict(sent, spec)
    raw = f"{judged.reason} \x00"  # as an executor that quotes without mending would say
    mine = await _claimed(db, clock, tenant="acme")
    theirs = await _claimed(db, clock, tenant="other")
    finishes = [
        Finish(mine.attempt.id, A.FAILED, None, raw, FC.ASSERTION, message=raw, http_status=200),
        Finish(theirs.attempt.id, A.SUCCEEDED, 0, None),
    ]
    _, outcomes = await db.attempts.settle(launched=[], finishes=finishes, now=clock.now())
    assert {o.job_state for o in outcomes} == {J.QUARANTINED, J.SUCCEEDED}
    [attempt] = await db.attempts.list(job_id=mine.job.id)
    assert attempt.reason is not None
    assert attempt.reason.startswith("assertion failed: expect_body /ok/ (not in the body")
    assert "\x00" not in attempt.reason
    assert len(await _callbacks(db)) == 2


# --- no quota counts a callback job ---------------------------------------------------------


async def test_a_tenant_at_its_max_running_still_has_its_callback_delivered(
    db: store.Store, clock: FrozenClock
) -> None:
    """max_running 1: with one job running, the tenant's callback job is still claimed (the
    tenant's other jobs wait), and a callback job running takes none of its room."""
    caps = {"acme": 1}
    c = await _claimed(db, clock)
    await db.attempts.finish(finishes=[Finish(c.attempt.id, A.SUCCEEDED, 0, None)], now=clock.now())
    [cb] = await _callbacks(db)
    plain = [model.NewJob(executor="noop", spec={}, tenant="acme") for _ in range(2)]
    first, second = [i for i, _ in await db.jobs.submit(new=plain, now=clock.now())]
    assert (await db.tenants.use(tenant="acme")).waiting == 2  # the callback not counted
    [running] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"], tenants=caps)
    assert running.job.id == first
    taken = await db.jobs.claim(now=clock.now(), limit=5, executors=["noop", "http"], tenants=caps)
    assert [t.job.id for t in taken] == [cb.id], "the callback, and no other job of acme"
    assert (await db.tenants.use(tenant="acme")).running == 1  # the callback not counted
    done = Finish(running.attempt.id, A.SUCCEEDED, 0, None)
    await db.attempts.finish(finishes=[done], now=clock.now())
    [then] = await db.jobs.claim(now=clock.now(), limit=5, executors=["noop"], tenants=caps)
    assert then.job.id == second, "the callback running holds none of acme's room"


@pytest.mark.parametrize("state", [A.SUCCEEDED, A.FAILED])
async def test_a_callback_jobs_run_log_counts_toward_no_run_log_bytes(
    db: store.Store, clock: FrozenClock, state: model.AttemptState
) -> None:
    """Its delivery's run log is kept (a success by the hot settle, a failure by the general
    one) and shown, but of 0 bytes as the tenant's run_log_bytes counts it."""
    out = launching.RunLog(streams=(launching.Stream("stdout", "x" * 100, 100),))
    c = await _claimed(db, clock)
    await db.attempts.finish(
        finishes=[Finish(c.attempt.id, A.SUCCEEDED, 0, None, output=out)], now=clock.now()
    )
    assert await db.runlogs.kept(tenant="acme") == {"acme": 100}
    [delivery] = await db.jobs.claim(now=clock.now(), limit=1, executors=["http"])
    said = Finish(delivery.attempt.id, state, None, "HTTP 200", output=_response())
    await db.attempts.settle(launched=[], finishes=[said], now=clock.now())
    assert await db.runlogs.kept(tenant="acme") == {"acme": 100}
    [log] = (await db.runlogs.of_job(job_id=delivery.job.id)).values()
    assert log.stream("response") is not None
    assert (await db.tenants.use(tenant="acme")).log_bytes == 100
