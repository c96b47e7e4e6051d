"""Why a job is where it is, in one line: the answer of `corral explain`, the API's
/explain and the dashboard's job page."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from corral import flows, model, python_tasks
from corral.client import jobs


class Explain(jobs.Jobs):
    """Why a job is not running now."""

    async def explain(self, job_id: int) -> str:
        """One line: why the job is not running now (or what it is doing)."""
        return await self.explain_view(await self.job(job_id))

    async def explain_view(self, view: jobs.JobView, *, tenant: str | None = None) -> str:
        """`explain` of a job read already; a queued job in a pool is told the pool's
        running jobs of `tenant` (None: of every tenant)."""
        now = self.clock.now()
        held = None
        if view.job.flow is not None and view.job.state == model.JobState.QUEUED:
            held = await self._flow_holds(view.job, now)
        if held is not None:
            return held
        pool = view.job.pool or ""
        slots = self.settings.pools.get(pool)
        if slots is None or view.job.state != model.JobState.QUEUED:
            return why(view, self.clock.now())
        running = await self.store.jobs.pool_running(pools=[pool], tenant=tenant)
        return why(view, self.clock.now(), pool=(running.get(pool, 0), slots))

    async def _flow_holds(self, job: model.Job, now: datetime) -> str | None:
        """Why `job`'s flow holds it now, and when it may start (corral.flows.why_waiting);
        None when the job is not due yet or its flow has room."""
        if job.run_at > now or job.flow is None:
            return None
        flow = await self.store.flows.get(tenant=job.tenant, name=job.flow)
        if flow is None:
            return (
                f"{flows.HELD}: flow {job.flow!r} no longer exists; cancel the job, or add"
                f" the flow again (`corral flows add {job.flow} --tenant {job.tenant}`)"
            )
        return flows.why_waiting(flow, await self.store.flows.use(flow=flow, now=now), now)


def why(view: jobs.JobView, now: datetime, *, pool: tuple[int, int] | None = None) -> str:
    """Why a job is where it is, in one line, from its row, attempts and run log (and, for
    a job in a pool, the pool's (running, slots))."""
    job, J = view.job, model.JobState
    changes = [e for e in view.events if not (e.details or {}).get("sla")]  # not its notes
    last = changes[-1].reason if changes else ""
    if job.state == J.QUEUED:
        return _queued(view, now, changes[-1].details if changes else {}, pool)
    if job.state == J.RUNNING and view.attempts:
        return _running(view)
    if job.state == J.PARKED:
        return f"parked: no live worker can run it yet ({last})"
    if job.state == J.QUARANTINED:
        cause = last.removeprefix(QUARANTINED).removesuffix(WAITS)
        return (
            f"quarantined: waits for a person ({cause}); `corral dead retry {job.id}` after a fix,"
            f" or `corral dead discard {job.id}`"
        )
    return f"{job.state}: {last}"


QUARANTINED = "quarantined: "
WAITS = "; waits for a person"
"""The words around a quarantine's run-log line (retry.Decision.reason)."""


def quarantine_said(view: jobs.JobView) -> tuple[str, str]:
    """Why a quarantined job waits, in two parts, for a page that has its own words and
    buttons around them: what its attempt did ("attempt 2 failed permanently"), and what
    decided it (the failure rule, or the fingerprint of the failure it repeated), "" when
    its run log names neither. Its quarantine's run-log line, without the words around it."""
    quarantines = [e for e in view.events if e.to_state == model.JobState.QUARANTINED]
    if not quarantines:
        return "", ""
    last = quarantines[-1]
    said = last.reason.removeprefix(QUARANTINED).removesuffix(WAITS)
    details = last.details or {}
    for decided in (details.get("rule"), f"fingerprint {details.get('fingerprint')}"):
        if decided and said.endswith(f" ({decided})"):
            return said.removesuffix(f" ({decided})"), str(decided)
    return said, ""


def _queued(
    view: jobs.JobView, now: datetime, news: Mapping[str, Any], pool: tuple[int, int] | None
) -> str:
    """Why a queued job waits: its retry budget, its backoff, its run_at, its pool, or a
    dispatcher (or worker) to claim it; `news`: the details of its last change."""
    job = view.job
    wait = (job.run_at - now).total_seconds()
    at = job.run_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    if wait > 0 and news.get("budget") == "empty":
        return (
            f"budget empty: queue {job.queue!r} has spent its retry budget; attempt"
            f" {job.attempt_count + 1} waits for a token until {at} (in {wait:.1f}s)"
        )
    if wait > 0 and job.attempt_count:
        n = job.attempt_count
        how = view.attempts[-1].state if view.attempts else "failed"
        return f"backoff: attempt {n} {how}; attempt {n + 1} is due at {at} (in {wait:.1f}s)"
    if wait > 0:
        return f"not due yet: runs at {at} (in {wait:.0f}s)"
    if pool is not None and pool[0] >= pool[1]:
        return (
            f"pool full: pool {job.pool!r} runs {pool[0]} of its {pool[1]} slots;"
            " this job waits for one to free up"
        )
    if job.executor == python_tasks.PYTHON:
        task, version = python_tasks.task_of(job.spec)
        return (
            f"due now: waiting for a `corral worker` that reads task {task} version {version}"
            " to claim it (is one running with a free slot? `corral workers` lists them)"
        )
    return (
        f"due now: waiting for a dispatcher running executor {job.executor!r} to claim it"
        " (is `corral serve` or `corral dispatcher` running?)"
    )


def _running(view: jobs.JobView) -> str:
    """What a running job's newest attempt is doing, and when it last sent news."""
    a = view.attempts[-1]
    seen = a.last_seen_at.strftime("%H:%M:%S") if a.last_seen_at else "never"
    unknown = next(
        (
            e.reason
            for e in reversed(view.events)
            if e.attempt_id == a.id and e.details.get("unknown") == "wait"
        ),
        None,
    )
    waits = next(
        (e for e in reversed(view.events) if e.attempt_id == a.id and "waiting" in e.details),
        None,
    )
    state = f"in the unknown state: {unknown}" if unknown else f"{a.state}"
    if waits is not None and waits.details["waiting"] and not unknown:
        state = f"{a.state} but not started on its platform ({waits.reason})"
    return (
        f"running: attempt {a.attempt_no} ({a.launch_name}, fence {a.id}) is {state};"
        f" last news {seen}"
    )
