"""`corral jobs explain`: one line on why a job is not running now."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from corral import client, model
from corral.testing import FrozenClock

NOW = FrozenClock().now()
JOB = model.Job(
    id=7,
    tenant="default",
    queue="default",
    pool=None,
    priority=0,
    executor="process",
    spec={},
    payload=None,
    state=model.JobState.QUEUED,
    run_at=NOW,
    idempotency_key=None,
    max_attempts=3,
    attempt_count=0,
    labels={},
    created_at=NOW,
    updated_at=NOW,
)


def say(job: model.Job, attempts: list[model.Attempt] | None = None, last: str = "") -> str:
    events = [model.Event(1, job.id, None, "job", None, job.state, last, NOW, {})]
    return client.explain.why(client.jobs.JobView(job, attempts or [], events), NOW)


def test_not_due_yet() -> None:
    assert say(replace(JOB, run_at=NOW + timedelta(seconds=90))).startswith("not due yet: runs at")


def test_backoff_after_a_failure() -> None:
    line = say(replace(JOB, attempt_count=1, run_at=NOW + timedelta(seconds=4)))
    assert line.startswith("backoff: attempt 1 failed; attempt 2 is due at")
    assert "(in 4.0s)" in line


def test_due_but_nobody_dispatching() -> None:
    assert "waiting for a dispatcher running executor 'process'" in say(JOB)


def test_running_names_the_attempt() -> None:
    attempt = model.Attempt(
        id=12,
        job_id=7,
        attempt_no=2,
        launch_name="corral-7-2",
        executor="process",
        state=model.AttemptState.RUNNING,
        created_at=NOW,
        updated_at=NOW,
        started_at=NOW,
        finished_at=None,
        exit_code=None,
        reason=None,
        last_seen_at=NOW,
    )
    line = say(replace(JOB, state=model.JobState.RUNNING, attempt_count=2), [attempt])
    assert line.startswith("running: attempt 2 (corral-7-2, fence 12) is running")


def test_ended_jobs_say_the_last_reason() -> None:
    line = say(replace(JOB, state=model.JobState.FAILED), last="attempt 3 failed: no attempts left")
    assert line == "failed: attempt 3 failed: no attempts left"
