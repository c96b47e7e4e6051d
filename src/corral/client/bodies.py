"""A job, a schedule or a rule to preview as a request gives it (the API's JSON body, or a
dashboard form read into the same shape), checked as every edge checks it before the
client stores it: the same checks, in one place, whoever asks.

`acts_for` is the tenant the asker acts for (a token's, a dashboard session's), or None
for one of every tenant. What is refused raises InvalidInput naming the field and the
rule (422), NotGranted for an executor or a cluster object the tenant may not use (403);
a tenant's quotas are held where the job or schedule is stored (`limited`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from corral import errors, model, plain, scheduling, tenancy
from corral.client import arguments, jobs, schedules
from corral.executors import references

EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
"""The times a request may give (since, until, run_at, a schedule's start and until, a
backfill's from and to) lie in [EARLIEST, LATEST): far from where dates overflow."""

RULE_FIELDS = (
    "cron",
    "tz",
    "every",
    "start",
    "until",
    "catchup",
    "catchup_window",
    "catchup_max",
    "overlap",
    "jitter",
    "pause_after",
)
"""A schedule's own keys; the rest of a body is its job template (as a submit takes it)."""
NOT_NULL = ("tz", "catchup", "catchup_window", "catchup_max", "overlap")
"""The keys of a schedule that have a value always (leave one out for its default)."""
TEMPLATE_FIELDS = tuple(f for f in jobs.SUBMIT_FIELDS if f not in ("run_at", "idempotency_key"))
"""A schedule's job template: a submit's fields but what each firing says for itself."""
PREVIEW_FIELDS = ("cron", "every", "tz", "start", "until", "count")
"""What a rule to preview may say: when it fires, and how many of its times to show."""
MAX_PREVIEW = 1000
"""The most nominal times one preview shows."""


def sees(acts_for: str | None, tenant: str) -> bool:
    """Whether one acting for `acts_for` may see and change `tenant`'s jobs and schedules."""
    return acts_for is None or acts_for == tenant


def instant(value: datetime, field: str) -> datetime:
    """`value` in UTC; InvalidInput naming `field` when it has no timezone or lies outside
    [EARLIEST, LATEST)."""
    if value.utcoffset() is None:
        raise errors.InvalidInput(f"{field}: must carry a timezone, e.g. 2026-12-01T09:00:00Z")
    try:
        at = value.astimezone(UTC)
    except OverflowError:
        at = LATEST
    if not EARLIEST <= at < LATEST:
        raise errors.InvalidInput(
            f"{field}: must lie from {EARLIEST.isoformat()} to before {LATEST.isoformat()}"
        )
    return at


def plain_json(given: Mapping[str, Any], *, prefix: str = "") -> None:
    """InvalidInput naming the field for what JSON carries but the databases cannot hold
    (corral.plain): a NUL or a lone surrogate in a string, a NaN or infinite number."""
    if (why := plain.refusal(given, prefix)) is not None:
        raise errors.InvalidInput(why)


def in_range(text: str, field: str) -> None:
    """A time of a body (with an offset, or wall time in the schedule's zone) that lies far
    from where dates overflow; InvalidInput naming `field` if not. Its form is checked
    where it is read."""
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        return
    if parsed.tzinfo is not None:
        instant(parsed, field)
    elif not EARLIEST.year < parsed.year < LATEST.year:
        raise errors.InvalidInput(
            f"{field}: must lie from {EARLIEST.isoformat()} to before {LATEST.isoformat()}"
        )


def _tenant_of(given: dict[str, Any], acts_for: str | None) -> dict[str, Any]:
    """A submitted job's arguments with its tenant: the asker's when not given; one the
    asker may not act for is refused naming the field."""
    tenant = given.get("tenant")
    if tenant is None:
        return {**given, "tenant": acts_for or "default"}
    if not isinstance(tenant, str) or not sees(acts_for, tenant):
        raise errors.InvalidInput(f"tenant: this token acts for tenant {acts_for!r} only")
    return given


async def new_job(c: jobs.Jobs, given: dict[str, Any], *, acts_for: str | None) -> model.NewJob:
    """A submitted job (`POST /api/v1/jobs`'s body: a submit's fields, with `delay` and
    `allow_past`), checked as any job is and for what the databases cannot hold (a Python
    task's: against the schema its workers registered); a tenant's (`tenant_made`), its
    spec as it may run. Store it with `limited=True`: the tenant's quotas hold there."""
    plain_json(given)
    args = arguments.submit_arguments(_tenant_of(given, acts_for), now=c.clock.now())
    if args.get("run_at") is not None:
        args["run_at"] = instant(args["run_at"], "run_at")
    job = c.new_job(**args)
    tenancy.check(c.settings.tenants, job.tenant, job.executor)
    _callbacks_granted(
        c, job.tenant, {"callback": job.callback, "failure_callback": job.failure_callback}
    )
    spec = references.scoped(job.executor, job.spec, job.tenant, c.settings)
    made = dataclasses.replace(job, spec=spec, tenant_made=True)  # a tenant's: see stranger_of
    return c.validate(await c.task_checked(made))


def schedule_arguments(
    given: dict[str, Any], *, acts_for: str | None, creating: bool, spec: Any = None
) -> dict[str, Any]:
    """A schedule's body (`POST /api/v1/schedules`, or a `PATCH`'s) as the client's
    schedule arguments; an unknown key, a value of the wrong type, or a tenant the asker
    does not act for is refused naming the field. `spec`: the schedule's own, to check a
    change of its template against."""
    allowed = (*(("name",) if creating else ()), *RULE_FIELDS, *TEMPLATE_FIELDS)
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise errors.InvalidInput(f"{unknown[0]}: unknown field (allowed: {', '.join(allowed)})")
    plain_json(given)
    _rule_types(given)
    args = dict(given)
    tenant = args.get("tenant")
    if tenant is not None and (not isinstance(tenant, str) or not sees(acts_for, tenant)):
        raise errors.InvalidInput(f"tenant: this token acts for tenant {acts_for!r} only")
    if creating and tenant is None:
        args["tenant"] = acts_for or "default"
    template = {k: v for k, v in args.items() if k in TEMPLATE_FIELDS}
    if creating or template:
        checked = arguments.submit_arguments({**({} if creating else {"spec": spec}), **template})
        args.update({k: checked[k] for k in template})
    return args


def _rule_types(given: Mapping[str, Any]) -> None:
    """InvalidInput naming a rule's key that is null where it may not be, or not of its
    type (catchup_max and pause_after whole numbers, the others text); a time far out of range."""
    for key in RULE_FIELDS:
        value = given.get(key)
        if value is None and key in given and key in NOT_NULL:
            raise errors.InvalidInput(f"{key}: must not be null (leave it out for its default)")
        wanted = int if key in ("catchup_max", "pause_after") else str
        if value is not None and (type(value) is not wanted):
            raise errors.InvalidInput(
                f"{key}: must be {'an integer' if wanted is int else 'a string'}"
            )
    for key in ("start", "until"):
        if isinstance(given.get(key), str):
            in_range(given[key], key)


def granted(c: jobs.Jobs, tenant: str, template: Mapping[str, Any]) -> dict[str, Any]:
    """Refuse (NotGranted, 403) a schedule whose jobs would run on an executor its tenant
    is not granted (a Python task's are `python`'s, others name theirs, `process`
    unnamed), or name on a cluster what the tenant may not; else its spec as it may run
    (a cluster job's in the tenant's namespace)."""
    executor = tenancy.executor_of(template)
    tenancy.check(c.settings.tenants, tenant, executor)
    _callbacks_granted(c, tenant, template)
    return references.scoped(executor, template.get("spec") or {}, tenant, c.settings)


def _callbacks_granted(c: jobs.Jobs, tenant: str, job: Mapping[str, Any]) -> None:
    """A callback is an HTTP job of the tenant's (corral.callbacks): a tenant not granted
    `http` may name none (NotGranted)."""
    if job.get("callback") or job.get("failure_callback"):
        tenancy.check(c.settings.tenants, tenant, "http")


async def schedule_create(
    c: schedules.Schedules, given: dict[str, Any], *, acts_for: str | None
) -> scheduling.Schedule:
    """A tenant's schedule made from its body (`name`, the rule, the job template), held
    to the tenant's max_schedules."""
    args = schedule_arguments(given, acts_for=acts_for, creating=True)
    name = args.pop("name", None)
    if not isinstance(name, str):
        raise errors.InvalidInput("name: required, a string")
    spec = granted(c, args["tenant"], args)
    if "spec" in args:
        args["spec"] = spec
    return await c.schedule_create(name, **args, tenant_made=True, limited=True)


async def schedule_update(
    c: schedules.Schedules,
    found: scheduling.Schedule,
    given: dict[str, Any],
    *,
    acts_for: str | None,
) -> scheduling.Schedule:
    """A tenant's schedule `found` changed by a body: the keys given replace its own."""
    args = schedule_arguments(
        given, acts_for=acts_for, creating=False, spec=found.template.get("spec")
    )
    args.pop("tenant", None)
    if any(key in args for key in TEMPLATE_FIELDS):
        spec = granted(c, found.tenant, {**found.template, **args})
        if "spec" in args:
            args["spec"] = spec
    return await c.schedule_update(found.name, tenant=found.tenant, **args, tenant_made=True)


def preview_arguments(given: Mapping[str, Any]) -> dict[str, Any]:
    """A rule to preview (`POST /api/v1/schedules/preview`'s body: cron or every, tz,
    start, until, count) as `schedule_preview`'s arguments; a key it does not take, or a
    value not of its type, is refused naming the field (the rule itself is checked by
    `schedule_preview`, as a schedule's is when it is made)."""
    unknown = sorted(set(given) - set(PREVIEW_FIELDS))
    if unknown:
        raise errors.InvalidInput(
            f"{unknown[0]}: unknown field (allowed: {', '.join(PREVIEW_FIELDS)})"
        )
    plain_json(given)
    _rule_types({k: v for k, v in given.items() if k != "count"})
    count = given.get("count", 10)
    if type(count) is not int or not 1 <= count <= MAX_PREVIEW:
        raise errors.InvalidInput(f"count: must be a whole number from 1 to {MAX_PREVIEW}")
    return {**{k: v for k, v in given.items() if v is not None}, "count": count}
