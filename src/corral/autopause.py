"""Auto-pause: a schedule whose last N firings' jobs ended failed or quarantined is paused,
so it stops calling an endpoint that is down, and a person is told how to resume it.

A schedule's `pause_after` is N (None: its tenant's `[tenants.NAME] pause_after`; 0, the
default, never). Its firings count from its last resume on (`counted_from`), the newest
first: a job that failed or waits in quarantine adds one, a success ends the count, and a
job that has not ended (or was cancelled) neither adds nor ends it: it counts once it
ends. Missed, skipped, overlapping and refused firings made no job, so they never count.

The decision is pure, here; the scheduler's pass applies it (store/autopause.py) for each
schedule due to fire, in the transaction that would fire it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from corral import errors, model, scheduling, tenancy

J = model.JobState

COUNTED = frozenset({J.FAILED, J.QUARANTINED})
"""The end of a firing's job that counts toward a pause."""
ENDS_COUNT = frozenset({J.SUCCEEDED})
"""The end of a firing's job that ends the count."""
ENDED = COUNTED | ENDS_COUNT
"""The states of the firings' jobs the decision reads (the others neither add nor end)."""


def checked(value: object, field: str = "pause_after") -> int:
    """`value` as a pause_after, or InvalidInput naming `field` and the rule."""
    if type(value) is not int or value < 0:
        raise errors.InvalidInput(
            f"{field}: {value!r} must be a whole number, 0 or more (0: never pause)"
        )
    return value


def effective(schedule: scheduling.Schedule, tenants: Mapping[str, tenancy.TenantSettings]) -> int:
    """A schedule's own pause_after, or its tenant's default when it has none."""
    if schedule.pause_after is not None:
        return schedule.pause_after
    return tenancy.resolved(tenants, schedule.tenant).pause_after


def streak(newest_first: Iterable[model.JobState]) -> int:
    """How many of the firings' jobs (newest first) ended failed or quarantined before the
    newest success; jobs not ended, or cancelled, are passed over."""
    count = 0
    for state in newest_first:
        if state in ENDS_COUNT:
            break
        if state in COUNTED:
            count += 1
    return count


def should_pause(pause_after: int, newest_first: Sequence[model.JobState]) -> bool:
    """Whether a schedule with `pause_after` pauses, given the states of its counted
    firings' jobs (newest first): when it is not 0 and that many in a row ended badly."""
    return pause_after > 0 and streak(newest_first) >= pause_after


def how_to_resume(schedule: scheduling.Schedule) -> str:
    """What a person does to resume a schedule corral paused."""
    return (
        f"resume it with `corral schedules resume {schedule.name} --tenant {schedule.tenant}`,"
        " or the Resume button on its page in the dashboard"
    )


def reason(schedule: scheduling.Schedule, pause_after: int, job_ids: Sequence[int]) -> str:
    """Why corral paused a schedule: the setting and the jobs that ended badly."""
    jobs = ", ".join(str(i) for i in job_ids)
    return (
        f"paused by corral: the jobs of its last {pause_after} firings ended failed or"
        f" quarantined (jobs {jobs}; pause_after = {pause_after})"
    )
