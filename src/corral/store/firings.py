"""The firing of due schedules, and backfills: each nominal time a scheduler fires is
recorded once, with its job, and its schedule moved on.

A firing is a row unique on (schedule, nominal time), written in one transaction with the
job it creates (whose idempotency key names the schedule and the nominal time) and with the
schedule's next nominal time, moved by compare-and-set. So any number of schedulers fire
each nominal time once, with no leader: on PostgreSQL they skip the schedules another one
holds (SKIP LOCKED), on SQLite they take turns; a late one finds the next nominal time moved
and does nothing. When to fire, and what a firing is, the scheduler decides (`plan`):
nothing here computes a time. Apart from schedules.py (what a schedule is, and its changes),
as this is the scheduler's hot pass and the jobs it makes.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, bindparam, func, or_, select, update

from corral import errors, model, planning, quotas, scheduling, tenancy
from corral.planning import Fired, Plan
from corral.store import autopause, dialects, firing_stats
from corral.store import flows as flow_store
from corral.store import quotas as holds
from corral.store.events import event_insert, schedule_news
from corral.store.job_decisions import job_cancel
from corral.store.jobs import job_submit
from corral.store.rows import schedule_from_row, state_is
from corral.store.tables import DUE, UTCDateTime, firings, jobs, schedules

J, F = model.JobState, scheduling.FiringOutcome


def schedule_next_wake(conn: Connection, *, ahead: timedelta) -> datetime | None:
    """The earliest time anything is due: a schedule's next nominal time (`ahead` of it
    for one fired ahead, see schedules_fire_due), or a job in `scheduled` waiting for its
    run_at."""
    allow = schedules.c.overlap == scheduling.Overlap.ALLOW.value
    first = select(func.min(schedules.c.next_due)).where(DUE)
    ahead_of = conn.execute(first.where(allow)).scalar()
    on_time = conn.execute(first.where(~allow)).scalar()
    first_job = conn.execute(
        select(func.min(jobs.c.run_at)).where(jobs.c.state == state_is(J.SCHEDULED))
    ).scalar()
    found = [t for t in (on_time, first_job) if t is not None]
    if ahead_of is not None:
        found.append(ahead_of - ahead)
    return min(found) if found else None


def schedules_fire_due(
    conn: Connection,
    *,
    now: datetime,
    limit: int,
    plan: Callable[[scheduling.Schedule, model.JobState | None], Plan],
    ahead: timedelta = timedelta(0),
    tenants: Mapping[str, tenancy.TenantSettings] | None = None,
) -> Fired:
    """Fire up to `limit` due schedules, the most overdue first: `plan(schedule, state of
    its previous firing's job)` says what to record. One transaction.

    A schedule whose overlap is `allow` is due `ahead` of its nominal time: its firing is
    recorded early and its job waits in the queue for its run_at (the nominal time), so a
    burst of firings due at one instant is claimable at that instant. The others decide on
    their previous job's state, so they fire at their time, not before. A schedule whose
    flow is gone has its firings refused (_flows_kept), never failing the pass. With
    `tenants` (the settings'), a tenant's schedule's firings that would break its tenant's
    quotas are refused (store.quotas.firings_admitted). A schedule that keeps failing is
    paused instead of fired (store.autopause), counted among those moved on."""
    due = _schedules_due(conn, now=now, limit=limit, ahead=ahead)
    if paused := autopause.schedules_auto_pause(conn, due=due, tenants=tenants or {}, now=now):
        due = [s for s in due if s.id not in paused]
    previous = _previous_states(conn, due)
    planned = _flows_kept(conn, [(s, plan(s, previous.get(s.last_job_id or 0))) for s in due])
    if not planned:
        return Fired(schedules=len(paused))
    if tenants is not None:
        planned = holds.firings_admitted(conn, planned, tenants=tenants, now=now)
    out = Fired(schedules=len(planned) + len(paused))
    for schedule, decided in planned:
        if decided.cancel_previous and schedule.last_job_id is not None:
            attempt = _cancel_quietly(conn, schedule, now)
            if attempt is not None:
                out.cancelled.append(attempt)
    _schedules_move(conn, [_move(s, decided) for s, decided in planned], now)
    out.firings = _fire(conn, [(s, f) for s, decided in planned for f in decided.fires], now)
    if news := [n for s, decided in planned for n in _missed_news(s, decided, now)]:
        event_insert(conn, news)
    return out


def _schedules_due(
    conn: Connection, *, now: datetime, limit: int, ahead: timedelta
) -> list[scheduling.Schedule]:
    """Up to `limit` due schedules, the most overdue first, skipping rows another
    transaction holds; those whose overlap is `allow` are due `ahead` of their time."""
    early = and_(
        schedules.c.overlap == scheduling.Overlap.ALLOW.value, schedules.c.next_due <= now + ahead
    )
    pick = (
        select(schedules)
        .where(DUE, or_(schedules.c.next_due <= now, early))
        .order_by(schedules.c.next_due)
        .limit(limit)
    )
    return [schedule_from_row(r) for r in conn.execute(dialects.skip_locked(conn, pick))]


def _flows_kept(
    conn: Connection, planned: Sequence[tuple[scheduling.Schedule, Plan]]
) -> list[tuple[scheduling.Schedule, Plan]]:
    """`planned` with the firings whose jobs name a flow their tenant no longer has refused
    instead (planning.refused, the flow in the note), so the jobs of the others are
    submitted. The flows named are kept as a submit keeps them (flows_named); only when one
    is missing is each looked at on its own, to tell which."""
    named = set().union(*(_flows_of(plan) for _, plan in planned))
    if not named:
        return list(planned)
    try:
        flow_store.flows_named(conn, named=named)
        return list(planned)
    except errors.InvalidInput:
        missing = {pair for pair in named if not _flow_kept(conn, pair)}
    out = []
    for schedule, plan in planned:
        if gone := sorted(_flows_of(plan) & missing):
            tenant, flow = gone[0]
            why = (
                f"its jobs name flow {flow!r}, which tenant {tenant!r} no longer has; add the"
                f" flow again (`corral flows add {flow} --tenant {tenant}`) or change the"
                " schedule's flow"
            )
            plan = planning.refused(plan, why)
        out.append((schedule, plan))
    return out


def _flows_of(plan: Plan) -> set[tuple[str, str]]:
    """The (tenant, flow) pairs the jobs of `plan` name."""
    return {(f.job.tenant, f.job.flow) for f in plan.fires if f.job and f.job.flow is not None}


def _flow_kept(conn: Connection, pair: tuple[str, str]) -> bool:
    """Whether `pair` (tenant, flow) is a flow of that tenant, kept as flows_named keeps it."""
    try:
        flow_store.flows_named(conn, named=[pair])
    except errors.InvalidInput:
        return False
    return True


def _previous_states(
    conn: Connection, due: Sequence[scheduling.Schedule]
) -> dict[int, model.JobState]:
    """The state of each previous firing's job, by job id, of the schedules that decide on
    it (all but those whose overlap is `allow`)."""
    watched = [
        s.last_job_id for s in due if s.overlap != scheduling.Overlap.ALLOW and s.last_job_id
    ]
    if not watched:
        return {}
    rows = conn.execute(
        select(jobs.c.id, jobs.c.state).where(dialects.one_of(conn, jobs.c.id, watched))
    )
    return {job_id: J(state) for job_id, state in rows}


def _move(schedule: scheduling.Schedule, decided: Plan) -> dict[str, Any]:
    """The parameters of `_schedules_move` for one schedule: its next due time, its last
    nominal time and the times it missed."""
    missed = sum(1 for f in decided.fires if f.outcome == F.MISSED)
    return {
        "b_id": schedule.id,
        "b_old": schedule.next_due,
        "b_next": decided.next_due,
        "b_last": max((f.nominal_at for f in decided.fires), default=schedule.last_nominal),
        "b_missed": decided.missed_count + missed,
    }


def _schedules_move(conn: Connection, moves: Sequence[dict[str, Any]], now: datetime) -> None:
    """Move each schedule on, compare-and-set on its due time. The rows are ours until
    commit (locked on PostgreSQL, the one writer on SQLite), so the compare-and-set holds
    for every one; were one moved meanwhile, nothing of the pass is kept (StoreError)."""
    moved = conn.execute(
        update(schedules)
        .where(schedules.c.id == bindparam("b_id"), schedules.c.next_due == bindparam("b_old"))
        .values(
            next_due=bindparam("b_next", type_=UTCDateTime()),
            last_nominal=bindparam("b_last", type_=UTCDateTime()),
            missed_total=schedules.c.missed_total + bindparam("b_missed"),
            updated_at=now,
        ),
        moves,
    ).rowcount
    if moved != len(moves):
        raise errors.StoreError(
            f"{len(moves) - moved} of {len(moves)} schedules moved under this scheduler;"
            " nothing of this pass is kept"
        )


NOT_RUN = (
    (F.MISSED, None),
    (F.OVERLAP, None),
    (F.REFUSED, None),
    (F.REFUSED, "max_queued"),
    (F.REFUSED, "submit_rate"),
)
"""What a schedule's run log tells of, one event each (a paused schedule's skipped times are
asked for): its nominal times missed, overlapping, refused by the grant, refused by each
quota a firing can break."""


def _missed_news(
    schedule: scheduling.Schedule, decided: Plan, now: datetime
) -> list[dict[str, Any]]:
    """The events that tell of the nominal times of `decided` that did not run, one per
    outcome: a schedule's news has no job (job_id NO_JOB), so it names the schedule and
    what a firing's job would have been (queue, executor, labels) for rules to match."""
    out = []
    for outcome, quota in NOT_RUN:
        fires = [f for f in decided.fires if f.outcome == outcome and f.quota == quota]
        count = len(fires) + (decided.missed_count if outcome == F.MISSED else 0)
        if count:
            out.append(_not_run_news(schedule, fires, count, outcome, quota, now))
    return out


def _not_run_news(
    schedule: scheduling.Schedule,
    fires: Sequence[scheduling.Fire],
    count: int,
    outcome: scheduling.FiringOutcome,
    quota: str | None,
    now: datetime,
) -> dict[str, Any]:
    """The event of `count` nominal times of one outcome (`fires`, those recorded) that did
    not run; one refused for a quota names it (`quota` in its details)."""
    times = [f.nominal_at for f in fires]
    why = next((f.note for f in fires if f.note), None) or "no scheduler fired it in time"
    first = times[0].isoformat() if times else "(not recorded)"
    return schedule_news(
        schedule,
        to=outcome.value,
        reason=f"schedule {schedule.name!r}: {count} nominal time(s) from {first}"
        f" did not run: {why}",
        now=now,
        details={
            "nominal_times": [t.isoformat() for t in times],
            "count": count,
            **({"quota": quota} if quota else {}),
        },
    )


def _cancel_quietly(
    conn: Connection, schedule: scheduling.Schedule, now: datetime
) -> model.Attempt | None:
    assert schedule.last_job_id is not None
    try:
        return job_cancel(
            conn,
            job_id=schedule.last_job_id,
            now=now,
            reason=f"replaced by a newer firing of schedule {schedule.name!r} (overlap replace)",
        )
    except (errors.InvalidInput, errors.NotFound):  # it ended meanwhile, or was deleted
        return None


def _fire(
    conn: Connection,
    todo: Sequence[tuple[scheduling.Schedule, scheduling.Fire]],
    now: datetime,
    *,
    latest: bool = True,
) -> list[scheduling.Firing]:
    """Record each firing and create its job, in the order given; a nominal time recorded
    before (a backfill, a scheduler that lost a race) is left as it is."""
    with_jobs = [(s, f) for s, f in todo if f.job is not None]
    made = job_submit(
        conn, new=[f.job for _, f in with_jobs if f.job is not None], now=now, hold=False
    )
    job_ids = {id(f): job_id for (_, f), (job_id, _) in zip(with_jobs, made, strict=True)}
    recorded = firings_record(conn, todo=[(s.id, f) for s, f in todo], job_ids=job_ids, now=now)
    last_jobs = {
        s.id: job_ids[id(f)] for s, f in with_jobs if id(f) in job_ids
    }  # the newest firing's job, as `todo` is in order
    if last_jobs and latest:  # the job overlap watches: a backfill's never is
        conn.execute(
            update(schedules)
            .where(schedules.c.id == bindparam("b_id"))
            .values(last_job_id=bindparam("b_job")),
            [{"b_id": k, "b_job": v} for k, v in last_jobs.items()],
        )
    return recorded


def firings_record(
    conn: Connection,
    *,
    todo: Sequence[tuple[int, scheduling.Fire]],
    job_ids: Mapping[int, int],
    now: datetime,
) -> list[scheduling.Firing]:
    """Record each (schedule id, fire) of `todo`, with its job's id from `job_ids` (by the
    fire's id()) if it made one: a nominal time recorded before is left as it is. The
    firings recorded."""
    rows = [
        {
            "schedule_id": schedule_id,
            "nominal_at": f.nominal_at,
            "outcome": f.outcome.value,
            "job_id": job_ids.get(id(f)),
            "recorded_at": now,
            "lateness_seconds": (now - f.nominal_at).total_seconds(),
            "note": f.note,
        }
        for schedule_id, f in todo
    ]
    if not rows:
        return []
    names = [c.name for c in firings.c]
    inserted = dialects.insert_many(
        conn,
        firings,
        rows,
        returning=names,
        on_conflict="ON CONFLICT (schedule_id, nominal_at) DO NOTHING",
    )
    recorded = [_firing_from_values(names, values) for values in inserted]
    if late := firing_stats.late_hours([(f.schedule_id, f.nominal_at) for f in recorded], now):
        firing_stats.hours_reopen(conn, late=late)  # a past hour counted may be off now
    return recorded


def _firing_from_values(names: Sequence[str], values: Sequence[Any]) -> scheduling.Firing:
    """A firing from a RETURNING row of the driver's own values (times as it gives them)."""
    m = dict(zip(names, values, strict=True))
    for name in ("nominal_at", "recorded_at"):
        m[name] = _as_utc(m[name])
    return scheduling.Firing(**{**m, "outcome": F(m["outcome"])})


def _as_utc(value: Any) -> datetime:
    at: datetime = datetime.fromisoformat(value) if isinstance(value, str) else value
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def backfill(
    conn: Connection,
    *,
    schedule: scheduling.Schedule,
    fires: Sequence[scheduling.Fire],
    now: datetime,
) -> tuple[int, int]:
    """Record `fires` (outcome backfilled, each with its job) for nominal times of
    `schedule`; a nominal time recorded before (fired, backfilled, missed...) keeps its
    record, and its job, if any, is not made again. Returns (created, already there)."""
    recorded = {
        at: job_id
        for at, job_id in conn.execute(
            select(firings.c.nominal_at, firings.c.job_id).where(
                firings.c.schedule_id == schedule.id,
                firings.c.nominal_at.in_([f.nominal_at for f in fires]),
            )
        )
    }
    fresh = [f for f in fires if f.nominal_at not in recorded]
    created = len(_fire(conn, [(schedule, f) for f in fresh], now, latest=False))
    jobless = [f for f in fires if f.nominal_at in recorded and recorded[f.nominal_at] is None]
    created += _backfill_jobless(conn, schedule, jobless, now)
    return created, len(fires) - created


def _backfill_jobless(
    conn: Connection,
    schedule: scheduling.Schedule,
    fires: Sequence[scheduling.Fire],
    now: datetime,
) -> int:
    """Give a job to each of `fires`, nominal times recorded before with none (missed or
    skipped), its firing row saying it is backfilled now (and its hour, if counted already,
    opened again): the jobs made."""
    made_count = 0
    for fire in fires:
        if fire.job is None:
            continue
        ((job_id, made),) = job_submit(conn, new=[fire.job], now=now, hold=False)
        conn.execute(
            update(firings)
            .where(
                firings.c.schedule_id == schedule.id,
                firings.c.nominal_at == fire.nominal_at,
            )
            .values(job_id=job_id, outcome=F.BACKFILLED.value, note=fire.note)
        )
        if late := firing_stats.late_hours([(schedule.id, fire.nominal_at)], now):
            firing_stats.hours_reopen(conn, late=late)
        made_count += int(made)
    return made_count


def backfill_held(
    conn: Connection,
    *,
    schedule: scheduling.Schedule,
    fires: Sequence[scheduling.Fire],
    now: datetime,
    quota: quotas.Limits,
) -> tuple[int, int]:
    """`backfill` as its tenant's write (a trigger or a backfill asked for through the
    API): the jobs it makes held to the tenant's max_queued and submit_rate, all or nothing
    (store.quotas.held_to)."""
    return holds.held_to(
        conn,
        limits={schedule.tenant: quota},
        now=now,
        write=functools.partial(backfill, schedule=schedule, fires=fires, now=now),
        created=lambda made: Counter({schedule.tenant: made[0]}),
    )
