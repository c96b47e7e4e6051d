"""How corral's things look as JSON (jobs, attempts, run logs, schedules, tokens,
workers, alerts, bulk operations, ...): the same in the CLI's --json and in the API,
written once here."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from corral import (
    access,
    cadence,
    firing_stats,
    launching,
    model,
    python_tasks,
    redaction,
    scheduling,
    usage,
)

if TYPE_CHECKING:
    from corral import alert_settings, flows, loops, store


def shown(value: Any) -> Any:
    """A spec or template as it may be shown: its secrets redacted (redaction.redacted)."""
    return redaction.redacted(value)


def iso(at: datetime | None) -> str | None:
    return at.isoformat() if at else None


def job_dict(job: model.Job) -> dict[str, Any]:
    return _job_dict(job, shown(job.spec), datetime.isoformat)


def job_dicts(
    jobs: Iterable[model.Job], *, times_as_they_are: bool = False
) -> list[dict[str, Any]]:
    """job_dict of each job, a spec that several share shown once: the store reads one
    object for one spec's text, and a page of jobs often has a few specs between them.
    `times_as_they_are`: the times left as datetimes, for a JSON writer that writes them as
    isoformat does (orjson, in C: three isoformat calls a job were a tenth of a list's CPU)."""
    at: Callable[[datetime], Any] = _as_it_is if times_as_they_are else datetime.isoformat
    specs: dict[int, Any] = {}  # by the spec's id(): every job, so every spec, outlives it
    out = []
    for job in jobs:
        spec = specs.get(id(job.spec))
        if spec is None:
            spec = specs[id(job.spec)] = shown(job.spec)
        out.append(_job_dict(job, spec, at))
    return out


def _as_it_is(at: datetime) -> datetime:
    return at


def _job_dict(job: model.Job, spec: Any, at: Callable[[datetime], Any]) -> dict[str, Any]:
    return {
        "id": job.id,
        "state": job.state,
        "queue": job.queue,
        "pool": job.pool,
        "flow": job.flow,
        "tenant": job.tenant,
        "priority": job.priority,
        "executor": job.executor,
        "spec": spec,
        "payload": job.payload,
        "attempts": job.attempt_count,
        "charged_attempts": job.charged_attempts,
        "max_attempts": job.max_attempts,
        "run_at": at(job.run_at),
        "idempotency_key": job.idempotency_key,
        "labels": job.labels,
        "policy": job.policy,
        "code_version": job.code_version,
        "callback": shown(job.callback),
        "failure_callback": shown(job.failure_callback),
        "callback_of": job.callback_of,
        "created_at": at(job.created_at),
        "updated_at": at(job.updated_at),
    }


HTTP = "http"
"""The executor of HTTP jobs, whose target is a method and a URL."""
WAITING = (model.JobState.SCHEDULED, model.JobState.QUEUED, model.JobState.PARKED)
"""The states of a job still to run: its next run is its run_at."""


def listed_dicts(
    page: store.job_lists.Page, *, times_as_they_are: bool = False
) -> list[dict[str, Any]]:
    """The jobs of a page of the job list as the API lists them: job_dicts, and what the
    list shows of each beside it (listed_facts)."""
    at: Callable[[datetime], Any] = _as_it_is if times_as_they_are else datetime.isoformat
    shaped = job_dicts(page.jobs, times_as_they_are=times_as_they_are)
    for out, job in zip(shaped, page.jobs, strict=True):
        out.update(listed_facts(job, page.runs.get(job.id), at))
    return shaped


def listed_facts(
    job: model.Job,
    run: store.job_lists.LastRun | None,
    at: Callable[[datetime], Any] = datetime.isoformat,
) -> dict[str, Any]:
    """What the job list shows of a job beside its row: what it does (`target`), its
    schedule, its last attempt's HTTP status, exit code and response time (seconds), and
    when it runs next (its run_at while it waits to run; null once it has begun)."""
    return {
        "target": job_target(job),
        "schedule": job_schedule(job),
        "last_status": run.status if run else None,
        "last_exit_code": run.exit_code if run else None,
        "response_time": run.response_time if run else None,
        "next_run": at(job.run_at) if job.state in WAITING else None,
    }


def job_target(job: model.Job) -> dict[str, Any]:
    """What a job does, its secrets redacted: an HTTP job's method and URL (`kind` http), a
    command (`kind` command), a Python task (`kind` task), a container's image and command
    (`kind` its executor); any other job's executor alone."""
    spec = job.spec
    if job.executor == HTTP and isinstance(spec.get("url"), str):
        method = str(spec.get("method", "GET")).upper()
        return {"kind": "http", "method": method, "url": redaction.redacted(spec["url"])}
    if job.executor == python_tasks.PYTHON and isinstance(spec.get("task"), str):
        return {"kind": "task", "task": spec["task"], "version": spec.get("version")}
    command = command_text(spec.get("command"))
    if isinstance(spec.get("image"), str):
        return {"kind": job.executor, "image": shown(spec["image"]), "command": command}
    if command is not None:
        return {"kind": "command", "command": command}
    return {"kind": job.executor}


def command_text(command: Any) -> str | None:
    """A command (a list of arguments) as one line a shell reads back the same, its URLs'
    secrets redacted; None for what is no command."""
    if not isinstance(command, list) or not command:
        return None
    return redaction.redacted_text(shlex.join(str(part) for part in command))


def job_schedule(job: model.Job) -> str | None:
    """The schedule whose firing made a job (its payload says), or None."""
    firing = job.payload.get(scheduling.FIRING) if isinstance(job.payload, Mapping) else None
    named = firing.get("schedule") if isinstance(firing, Mapping) else None
    return named if isinstance(named, str) else None


def attempt_dict(a: model.Attempt) -> dict[str, Any]:
    return {
        "fence": a.id,
        "attempt": a.attempt_no,
        "launch_name": a.launch_name,
        "state": a.state,
        "charged": a.charged,
        "started_at": iso(a.started_at),
        "finished_at": iso(a.finished_at),
        "exit_code": a.exit_code,
        "reason": a.reason,
        "last_seen_at": iso(a.last_seen_at),
        "deadline_at": iso(a.deadline_at),
        "lease_until": iso(a.lease_until),
        "failure_class": a.failure_class,
        "fingerprint": a.fingerprint,
    }


def view_dict(view: Any) -> dict[str, Any]:
    return {
        **job_dict(view.job),
        "attempt_list": [
            {**attempt_dict(a), **log_facts(view.logs.get(a.id))} for a in view.attempts
        ],
        "events": [
            {
                "at": e.at.isoformat(),
                "entity": e.entity,
                "attempt_id": e.attempt_id,
                "from": e.from_state,
                "to": e.to_state,
                "reason": e.reason,
                "details": e.details,
            }
            for e in view.events
        ],
    }


def log_facts(log: launching.RunLog | None) -> dict[str, Any]:
    """What an attempt's run log says of how it went (its streams: `corral jobs logs`), and
    when its output was trimmed for its tenant's run_log_bytes (null: it was not)."""
    return {
        "http_status": log.status if log else None,
        "latency": log.latency if log else None,
        "address": log.address if log else None,
        "output_trimmed_at": iso(log.trimmed_at) if log else None,
    }


TRIMMED = "trimmed to keep its tenant under its run_log_bytes quota"
"""What a job's page and `corral jobs show` say of an attempt whose output was trimmed."""


def tenant_dict(view: usage.View) -> dict[str, Any]:
    """A tenant's quotas, each with its limit (null: none) and its use (null: nothing to
    use), and its weight: `corral tenants --json`, GET /api/v1/tenant."""
    return {
        "tenant": view.tenant,
        "weight": view.weight,
        "quotas": {q.name: {"limit": q.limit, "use": q.use} for q in view.quotas},
    }


def schedule_dict(s: scheduling.Schedule) -> dict[str, Any]:
    return {
        "id": s.id,
        "name": s.name,
        "tenant": s.tenant,
        "cron": s.cron,
        "tz": s.tz,
        "every_seconds": s.every_seconds,
        "start": iso(s.anchor),
        "until": iso(s.until),
        "catchup": s.catchup.value,
        "catchup_window_seconds": s.catchup_window_seconds,
        "catchup_max": s.catchup_max,
        "overlap": s.overlap.value,
        "jitter_seconds": s.jitter_seconds,
        "pause_after": s.pause_after,
        "paused": s.paused_at is not None,
        "paused_at": iso(s.paused_at),
        "paused_reason": s.paused_reason,
        "next_due": iso(s.next_due),
        "last_nominal": iso(s.last_nominal),
        "last_job_id": s.last_job_id,
        "missed_total": s.missed_total,
        "template": shown(dict(s.template)),
        "created_at": iso(s.created_at),
        "updated_at": iso(s.updated_at),
    }


def nominal_dict(n: cadence.Nominal) -> dict[str, Any]:
    return {"at": n.local.isoformat(), "utc": iso(n.at), "moved": n.moved}


def firing_dict(f: scheduling.Firing) -> dict[str, Any]:
    return {
        "nominal_at": iso(f.nominal_at),
        "outcome": f.outcome.value,
        "job_id": f.job_id,
        "recorded_at": iso(f.recorded_at),
        "lateness_seconds": f.lateness_seconds,
        "note": f.note,
    }


def token_dict(t: access.Token) -> dict[str, Any]:
    return {
        "id": t.id,
        "name": t.name,
        "tenant": t.tenant,
        "role": str(t.role),
        "created_at": iso(t.created_at),
        "expires_at": iso(t.expires_at),
        "revoked_at": iso(t.revoked_at),
    }


def secret_dict(s: access.SigningSecret) -> dict[str, Any]:
    """A signing secret as it may be shown: its fingerprint, never its value."""
    return {
        "id": s.id,
        "tenant": s.tenant,
        "fingerprint": s.fingerprint,
        "created_at": iso(s.created_at),
        "retires_at": iso(s.retires_at),
    }


def explanation(said: str) -> dict[str, Any]:
    """A job's explanation (`corral jobs explain`, /explain): its cause, the words before
    the first colon, and the whole line."""
    return {"cause": said.partition(":")[0], "explanation": said}


def audit_dict(a: access.AuditEntry) -> dict[str, Any]:
    return {
        "id": a.id,
        "at": a.at.isoformat(),
        "token_id": a.token_id,
        "tenant": a.tenant,
        "action": a.action,
        "target": a.target,
        "details": dict(a.details),
    }


def operation_dict(op: model.Operation) -> dict[str, Any]:
    """A bulk operation: what, for whom, how far it has come."""
    return {
        "id": op.id,
        "tenant": op.tenant,
        "action": op.action.value,
        "filter": dict(op.filter),
        "state": op.state.value,
        "total": op.total,
        "applied": op.applied,
        "skipped": op.skipped,
        "left": op.left,
        "made_by": op.made_by,
        "token_id": op.token_id,
        "created_at": iso(op.created_at),
        "updated_at": iso(op.updated_at),
        "finished_at": iso(op.finished_at),
    }


def alert_rule_dict(rule: alert_settings.AlertRule, muted_until: datetime | None) -> dict[str, Any]:
    """An alert rule of the settings, and until when it is muted (None: it is not)."""
    return {
        "on": list(rule.on),
        "match": rule.match.model_dump(exclude_defaults=True),
        "channels": list(rule.channels),
        "throttle": rule.throttle.total_seconds(),
        "muted_until": iso(muted_until),
    }


def flow_dict(found: flows.Flow, use: flows.Use | None = None) -> dict[str, Any]:
    """A tenant's flow: its limits (`rate` as N/PERIOD, null for none), its hold, and with
    `use` what it uses now (its starts in its window, its jobs running)."""
    shown: dict[str, Any] = {
        "name": found.name,
        "tenant": found.tenant,
        "rate": None if found.rate is None else str(found.rate),
        "parallelism": found.parallelism,
        "held_until": None if found.held_until is None else iso(found.held_until),
        "held_reason": found.held_reason,
        "created_at": iso(found.created_at),
        "updated_at": iso(found.updated_at),
    }
    if use is not None:
        shown |= {"started_in_window": use.started, "running": use.running}
    return shown


def tenant_channel_dict(found: store.tenant_alerts.TenantChannel) -> dict[str, Any]:
    """A tenant's alert channel as it may be shown: never its secret, nor a web URL whole."""
    from corral import tenant_alerts  # its settings' models: not for every command's start

    return {
        "name": found.name,
        "tenant": found.tenant,
        "kind": found.kind,
        **tenant_alerts.shown_config(found.kind, found.config),
        "created_at": iso(found.created_at),
    }


def tenant_rule_dict(
    found: store.tenant_alerts.TenantRule, muted_until: datetime | None
) -> dict[str, Any]:
    """A tenant's alert rule, its name in the outbox and mutes, and until when it is muted."""
    from corral import tenant_alerts

    return {
        "name": found.name,
        "tenant": found.tenant,
        "alerts_as": tenant_alerts.qualified(found.tenant, found.name),
        **found.rule,
        "muted_until": iso(muted_until),
        "created_at": iso(found.created_at),
    }


def alert_brief_dict(a: store.alerts.Alert) -> dict[str, Any]:
    """A message of the alerts outbox as the API lists it: its tries counted."""
    return {
        "id": a.id,
        "rule": a.rule,
        "channel": a.channel,
        "kind": a.kind,
        "cause": a.cause,
        "subject": a.subject,
        "job_id": a.job_id,
        "state": a.state,
        "created_at": a.created_at.isoformat(),
        "delivered_at": iso(a.delivered_at),
        "tries": a.tries,
        "last_error": a.last_error,
    }


def alert_dict(a: store.alerts.Alert, tries: Iterable[store.alerts.Try]) -> dict[str, Any]:
    """A message of the alerts outbox in full (`corral alerts history --json`): its key,
    its details and every try."""
    return {
        "id": a.id,
        "key": a.dedupe_key,
        "rule": a.rule,
        "channel": a.channel,
        "kind": a.kind,
        "cause": a.cause,
        "subject": a.subject,
        "job_id": a.job_id,
        "state": a.state,
        "created_at": iso(a.created_at),
        "due_at": iso(a.due_at),
        "delivered_at": iso(a.delivered_at),
        "tries": [{"at": iso(at), "ok": ok, "error": error} for at, ok, error in tries],
        "last_error": a.last_error,
        "details": dict(a.details),
    }


def user_dict(u: access.User) -> dict[str, Any]:
    return {
        "id": u.id,
        "name": u.name,
        "tenant": u.tenant,
        "role": str(u.role),
        "created_at": iso(u.created_at),
    }


def worker_dict(w: python_tasks.Worker) -> dict[str, Any]:
    """A registered worker as the API and `corral workers --json` show it."""
    return {
        "id": w.id,
        "app": w.app,
        "app_version": w.app_version,
        "host": w.host,
        "pid": w.pid,
        "queues": list(w.queues),
        "concurrency": w.concurrency,
        "state": w.state.value,
        "started_at": w.started_at.isoformat(),
        "last_seen_at": w.last_seen_at.isoformat(),
        "stopped_at": w.stopped_at.isoformat() if w.stopped_at else None,
        "reads": [{"task": r.task, "version": r.version, "newest": r.newest} for r in w.reads],
    }


def parked_dict(p: python_tasks.ParkedJob) -> dict[str, Any]:
    """A parked job as the API and `corral parked list --json` show it."""
    return {
        "job_id": p.job.id,
        "tenant": p.job.tenant,
        "queue": p.job.queue,
        "task": p.task,
        "version": p.version,
        "needs_app_version": p.needs_app_version,
        "parked_at": p.parked_at.isoformat() if p.parked_at else None,
        "reason": p.reason,
    }


def status_dict(status: loops.Status) -> dict[str, Any]:
    """`corral status --json`: every loop the store knows, whether each is alive, and the
    conditions of work nobody can do that hold now."""
    return {
        "heartbeat_interval": status.heartbeat.total_seconds(),
        "loops": [
            {
                "id": loop.id,
                "kind": loop.kind,
                "state": state.value,
                "runs": list(loop.runs),
                "executors": list(loop.executors),
                "host": loop.host,
                "pid": loop.pid,
                "version": loop.version,
                "started_at": iso(loop.started_at),
                "beat_at": iso(loop.beat_at),
                "stopped_at": iso(loop.stopped_at),
            }
            for loop, state in status.loops
        ],
        "warnings": [{"condition": c, "message": m} for c, m in status.warnings.items()],
    }


# --- a schedule's history and stats (corral.firing_stats) --------------------------------------


def firing_row_dict(row: firing_stats.FiringRow) -> dict[str, Any]:
    """One firing of a schedule's history: its nominal time (UTC, "Z": it may be given back
    as a page's `before`), the seconds from it to its job's first start, its job and what
    that came to (state, HTTP status or exit code, response time in seconds), its outcome."""
    run = row.run
    return {
        "nominal_at": model.iso(row.nominal_at),
        "outcome": row.outcome.value,
        "lateness": row.lateness,
        "job_id": row.job_id,
        "job_state": run.state.value if run else None,
        "status": run.status if run else None,
        "exit_code": run.exit_code if run else None,
        "response_time": run.response_time if run else None,
        "note": row.note,
    }


def firing_page_dict(
    rows: Iterable[firing_stats.FiringRow], after: datetime | None
) -> dict[str, Any]:
    """A page of a schedule's firings, the latest first, and `next`: the `before` of the
    next page (null on the last one)."""
    return {
        "firings": [firing_row_dict(r) for r in rows],
        "next": model.iso(after) if after is not None else None,
    }


def tally_dict(counted: firing_stats.Tally) -> dict[str, Any]:
    """What some firings came to (corral.firing_stats says what counts as what)."""
    return {
        "firings": counted.firings,
        "outcomes": counted.outcomes(),
        "jobs": counted.jobs,
        "succeeded": counted.succeeded,
        "failed": counted.failed,
        "cancelled": counted.cancelled,
        "pending": counted.pending,
        "success_rate": counted.success_rate,
        "response_time": {
            "mean": counted.latency_mean,
            "max": counted.latency_max,
            "count": counted.latency_count,
        },
    }


def firing_stats_dict(stats: firing_stats.Stats) -> dict[str, Any]:
    """A schedule's stats: the last 24 hours by hour and the last 30 days by day (UTC), each
    window's sums and its buckets, the current one last."""

    def span(s: firing_stats.Span) -> dict[str, Any]:
        return {
            "start": model.iso(s.start),
            "bucket_seconds": int(s.width.total_seconds()),
            **tally_dict(s.total),
            "buckets": [
                {"start": model.iso(s.start + s.width * i), **tally_dict(b)}
                for i, b in enumerate(s.buckets)
            ],
        }

    return {
        "at": model.iso(stats.at),
        "last_24h": span(stats.last_24h),
        "last_30d": span(stats.last_30d),
    }
