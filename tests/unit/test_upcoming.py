"""A schedule's next nominal times as the pages and the API list them (planning.upcoming):
from its next due one, before its `until`, none while paused or over, DST moves marked;
kept by everything they depend on, so a schedule changed or fired lists its new ones."""

from __future__ import annotations

import dataclasses
import itertools
from datetime import UTC, datetime, timedelta

from corral import cadence, planning, scheduling

T0 = datetime(2026, 10, 24, 22, 0, tzinfo=UTC)


def schedule(**given: object) -> scheduling.Schedule:
    base = scheduling.Schedule(
        id=1, name="s", tenant="a", cron="30 2 * * *", tz="Europe/Berlin", every_seconds=None,
        anchor=T0, template={}, catchup=scheduling.Catchup.NONE, catchup_window_seconds=0,
        catchup_max=1, overlap=scheduling.Overlap.ALLOW, jitter_seconds=0, until=None,
        paused_at=None, next_due=T0, last_nominal=None, last_job_id=None, missed_total=0,
        created_at=T0, updated_at=T0,
    )  # fmt: skip
    return dataclasses.replace(base, **given)  # type: ignore[arg-type]


def test_the_next_times_are_the_cadences_own_with_the_dst_move_marked() -> None:
    found = planning.upcoming(schedule(), 3)
    expected = list(itertools.islice(cadence.between(cadence.Cron("30 2 * * *",
        "Europe/Berlin"), T0, T0 + timedelta(days=9)), 3))  # fmt: skip
    assert list(found) == expected
    assert [n.at.hour for n in found] == [0, 1, 1], "02:30 CEST, then CET from the 26th"


def test_none_while_paused_or_over_and_none_at_or_past_until() -> None:
    assert planning.upcoming(schedule(paused_at=T0), 3) == ()
    assert planning.upcoming(schedule(next_due=None), 3) == ()
    until = planning.upcoming(schedule(), 2)[1].at
    assert len(planning.upcoming(schedule(until=until), 5)) == 1, "until is not included"


def test_a_schedule_changed_or_fired_lists_its_new_times() -> None:
    first = planning.upcoming(schedule(), 2)
    fired = planning.upcoming(schedule(next_due=first[1].at), 2)
    assert fired[0] == first[1]
    every = planning.upcoming(schedule(cron=None, every_seconds=600), 2)
    assert [n.at for n in every] == [T0, T0 + timedelta(seconds=600)]
