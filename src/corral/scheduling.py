"""Schedules and their firings as plain data: a schedule (a job template plus when), each
firing (one nominal time, unique per schedule: the scheduler's fence), what became of it,
and what a firing's job is told about the interval it is for.

Pure, as corral.model is; when a schedule is due is corral.cadence's, what a scheduler
fires corral.scheduler's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from corral import model


class Catchup(StrEnum):
    """What a schedule does about nominal times that passed while nobody fired them."""

    NONE = "none"  # fire the latest one only; the others are recorded as missed
    ALL = "all"  # fire each of them, within a window and up to a number


class Overlap(StrEnum):
    """What a firing does while the previous firing's job has not ended."""

    ALLOW = "allow"
    FORBID = "forbid"  # skip this firing (recorded as `overlap`)
    REPLACE = "replace"  # cancel the previous job, then fire


class FiringOutcome(StrEnum):
    """What became of one nominal time of a schedule."""

    FIRED = "fired"  # a job was created for it
    MISSED = "missed"  # it passed while no scheduler ran, and catch-up did not fire it
    SKIPPED = "skipped"  # it passed while the schedule was paused
    OVERLAP = "overlap"  # the previous firing's job still ran, and overlap is `forbid`
    REFUSED = "refused"  # a tenant's schedule: its grant withdrawn, or a quota of its tenant full
    BACKFILLED = "backfilled"  # a job was created for it by `corral backfill`


TEMPLATE_FIELDS = (
    "executor",
    "spec",
    "payload",
    "queue",
    "pool",
    "tenant",
    "priority",
    "max_attempts",
    "labels",
    "policy",
    "code_version",
    "callback",
    "failure_callback",
    "flow",
)
"""The fields of a model.NewJob a schedule keeps as its job template (run_at and the idempotency
key are the firing's): its callbacks are each firing's job's."""


def job_template(new: model.NewJob) -> dict[str, Any]:
    """A schedule's job template, as JSON: `new`'s fields but run_at and the key (and its
    callbacks and flow only when it has one, as templates made before them have none)."""
    template = {}
    for name in TEMPLATE_FIELDS:
        value = getattr(new, name)
        if value is not None or name not in _WHEN_SET:
            template[name] = dict(value) if isinstance(value, Mapping) else value
    return template


_WHEN_SET = frozenset({"callback", "failure_callback", "flow"})


def job_from_template(template: Mapping[str, Any], **firing: Any) -> model.NewJob:
    """The job a firing creates from a template (`firing`: run_at, idempotency_key, and
    any field a backfill overrides)."""
    fields = {name: template[name] for name in TEMPLATE_FIELDS if name in template}
    return model.NewJob(**{**fields, **firing})


@dataclass(frozen=True, slots=True)
class NewSchedule:
    """A schedule as created, validated at the edge: when (`cron` in `tz`, or every
    `every_seconds` from `anchor`), and the job each firing creates."""

    name: str
    template: Mapping[str, Any]
    tenant: str = "default"
    cron: str | None = None
    tz: str = "UTC"
    every_seconds: int | None = None
    anchor: datetime | None = None  # the interval's origin, and no firing before it
    catchup: Catchup = Catchup.NONE
    catchup_window_seconds: float = 7 * 86400.0
    catchup_max: int = 100
    overlap: Overlap = Overlap.ALLOW
    jitter_seconds: float = 0.0
    until: datetime | None = None  # no firing at or after it
    tenant_made: bool = False  # through the API or the dashboard: firings check the grant
    pause_after: int | None = None  # paused after N failed firings; None: the tenant's; 0: never


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule as the store holds it. `next_due` is the next nominal time to fire
    (None once `until` has passed); `last_nominal` the latest one recorded."""

    id: int
    name: str
    tenant: str
    cron: str | None
    tz: str
    every_seconds: int | None
    anchor: datetime
    template: Mapping[str, Any]
    catchup: Catchup
    catchup_window_seconds: float
    catchup_max: int
    overlap: Overlap
    jitter_seconds: float
    until: datetime | None
    paused_at: datetime | None
    next_due: datetime | None
    last_nominal: datetime | None
    last_job_id: int | None
    missed_total: int
    created_at: datetime
    updated_at: datetime
    tenant_made: bool = False  # its tenant's grant is checked at each firing
    pause_after: int | None = None  # paused after N failed firings; None: the tenant's; 0: never
    paused_reason: str | None = None  # why corral paused it (None: paused by hand, or running)
    counted_from: datetime | None = None  # its last resume: no firing recorded before counts
    managed: bool = False  # made or changed by `corral apply`: `apply --prune` may delete it


@dataclass(frozen=True, slots=True)
class Firing:
    """One nominal time of a schedule: unique on (schedule, nominal time), so however many
    schedulers run, each nominal time is recorded, and fires, once."""

    schedule_id: int
    nominal_at: datetime
    outcome: FiringOutcome
    job_id: int | None
    recorded_at: datetime
    lateness_seconds: float  # recorded_at - nominal_at
    note: str | None = None  # e.g. how DST moved it


@dataclass(frozen=True, slots=True)
class Fire:
    """What a scheduler records for one nominal time: the firing, and the job it creates
    (None for a missed, skipped or overlapping one)."""

    nominal_at: datetime
    outcome: FiringOutcome
    job: model.NewJob | None = None
    note: str | None = None
    quota: str | None = None  # refused: the tenant's quota it would have broken, if that is why


def firing_key(schedule_id: int, nominal_at: datetime) -> str:
    """The idempotency key of the job a schedule's firing creates: names the schedule and
    the nominal time, so a firing's job is made once however it is fired (a scheduler, a
    backfill, a trigger)."""
    at = nominal_at.astimezone(UTC)
    return f"schedule:{schedule_id}:{at.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}"


FIRING = "corral"
"""The key under which a firing's job finds, in its payload (an object), what it is for:
`{"schedule": name, "nominal_time", "interval_start", "interval_end"}` (ISO 8601, UTC)."""


def firing_payload(
    payload: Any, *, schedule: str, nominal: datetime, interval_end: datetime
) -> dict[str, Any]:
    """The payload of a firing's job: the template's (an object, or none) with what the
    firing is for under FIRING. The interval of a nominal time runs to the next one."""
    base = dict(payload) if isinstance(payload, Mapping) else {}
    base[FIRING] = {
        "schedule": schedule,
        "nominal_time": model.iso(nominal),
        "interval_start": model.iso(nominal),
        "interval_end": model.iso(interval_end),
    }
    return base


def firing_env(payload: Any) -> dict[str, str]:
    """CORRAL_SCHEDULE, CORRAL_NOMINAL_TIME and CORRAL_INTERVAL_START/END for the job of a
    firing (read from its payload); none for any other job."""
    said = payload.get(FIRING) if isinstance(payload, Mapping) else None
    if not isinstance(said, Mapping):
        return {}
    names = {
        "schedule": "CORRAL_SCHEDULE",
        "nominal_time": "CORRAL_NOMINAL_TIME",
        "interval_start": "CORRAL_INTERVAL_START",
        "interval_end": "CORRAL_INTERVAL_END",
    }
    return {env: said[key] for key, env in names.items() if isinstance(said.get(key), str)}
