"""What the run log says to people: which events are causes (`happening`), which rules
they match, and what a pass writes for them (`plan`): pure functions of the events, the
rules and what was sent before."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from corral import alert_settings, model, redaction
from corral.store.alert_reads import JobFacts
from corral.store.alert_subjects import (
    job_subject,
    key_subject,
    monitor_subject,
    schedule_subject,
    tenant_subject,
)

J, A = model.JobState, model.AttemptState

SUCCEEDED = "succeeded"
"""Not a cause a rule names: a success ends a subject's failures (its `recovered`)."""
STARTED = "started"
"""Not a cause either: a firing's job started; `schedule_late` where it started later
than a rule's `late_by` after its nominal time."""
NOT_RUN = {
    "missed": "schedule_missed",
    "overlap": "schedule_missed",
    "refused": "refused",
    "paused": "paused",
}
"""A schedule's news (of nominal times that did not run, or of its pause by corral) as
causes; refused for a quota of its tenant (`quota` in the event's details), the cause is
`quota`."""


@dataclass(frozen=True, slots=True)
class Happening:
    """One thing an event says happened to a job (or to a schedule), with what rules
    match on."""

    event_id: int
    at: datetime
    cause: str  # one of alert_settings.ALERT_CAUSES, SUCCEEDED or STARTED
    job_id: int | None  # None for a schedule's news
    queue: str
    tenant: str
    executor: str
    labels: Mapping[str, str]
    schedule: str | None
    reason: str
    failure_class: str | None = None
    late: timedelta | None = None  # STARTED: after its nominal time
    what: str | None = None  # what the job runs, as a message says it (secrets redacted)
    attempt_no: int | None = None  # its newest attempt, and how that one ended
    attempt_reason: str | None = None
    idempotency_key: str | None = None
    monitor: str | None = None  # a monitor's news: its name


def happening(event: model.Event, job: JobFacts | None) -> Happening | None:
    """What `event` of `job` (None: gone, or none, for a schedule's news) is to the
    rules, if anything."""
    details = event.details or {}
    if event.entity == "schedule":
        return _schedule_news(event, details)
    if event.entity == "monitor":
        return _monitor_news(event, details)
    if job is None or event.from_state is None:
        return None  # a job gone, or a job or attempt made: no news to anyone
    cls = details.get("failure_class")
    cause, late = _job_cause(event, job, details)
    if cause is None:
        return None
    return Happening(
        event_id=event.id,
        at=event.at,
        cause=cause,
        job_id=job.id,
        queue=job.queue,
        tenant=job.tenant,
        executor=job.executor,
        labels=job.labels,
        schedule=job.schedule,
        reason=event.reason,
        failure_class=cls if isinstance(cls, str) else None,
        late=late,
        what=what_it_runs(job.executor, job.spec),
        attempt_no=job.attempt_no,
        attempt_reason=job.attempt_reason,
        idempotency_key=job.idempotency_key,
    )


def _job_cause(
    event: model.Event, job: JobFacts, details: Mapping[str, Any]
) -> tuple[str | None, timedelta | None]:
    """The cause a change of a job or attempt is (None: none), and how late a firing's
    job started (for STARTED only)."""
    if event.from_state == event.to_state:  # a note: news about a state, not a change
        if event.entity != "job" or details.get("sla") != "missed":
            return None, None
        return "sla_missed", None
    if event.entity != "job":  # of an attempt, only its loss is news
        lost = event.entity == "attempt" and event.to_state == A.LOST
        return ("lost" if lost else None), None
    if event.to_state == J.RUNNING:
        if job.nominal is None:
            return None, None  # only a firing's start can be late
        return STARTED, event.at - job.nominal
    cause = _ENDS.get(event.to_state)
    if cause is None and details.get("budget") == "empty":
        return "budget_empty", None
    if cause is None and details.get("failure_class") == model.FailureClass.UNKNOWN:
        return "unknown", None
    return cause, None


WHAT_CHARS = 300
"""How much of what a job runs a message says."""


def what_it_runs(executor: str, spec: Mapping[str, Any]) -> str | None:
    """A job's work in one line, secrets redacted: an HTTP job's method and URL, a
    command, an image and its command, a task's name."""
    shown = redaction.redacted(dict(spec))
    if executor == "http" and isinstance(shown.get("url"), str):
        said = f"{str(shown.get('method', 'GET')).upper()} {shown['url']}"
    elif isinstance(shown.get("command"), list):
        said = " ".join(str(part) for part in shown["command"])
        if isinstance(shown.get("image"), str):
            said = f"{shown['image']}: {said}"
    elif isinstance(shown.get("task"), str):
        said = f"task {shown['task']}"
    else:
        return None
    return said if len(said) <= WHAT_CHARS else said[: WHAT_CHARS - 1] + "…"


_ENDS: dict[str, str] = {J.QUARANTINED: "quarantined", J.FAILED: "failed", J.SUCCEEDED: SUCCEEDED}


def _schedule_news(event: model.Event, details: Mapping[str, Any]) -> Happening | None:
    cause = NOT_RUN.get(event.to_state)
    if cause == "refused" and details.get("quota"):
        cause = "quota"
    labels = details.get("labels")
    if cause is None or not isinstance(details.get("schedule"), str):
        return None
    return Happening(
        event_id=event.id,
        at=event.at,
        cause=cause,
        job_id=None,
        queue=str(details.get("queue", "")),
        tenant=str(details.get("tenant", "")),
        executor=str(details.get("executor", "")),
        labels=labels if isinstance(labels, Mapping) else {},
        schedule=details["schedule"],
        reason=event.reason,
    )


MONITOR_CAUSES = {"down": "monitor_down", "failed": "monitor_failed", "up": "monitor_up"}
"""A monitor's news (the to_state of its event) as causes."""


def _monitor_news(event: model.Event, details: Mapping[str, Any]) -> Happening | None:
    """A monitor gone down, failed or back up (corral.monitoring): about the monitor, of
    its tenant; no job, queue nor executor."""
    cause = MONITOR_CAUSES.get(event.to_state)
    if cause is None or not isinstance(details.get("monitor"), str):
        return None
    return Happening(
        event_id=event.id,
        at=event.at,
        cause=cause,
        job_id=None,
        queue="",
        tenant=str(details.get("tenant", "")),
        executor="",
        labels={},
        schedule=None,
        reason=event.reason,
        monitor=details["monitor"],
    )


def matches(rule: alert_settings.AlertRule, h: Happening) -> bool:
    """Whether `h` is about what `rule` watches (its cause aside)."""
    m = rule.match
    wanted = (
        (m.queue, h.queue),
        (m.schedule, h.schedule),
        (m.tenant, h.tenant),
        (m.executor, h.executor),
        (m.monitor, h.monitor),
    )
    if any(want is not None and want != got for want, got in wanted):
        return False
    return all(h.labels.get(k) == v for k, v in m.labels.items())


def subject(h: Happening) -> str:
    """What a message is about: the job's schedule when it has one, else its idempotency
    key, else the job itself; each of its tenant's, never another tenant's of the same
    name; a monitor's news is about the monitor."""
    if h.monitor is not None:
        return monitor_subject(h.tenant, h.monitor)
    if h.schedule is not None:
        return schedule_subject(h.tenant, h.schedule)
    if h.idempotency_key is not None:
        return key_subject(h.tenant, h.idempotency_key)
    return job_subject(h.tenant, h.job_id or 0)


@dataclass(frozen=True, slots=True)
class Sent:
    """Where a rule and a subject stand: when the throttle window of its newest message
    opened, whether it owes a recovered message, and its streak."""

    window_at: datetime | None = None  # when the newest message's window opened
    owes_recovery: bool = False  # a failure was sent, and no recovered message since
    streak: int = 0  # the subject's news of the rule's causes in a row (rules._cause)


@dataclass(frozen=True, slots=True)
class Message:
    """One message to write for one channel (the outbox row)."""

    rule: str
    channel: str
    kind: str  # alert, recovered
    cause: str
    subject: str
    job_id: int | None
    dedupe_key: str
    due_at: datetime
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Digested:
    """A happening inside its subject's throttle window: counted into its tenant's digest
    of the rule for the period it falls in (digest_period), sent at the period's end."""

    rule: str
    channel: str
    subject: str  # the tenant's (tenant_subject): one digest of all its subjects
    window_start: datetime
    window_end: datetime
    job_id: int | None
    cause: str
    tenant: str
    about: str = ""  # the subject it is about

    @property
    def dedupe_key(self) -> str:
        return f"{self.rule}|{self.subject}|digest|{self.window_start.isoformat()}|{self.channel}"


DIGEST_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
"""Where digest periods are counted from: a rule's periods are its throttle long."""


def digest_period(at: datetime, throttle: timedelta) -> tuple[datetime, datetime]:
    """The period of a rule's digests `at` falls in: the same for every subject of a
    tenant, so what the rule holds back of all of them goes in one digest a period."""
    if throttle <= timedelta(0):
        return at, at
    start = DIGEST_EPOCH + throttle * ((at - DIGEST_EPOCH) // throttle)
    return start, start + throttle


NOT_FAILURES = frozenset(
    {"schedule_late", "schedule_missed", "refused", "quota", "paused", *MONITOR_CAUSES.values()}
)
"""Causes that are no job's failure: they have no recovered message to come (a monitor's
coming back up is a cause of its own, monitor_up)."""
BACK_UP = "monitor_up"
"""A monitor back up: told at once to a rule that names it, whatever its throttle (its
down or failed message opened the window), and never digested."""

ENDED_BADLY = frozenset({"failed", "quarantined"})
"""What counts toward `consecutive_failures`: a job that ended without succeeding."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What a pass writes: messages, digest entries, and where each rule and subject it
    changed now stands."""

    messages: list[Message]
    digested: list[Digested]
    standing: dict[tuple[str, str], Sent]


def plan(
    found: Sequence[Happening],
    rules: Mapping[str, alert_settings.AlertRule],
    sent: Mapping[tuple[str, str], Sent],
    *,
    muted: frozenset[str] = frozenset(),
) -> Plan:
    """The messages and digest entries `found` (in event order) makes, given what was
    `sent` before for each (rule, subject). The subject's news of a rule's causes counts
    in its streak, and makes something from the rule's `after`-th in a row on: outside its
    subject's throttle window a message, which opens the window; inside it, an entry of
    the tenant's digest of the rule. `consecutive_failures` counts the subject's jobs that
    ended badly. A success ends every streak but a lateness one (an on-time start ends
    that), and is a `recovered` message where a failure message of the same subject was
    sent. Muted rules make nothing, and count nothing."""
    now = dict(sent)
    out = Plan([], [], {})
    for h in found:
        for name, rule in rules.items():
            if name not in muted and matches(rule, h):
                _apply(out, now, name, rule, h)
    return out


def _apply(
    out: Plan,
    now: dict[tuple[str, str], Sent],
    name: str,
    rule: alert_settings.AlertRule,
    h: Happening,
) -> None:
    """What `h` makes under the rule `name`, added to `out`; `now` is where each rule and
    subject stands so far in the pass."""
    key = (name, subject(h))
    before = now.get(key, Sent())
    if h.cause == SUCCEEDED:
        if before.owes_recovery:
            out.messages.extend(_each_channel(rule, name, "recovered", h.cause, key[1], h))
        ends = before.streak if set(rule.on) <= _LATENESS else 0
        _stand(out, now, key, before, replace(before, owes_recovery=False, streak=ends))
        return
    if h.cause == BACK_UP:
        _back_up(out, now, name, rule, h, key, before)
        return
    cause, counted = _cause(rule, h, before)
    before = _stand(out, now, key, before, counted)
    if cause is None:
        return
    opened = before.window_at
    # Inside the window, even after a recovery: a flapping subject is one message,
    # digested news and one recovered message, not one of each per flap.
    if opened is not None and h.at < opened + rule.throttle:
        start, end = digest_period(h.at, rule.throttle)
        about = tenant_subject(h.tenant)
        out.digested.extend(
            Digested(name, ch, about, start, end, h.job_id, cause, h.tenant, key[1])
            for ch in rule.channels
        )
        return
    owes = before.owes_recovery or cause not in NOT_FAILURES
    now[key] = out.standing[key] = replace(before, window_at=h.at, owes_recovery=owes)
    out.messages.extend(
        _each_channel(rule, name, "alert", cause, key[1], h, _extra(cause, h, before))
    )


def _back_up(
    out: Plan,
    now: dict[tuple[str, str], Sent],
    name: str,
    rule: alert_settings.AlertRule,
    h: Happening,
    key: tuple[str, str],
    before: Sent,
) -> None:
    """A monitor back up: its streak ends; a rule that names monitor_up tells it at once,
    whatever its throttle window."""
    _stand(out, now, key, before, replace(before, streak=0))
    if BACK_UP in rule.on:
        out.messages.extend(_each_channel(rule, name, "alert", BACK_UP, key[1], h))


_LATENESS = frozenset({"schedule_late"})
"""A rule on lateness alone: a success ends no streak of it (a late firing may succeed)."""


def _stand(
    out: Plan, now: dict[tuple[str, str], Sent], key: tuple[str, str], before: Sent, after: Sent
) -> Sent:
    """Where `key` stands after a happening: changed, it is written in the plan too."""
    if after != before:
        now[key] = out.standing[key] = after
    return after


def _extra(cause: str, h: Happening, before: Sent) -> dict[str, Any]:
    """What a message of `cause` says beyond the happening: a streak's length, or how late
    a firing started."""
    if cause == "consecutive_failures":
        return {"streak": before.streak}
    if h.late is not None:
        return {"late_seconds": h.late.total_seconds()}
    return {}


def _cause(rule: alert_settings.AlertRule, h: Happening, before: Sent) -> tuple[str | None, Sent]:
    """The cause `h` is to `rule` (None: none it makes a message or digest entry of yet),
    and the subject's streak after it. A late start is `schedule_late` (an on-time one
    ends a streak of lateness); a job that ended badly counts toward
    `consecutive_failures`; each counts in the streak, and is a cause from the rule's
    `after`-th in a row on."""
    cause = h.cause
    if cause == STARTED:
        if h.late is None or h.late <= rule.late_by:
            ends = "schedule_late" in rule.on and before.streak > 0
            return None, (replace(before, streak=0) if ends else before)
        cause = "schedule_late"
    if cause not in rule.on:
        if cause not in ENDED_BADLY or "consecutive_failures" not in rule.on:
            return None, before
        cause = "consecutive_failures"
    before = replace(before, streak=before.streak + 1)
    return (cause if before.streak >= rule.in_a_row(cause) else None), before


def _each_channel(
    rule: alert_settings.AlertRule,
    name: str,
    kind: str,
    cause: str,
    about: str,
    h: Happening,
    extra: Mapping[str, Any] | None = None,
) -> list[Message]:
    details = {
        **(extra or {}),
        "reason": h.reason,
        "queue": h.queue,
        "tenant": h.tenant,
        "schedule": h.schedule,
        "executor": h.executor,
        "failure_class": h.failure_class,
        "at": h.at.isoformat(),
        "what": h.what,
        "attempt": h.attempt_no,
        "attempt_reason": h.attempt_reason,
        **({"monitor": h.monitor} if h.monitor is not None else {}),
    }
    return [
        Message(
            rule=name,
            channel=channel,
            kind=kind,
            cause=cause,
            subject=about,
            job_id=h.job_id,
            dedupe_key=f"{name}|{about}|{cause}|event:{h.event_id}|{channel}",
            due_at=h.at,
            details=details,
        )
        for channel in rule.channels
    ]
