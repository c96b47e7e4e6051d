"""Failure handling end to end: `corral serve`'s loops, real processes, a real SQLite file.

Poison pills are quarantined and never launched again; a job past its deadline is killed
and classed transient; a job whose heartbeats stop meets its unknown-state policy; a
heartbeat from a superseded attempt is refused with exit code 3.

Where what is tested is the loops' decision on a lease, they run on a paused clock: the
test moves it past the lease once the job has sent its heartbeat, instead of waiting it
out. The jobs, and the process executor's stop at a deadline, keep real time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from unittest.mock import patch

import pytest

from corral import config, model
from corral.testing import PausedClock
from tests.integration.conftest import Corral
from tests.support.cli import clean_env, run_corral
from tests.support.wait import PATIENCE, eventually

J, A, FC = model.JobState, model.AttemptState, model.FailureClass
PY = sys.executable
HEARTBEAT = f"{PY} -m corral heartbeat"
LEASE = "2s"
"""The lease of the jobs that send heartbeats, in the tests whose loops run on a paused
clock: it passes only when the test moves that clock on, however long a job's Python takes
to start, import corral and send its first heartbeat on a loaded machine."""

pytestmark = [pytest.mark.slow, pytest.mark.timeout(6 * PATIENCE)]


def paused(corral: Corral) -> PausedClock:
    clk = corral.clock
    assert isinstance(clk, PausedClock), "a test of the paused_corral fixture"
    return clk


def moved_past(corral: Corral, at: datetime) -> None:
    """Move the loops' paused clock on to just past `at`."""
    clk = paused(corral)
    clk.advance(max((at - clk.now()).total_seconds(), 0.0) + 0.001)


@contextlib.asynccontextmanager
async def real_time(corral: Corral) -> AsyncIterator[None]:
    """While in the block, the loops' paused clock keeps up with the real time."""
    clk = paused(corral)

    async def follow() -> None:
        while True:
            clk.advance(max((datetime.now(UTC) - clk.now()).total_seconds(), 0.0))
            await asyncio.sleep(0.05)

    following = asyncio.create_task(follow())
    try:
        yield
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following


async def first_heartbeat(corral: Corral, job_id: int, attempt_no: int = 1) -> model.Attempt:
    """Attempt `attempt_no` of the job, running, once a heartbeat renewed its lease: from
    when the job sent it, on the job's real clock, later than the start of the lease on the
    loops' paused clock."""

    async def renewed() -> model.Attempt | None:
        for a in (await corral.client.job(job_id)).attempts:
            if a.attempt_no == attempt_no and a.state == A.RUNNING:
                assert a.started_at is not None
                assert a.lease_until is not None
                assert a.lease_seconds is not None
                first = a.started_at + timedelta(seconds=a.lease_seconds)
                return a if a.lease_until > first else None
        return None

    found: model.Attempt = await eventually(renewed, what=f"a heartbeat of attempt {attempt_no}")
    return found


async def unknown_states(corral: Corral, job_id: int) -> list[model.Event]:
    return [e for e in (await corral.client.job(job_id)).events if "unknown state" in e.reason]


async def test_a_poison_pill_is_quarantined_and_never_launched_again(corral: Corral) -> None:
    job_id = await corral.submit(
        'echo "$(date +%s%N) ERROR: no such table: users" >&2; exit 3', max_attempts=5
    )
    view = await corral.wait(job_id, J.QUARANTINED)
    assert [(a.state, a.exit_code, a.failure_class) for a in view.attempts] == [
        (A.FAILED, 3, FC.UNKNOWN),
        (A.FAILED, 3, FC.UNKNOWN),
    ]
    assert view.attempts[0].fingerprint == view.attempts[1].fingerprint, "the time is masked"
    await corral.after_a_round()  # a third launch would be made by now
    assert corral.runs(job_id) == [f"corral-{job_id}-1", f"corral-{job_id}-2"]
    assert (await corral.client.job(job_id)).job.state == J.QUARANTINED
    [dead] = await corral.client.dead()
    assert dead.job.id == job_id


async def test_a_permanent_exit_code_is_quarantined_after_one_attempt(corral: Corral) -> None:
    rule = {"on_exit_codes": {"operator": "In", "values": [4]}, "action": "fail"}
    job_id = await corral.submit("exit 4", max_attempts=5, policy={"failure_rules": [rule]})
    view = await corral.wait(job_id, J.QUARANTINED)
    assert [(a.exit_code, a.failure_class) for a in view.attempts] == [(4, FC.PERMANENT)]
    await corral.client.dead_retry(job_id)  # "after a fix": it fails again, straight back
    view = await corral.wait(job_id, J.QUARANTINED)
    assert len(view.attempts) == 2
    assert [e.reason for e in view.events if e.reason == "retried by a person"]


async def test_a_job_past_its_deadline_is_killed_and_classed_transient(corral: Corral) -> None:
    job_id = await corral.submit(
        "sleep 30", max_attempts=1, policy={"limits": {"attempt_deadline": "2s"}}
    )
    view = await corral.wait(job_id, J.FAILED)
    [a] = view.attempts
    assert (a.reason, a.failure_class) == ("deadline exceeded", FC.TRANSIENT)
    assert a.deadline_at == a.created_at + timedelta(seconds=2), "its own deadline, from the claim"
    assert a.finished_at is not None
    assert a.finished_at < a.created_at + timedelta(seconds=30), "killed, not left to finish"


async def test_silence_with_policy_wait_runs_to_the_deadline(paused_corral: Corral) -> None:
    corral = paused_corral
    policy = {
        "heartbeat": True,
        "on_unknown": "wait",
        # Its platform stops it at its deadline in real time: room for a Python to start and
        # send a heartbeat on a loaded machine, and for the silence after it to be seen.
        "limits": {"lease_timeout": LEASE, "attempt_deadline": "12s"},
    }
    job_id = await corral.submit(f"{HEARTBEAT} && sleep 60", max_attempts=1, policy=policy)
    a = await first_heartbeat(corral, job_id)
    assert not await unknown_states(corral, job_id)
    moved_past(corral, a.lease_until)  # and no heartbeat since: silent
    view = await corral.wait(job_id, J.FAILED)
    [a] = view.attempts
    assert (a.state, a.reason) == (A.FAILED, "deadline exceeded")
    waits = [e for e in view.events if e.details.get("unknown") == "wait"]
    assert len(waits) == 1
    assert waits[0].reason.startswith("unknown state (silent: no heartbeat for its lease")


async def test_silence_with_fence_and_relaunch_relaunches_and_refuses_the_old_fence(
    paused_corral: Corral,
) -> None:
    corral = paused_corral
    policy = {
        "heartbeat": True,
        "on_unknown": "fence_and_relaunch",
        "limits": {"lease_timeout": LEASE, "attempt_deadline": "40s"},
    }
    script = f'{HEARTBEAT} || exit 9; if [ "$CORRAL_ATTEMPT" = 1 ]; then sleep 60; fi; echo done'
    job_id = await corral.submit(script, max_attempts=2, policy=policy)
    a = await first_heartbeat(corral, job_id)
    assert not await unknown_states(corral, job_id)
    moved_past(corral, a.lease_until)  # and no heartbeat since: silent
    view = await corral.wait(job_id, J.SUCCEEDED)
    first, second = view.attempts
    assert (first.state, second.state) == (A.SUPERSEDED, A.SUCCEEDED)
    assert second.id > first.id
    assert any(e.reason.startswith("superseded: unknown state (silent") for e in view.events)
    # The superseded attempt was stopped on its platform.
    await eventually((corral.root / first.launch_name / "exit.json").exists, what="it stopped")
    exit_record = json.loads((corral.root / first.launch_name / "exit.json").read_text())
    assert exit_record["reason"] == "cancelled"
    # Its heartbeat, were it still alive, is refused: exit code 3 tells the job to stop.
    env = clean_env(
        {
            "CORRAL_JOB_ID": str(job_id),
            "CORRAL_ATTEMPT": "1",
            "CORRAL_FENCE": str(first.id),
            "CORRAL_DATABASE_URL": corral.database_url,
        }
    )
    proc = await asyncio.to_thread(run_corral, Path.cwd(), "heartbeat", env=env)
    assert proc.returncode == 3, proc.stderr
    assert f"fence {first.id} is stale: attempt 1 of job {job_id} is superseded" in proc.stderr


async def test_keep_alive_holds_the_lease_of_a_long_quiet_job(paused_corral: Corral) -> None:
    corral = paused_corral
    policy = {
        "heartbeat": True,
        "on_unknown": "fence_and_relaunch",
        "limits": {"lease_timeout": "4s", "heartbeat_interval": "1s", "attempt_deadline": "40s"},
    }
    code = (
        "import time; from corral.worker import keep_alive\n"
        "with keep_alive():\n"
        "    time.sleep(6)  # longer than its lease, from its first heartbeat\n"
        "print('done')"
    )
    job_id, _ = await corral.client.submit(
        spec={"command": [PY, "-c", code]}, max_attempts=2, policy=policy
    )
    a = await first_heartbeat(corral, job_id)  # the job is up: from now on, time passes
    async with real_time(corral):
        view = await corral.wait(job_id, J.SUCCEEDED)
    assert [a.state for a in view.attempts] == [A.SUCCEEDED], "never taken for silent"
    assert not [e for e in view.events if "unknown state" in e.reason]
    [done] = view.attempts
    assert done.finished_at is not None
    assert a.lease_until is not None
    assert done.finished_at > a.lease_until, "it ran on past the lease of its first heartbeat"


async def test_keep_alive_stops_a_superseded_attempt(corral: Corral) -> None:
    from corral import worker

    policy = {"heartbeat": True, "limits": {"lease_timeout": "5s"}}
    job_id = await corral.submit("sleep 30", max_attempts=2, policy=policy)
    await corral.wait(job_id, J.RUNNING)

    async def running() -> model.Attempt | None:
        first = (await corral.client.job(job_id)).attempts[0]
        return first if first.state == A.RUNNING else None

    a = await eventually(running, what="its attempt running")
    now = corral.client.clock.now()
    assert await corral.client.store.attempts.supersede(fences=[a.id], now=now, reason="test")
    told: list[str] = []
    attempt = worker.CurrentAttempt(job_id, 1, a.id, a.launch_name, "default", None)
    settings = config.Settings(database_url=corral.database_url)

    def watch() -> bool:
        with (
            patch.object(worker, "current_attempt", return_value=attempt),
            worker.keep_alive(
                0.2, on_stale=lambda: told.append("stop"), settings=settings
            ) as stale,
        ):
            return stale.wait(PATIENCE)

    assert await asyncio.to_thread(watch)
    assert told == ["stop"]
