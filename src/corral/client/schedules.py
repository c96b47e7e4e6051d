"""Schedules: a job template plus when (cron in a zone, an interval, one instant), made,
changed, paused, resumed, fired by hand; the time maths is corral.cadence's."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict, Unpack, cast

from corral import autopause, errors, model, python_tasks, quotas, scheduling
from corral.client import checks, jobs

if TYPE_CHECKING:
    from corral import cadence

_TICK = timedelta(microseconds=1)


class RuleArgs(TypedDict, total=False):
    """When a schedule fires, as `new_schedule` takes it; left out, a field takes the
    default below."""

    cron: str | None  # a cron expression, in `tz`; or `every`
    tz: str  # "UTC"
    every: str | None  # an interval, e.g. "10m"
    start: str | datetime | None  # None: now; no firing before it, an interval's origin
    until: str | datetime | None  # None: never; no firing at or after it
    catchup: str  # "none" (the latest missed time only) or "all"
    catchup_window: str  # "7d"
    catchup_max: int  # 100
    overlap: str  # "allow", "forbid" or "replace"
    jitter: str | None  # None: no delay
    pause_after: int | None  # None: the tenant's default; 0: never
    tenant_made: bool  # False: the operator's schedule


class ScheduleArgs(RuleArgs, jobs.JobArgs, total=False):
    """A schedule as `schedule_create` takes it: when it fires, and its job template (as
    `submit` takes a job)."""


class Schedules(jobs.Jobs):
    """Make, change, read and fire schedules."""

    def new_schedule(
        self,
        name: str,
        *,
        cron: str | None = None,
        tz: str = "UTC",
        every: str | None = None,
        start: str | datetime | None = None,
        until: str | datetime | None = None,
        catchup: str = "none",
        catchup_window: str = "7d",
        catchup_max: int = 100,
        overlap: str = "allow",
        jitter: str | None = None,
        pause_after: int | None = None,
        tenant_made: bool = False,
        **job: Unpack[jobs.JobArgs],
    ) -> tuple[scheduling.NewSchedule, datetime]:
        """The schedule `schedule_create` would store, checked, with its anchor (the
        origin of an interval, and no firing before it); InvalidInput naming the field and
        the rule otherwise. `job` is its job template, as `submit` takes a job.
        `tenant_made`: made by a tenant (the API, the dashboard), its firings check the
        tenant's grant; the operator's are checked by none. `pause_after`: paused after
        that many failed firings in a row (corral.autopause). (Its parameters are RuleArgs',
        each with its default, hence its length.)"""
        from corral import cadence, planning

        if not checks.NAME.match(name or ""):
            raise errors.InvalidInput(
                f"name: {name!r} must be 1-200 characters of [A-Za-z0-9_.-], starting alphanumeric"
            )
        when, anchor, end = _when(cron, every, tz, start, until, self.clock.now())
        draft = dataclasses.replace(self.new_job(**_template_args(job)), tenant_made=tenant_made)
        template = scheduling.job_template(self.validate(draft))
        mode, how = _choices(catchup, overlap, catchup_max)
        window = cadence.parse_duration(catchup_window, "catchup_window")
        spread = cadence.parse_duration(jitter, "jitter") if jitter is not None else None
        new = scheduling.NewSchedule(
            name=name,
            template=template,
            tenant=template["tenant"],
            cron=when.expr if isinstance(when, cadence.Cron) else None,
            tz=when.tz if isinstance(when, cadence.Cron) else tz,
            every_seconds=when.seconds if isinstance(when, cadence.Every) else None,
            anchor=anchor,
            catchup=mode,
            catchup_window_seconds=window.total_seconds(),
            catchup_max=catchup_max,
            overlap=how,
            jitter_seconds=spread.total_seconds() if spread else 0.0,
            until=end,
            tenant_made=tenant_made,
            pause_after=None if pause_after is None else autopause.checked(pause_after),
        )
        planning.rule(new, anchor)  # every rule builds
        return new, anchor

    async def schedule_prepared(
        self,
        name: str,
        *,
        recorded: datetime | None = None,
        flows_made: Collection[str] = (),
        **args: Unpack[ScheduleArgs],
    ) -> tuple[scheduling.NewSchedule, datetime, datetime | None]:
        """The schedule `schedule_create` would store (`new_schedule`'s arguments), checked,
        with its anchor and its first nominal time from now (after `recorded`: the latest
        one a schedule being changed has recorded, never fired twice). `flows_made`: flows
        of its tenant that the same transaction makes first (`corral apply`), which its
        jobs may name too."""
        from corral import planning

        if isinstance(args.get("task"), str):
            # Its jobs run the version the newest live worker writes today (unless it names
            # one), their payload checked against that version's schema as a submit's is.
            draft = self.new_job(
                task=args["task"],
                task_version=args.get("task_version"),
                payload=args.get("payload"),
            )
            args["task_version"] = python_tasks.task_of((await self.task_checked(draft)).spec)[1]
        new, anchor = self.new_schedule(name, **args)
        await self._flow_known(new, flows_made)
        first = planning.first_due(
            planning.rule(new, anchor),
            now=self.clock.now(),
            anchor=anchor,
            until=new.until,
            recorded=recorded,
        )
        return new, anchor, first

    async def schedule_create(
        self, name: str, *, limited: bool = False, **args: Unpack[ScheduleArgs]
    ) -> scheduling.Schedule:
        """Store a schedule (`new_schedule`'s arguments); it fires first at its first
        nominal time after now (or at its start). `limited`: a tenant's request, refused
        (QuotaExceeded) when the tenant has its max_schedules already."""
        new, anchor, first = await self.schedule_prepared(name, **args)
        quota = quotas.limits(self.settings.tenants, new.tenant) if limited else None
        return await self.store.schedules.create(
            new=new, anchor=anchor, next_due=first, now=self.clock.now(), quota=quota
        )

    async def _flow_known(self, new: scheduling.NewSchedule, made: Collection[str] = ()) -> None:
        """InvalidInput naming `flow` when the schedule's jobs name a flow its tenant has
        not (corral.flows), nor is about to make (`made`)."""
        flow = new.template.get("flow")
        if flow is None or flow in made:
            return
        if await self.store.flows.get(tenant=new.tenant, name=flow) is None:
            raise errors.InvalidInput(
                f"flow: tenant {new.tenant!r} has no flow named {flow!r}; add it first with"
                f" `corral flows add {flow} --tenant {new.tenant}` (or POST /api/v1/flows)"
            )

    def upcoming(self, found: scheduling.Schedule, count: int = 5) -> list[cadence.Nominal]:
        """A schedule's next `count` nominal times (none while it is paused or over),
        marking those a DST change moved."""
        from corral import planning

        return list(planning.upcoming(found, count))

    async def schedule(self, name: str, *, tenant: str = "default") -> scheduling.Schedule:
        return await self.store.schedules.get(name=name, tenant=tenant)

    async def schedules(self, *, tenant: str | None = None) -> list[scheduling.Schedule]:
        return await self.store.schedules.list(tenant=tenant)

    async def schedule_update(self, name: str, **args: Unpack[ScheduleArgs]) -> scheduling.Schedule:
        """Change `tenant`'s schedule `name` (tenant "default" when not given): the other
        arguments given replace its own (the rule, the options, any field of the job
        template); the rest stay. Its next nominal time is computed again from now."""
        from corral import planning

        tenant = args.pop("tenant", "default")
        old = await self.store.schedules.get(name=name, tenant=tenant)
        given: ScheduleArgs = {**_schedule_args(old), **args}
        if "cron" in args:
            given.pop("every", None)
        if "every" in args:
            given.pop("cron", None)
        new, anchor = self.new_schedule(name, **given)
        if new.tenant != old.tenant:
            raise errors.InvalidInput("tenant: a schedule cannot move to another tenant")
        await self._flow_known(new)
        now = self.clock.now()
        first = planning.first_due(
            planning.rule(new, anchor),
            now=now,
            anchor=anchor,
            until=new.until,
            recorded=old.last_nominal,
        )
        return await self.store.schedules.update(
            schedule_id=old.id, changes=changes_of(new), next_due=first, now=now
        )

    async def schedule_delete(self, name: str, *, tenant: str = "default") -> None:
        old = await self.store.schedules.get(name=name, tenant=tenant)
        await self.store.schedules.delete(schedule_id=old.id)

    async def schedule_pause(self, name: str, *, tenant: str = "default") -> scheduling.Schedule:
        old = await self.store.schedules.get(name=name, tenant=tenant)
        return await self.store.schedules.pause(schedule_id=old.id, now=self.clock.now())

    async def schedule_resume(self, name: str, *, tenant: str = "default") -> scheduling.Schedule:
        """Resume a paused schedule: what passed while it was paused is recorded as
        skipped, never fired; it fires next at its first nominal time after now."""
        from corral import planning

        old = await self.store.schedules.get(name=name, tenant=tenant)
        if old.paused_at is None:
            return old
        now = self.clock.now()
        skipped, more, first = planning.resume_skips(old, now)
        return await self.store.schedules.resume(
            schedule_id=old.id, skipped=skipped, skipped_count=more, next_due=first, now=now
        )

    async def schedule_trigger(
        self, name: str, *, tenant: str = "default", limited: bool = False
    ) -> int:
        """Fire a schedule now, outside its times (its next nominal time stays): the job's
        id. Its firing is recorded at this instant. `limited`: a tenant's request, its job
        held to the tenant's quotas (QuotaExceeded or RateLimited: nothing recorded)."""
        from corral import planning

        old = await self.store.schedules.get(name=name, tenant=tenant)
        now = self.clock.now()
        fire = planning.firing(
            old, planning.rule(old, old.anchor), now, scheduling.FiringOutcome.FIRED
        )
        fire = dataclasses.replace(fire, note="triggered by hand")
        quota = quotas.limits(self.settings.tenants, old.tenant) if limited else None
        await self.store.schedules.backfill(schedule=old, fires=[fire], now=now, quota=quota)
        [firing] = await self.store.schedules.firings(
            schedule_id=old.id, limit=1, before=now + _TICK
        )
        assert firing.job_id is not None
        return firing.job_id

    async def firings(
        self, name: str, *, tenant: str = "default", limit: int = 20
    ) -> list[scheduling.Firing]:
        old = await self.store.schedules.get(name=name, tenant=tenant)
        return await self.store.schedules.firings(schedule_id=old.id, limit=limit)

    def schedule_preview(
        self,
        *,
        cron: str | None = None,
        tz: str = "UTC",
        every: str | None = None,
        start: str | datetime | None = None,
        until: str | datetime | None = None,
        count: int = 10,
    ) -> list[cadence.Nominal]:
        """The first `count` nominal times of a rule not stored: those a schedule made now
        with it would fire (none before its start, none at or after its until), marking
        those a DST change moved. InvalidInput names the field, as `schedule_create` does."""
        from corral import cadence, planning

        now = self.clock.now()
        when, anchor, end = _when(cron, every, tz, start, until, now)
        first = planning.first_due(when, now=now, anchor=anchor, until=end)
        if first is None:
            return []
        later = cadence.between(when, first, first + timedelta(days=30 * 366))
        taken = (n for n in later if end is None or n.at < end)
        return [n for _, n in zip(range(count), taken, strict=False)]

    async def schedule_duplicate(
        self,
        name: str,
        new_name: str,
        *,
        tenant: str = "default",
        tenant_made: bool = False,
        limited: bool = False,
    ) -> scheduling.Schedule:
        """A copy of `tenant`'s schedule `name`, named `new_name` in the same tenant: its
        rule, options and job template (secrets too). It is a new schedule made now, so it
        fires first at its first nominal time from now, even while the original is paused,
        and its firings are its own. `tenant_made` and `limited` as `schedule_create`'s
        (a copy of a tenant's schedule is the tenant's)."""
        old = await self.store.schedules.get(name=name, tenant=tenant)
        args = _schedule_args(old)
        args["tenant_made"] = old.tenant_made or tenant_made
        return await self.schedule_create(new_name, limited=limited, **args)


def changes_of(new: scheduling.NewSchedule) -> dict[str, Any]:
    """A schedule's every field but its name and tenant, as `store.schedules.update` takes
    them: what a change of it writes."""
    changes = {
        f.name: getattr(new, f.name)
        for f in dataclasses.fields(new)
        if f.name not in ("name", "tenant")
    }
    return {**changes, "template": dict(new.template)}


def _when(
    cron: str | None,
    every: str | None,
    tz: str,
    start: str | datetime | None,
    until: str | datetime | None,
    now: datetime,
) -> tuple[cadence.When, datetime, datetime | None]:
    """A schedule's rule (its cron in `tz`, or its interval), its anchor (`start`, else
    now) and its end (`until`); InvalidInput naming the field that is wrong."""
    from corral import cadence

    if (cron is None) == (every is None):
        raise errors.InvalidInput("give either cron (with tz) or every, not both or neither")
    anchor = instant(start, "start", tz) if start is not None else now.replace(microsecond=0)
    when: cadence.When = (
        cadence.parse_cron(cron, tz)
        if cron is not None
        else cadence.parse_every(every or "", anchor)
    )
    if every is not None and tz != "UTC":
        cadence.parse_cron("* * * * *", tz)  # the zone is still checked
    end = instant(until, "until", tz) if until is not None else None
    if end is not None and end <= anchor:
        raise errors.InvalidInput(
            f"until: {model.iso(end)} is not after the start {model.iso(anchor)}"
        )
    return when, anchor, end


def _template_args(job: jobs.JobArgs) -> jobs.JobArgs:
    """A schedule's job as `submit`'s arguments, refused when it says what each firing
    says for itself, or carries a payload that is not a JSON object."""
    if job.get("run_at") is not None or job.get("idempotency_key") is not None:
        raise errors.InvalidInput(
            "run_at and idempotency_key are each firing's own: a schedule's job has neither"
        )
    if job.get("payload") is not None and not isinstance(job.get("payload"), Mapping):
        raise errors.InvalidInput(
            "payload: a schedule's payload must be a JSON object: each firing adds what"
            f" it is for under {scheduling.FIRING!r}"
        )
    return job


def _choices(
    catchup: str, overlap: str, catchup_max: int
) -> tuple[scheduling.Catchup, scheduling.Overlap]:
    """A schedule's catch-up and overlap, read; InvalidInput naming a wrong one."""
    try:
        mode = scheduling.Catchup(catchup)
    except ValueError:
        raise errors.InvalidInput(f"catchup: {catchup!r} must be none or all") from None
    try:
        how = scheduling.Overlap(overlap)
    except ValueError:
        raise errors.InvalidInput(
            f"overlap: {overlap!r} must be allow, forbid or replace"
        ) from None
    if not 1 <= catchup_max <= 10_000:
        raise errors.InvalidInput(f"catchup_max: {catchup_max} must be between 1 and 10000")
    return mode, how


def instant(value: str | datetime, field: str, tz: str) -> datetime:
    from corral import cadence

    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise errors.InvalidInput(f"{field}: must carry a timezone")
        return value.astimezone(UTC)
    return cadence.parse_instant(value, field, tz)


def _schedule_args(schedule: scheduling.Schedule) -> ScheduleArgs:
    """A stored schedule as `new_schedule`'s arguments (what `schedule_update` starts from):
    its template's fields are a job's, as it was checked when stored."""
    args: dict[str, Any] = {
        "tz": schedule.tz,
        "start": schedule.anchor,
        "until": schedule.until,
        "catchup": schedule.catchup.value,
        "catchup_window": _duration_text(schedule.catchup_window_seconds),
        "catchup_max": schedule.catchup_max,
        "overlap": schedule.overlap.value,
        "jitter": _duration_text(schedule.jitter_seconds) if schedule.jitter_seconds else None,
        "tenant_made": schedule.tenant_made,
        "pause_after": schedule.pause_after,
        **{k: v for k, v in schedule.template.items() if k in jobs.SUBMIT_FIELDS},
    }
    if schedule.cron is not None:
        args["cron"] = schedule.cron
    else:
        args["every"] = _duration_text(schedule.every_seconds or 0)
    return cast(ScheduleArgs, args)


def _duration_text(seconds: float) -> str:
    """Whole seconds as cadence.parse_duration reads them back, e.g. 90061 -> 1d1h1m1s."""
    rest, parts = int(seconds), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        amount, rest = divmod(rest, size)
        if amount:
            parts.append(f"{amount}{unit}")
    return "".join(parts) or "0s"
