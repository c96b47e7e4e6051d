"""Whether a loop is alive, and which conditions of work nobody can do hold: pure decisions
(corral.loops), judged here without a store or a clock."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from corral import loops
from corral.store.loops import Loop, Waiting

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
BEAT = timedelta(seconds=20)


def loop(**kw: object) -> Loop:
    base = Loop(
        id="a" * 32,
        kind="serve",
        runs=("dispatcher", "reconciler", "scheduler"),
        executors=("process",),
        host="elsewhere",
        pid=7,
        pid_started="4026531836:100",
        version="0.1.0",
        started_at=NOW - timedelta(hours=1),
        beat_at=NOW,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def here(marks: dict[int, str | None] | None = None) -> loops.Here:
    return loops.Here("vm", "4026531836", lambda pid: (marks or {}).get(pid))


def state(of: Loop, at: datetime = NOW, on: loops.Here | None = None) -> loops.Liveness:
    return loops.liveness(of, now=at, heartbeat=BEAT, here=on or here())


def test_a_loop_elsewhere_is_live_until_three_beats_have_passed() -> None:
    assert state(loop(), NOW + 3 * BEAT) is loops.Liveness.LIVE
    assert state(loop(), NOW + 3 * BEAT + timedelta(milliseconds=1)) is loops.Liveness.STALE


def test_a_loop_that_stopped_is_stopped_however_fresh_its_beat() -> None:
    assert state(loop(stopped_at=NOW)) is loops.Liveness.STOPPED


def test_on_this_host_a_loop_whose_process_is_gone_is_gone_at_once() -> None:
    mine = loop(host="vm", pid=7)
    assert state(mine, on=here({7: "4026531836:100"})) is loops.Liveness.LIVE
    assert state(mine, on=here({})) is loops.Liveness.GONE
    # The pid runs again, but it is another process: it started at another time.
    assert state(mine, on=here({7: "4026531836:555"})) is loops.Liveness.GONE


def test_a_pid_of_another_namespace_or_unknown_start_is_judged_by_its_beat_only() -> None:
    in_a_container = loop(host="vm", pid_started="4026532999:100")
    assert state(in_a_container, on=here({})) is loops.Liveness.LIVE
    assert state(loop(host="vm", pid_started=None), on=here({})) is loops.Liveness.LIVE


def test_process_mark_tells_a_running_process_from_a_gone_one() -> None:
    mark = loops.process_mark(os.getpid())
    assert mark is not None
    assert mark == loops.process_mark(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert loops.process_mark(child.pid) is None


def test_the_dead_are_gone_stopped_or_silent_where_silence_counts_and_never_me() -> None:
    late = NOW + 3 * BEAT + timedelta(seconds=1)
    rows = [
        loop(id="live", beat_at=late),
        loop(id="silent"),
        loop(id="gone", host="vm", pid=8, beat_at=late),
        loop(id="stopped", stopped_at=NOW, beat_at=late),
        loop(id="me"),
    ]
    seen = {"here": here({}), "me": "me", "now": late, "heartbeat": BEAT}
    dead = loops.dead(rows, silence_counts=True, **seen)  # type: ignore[arg-type]
    assert dead == {
        "silent": "serve pid 7 on elsewhere is silent past 3 heartbeats",
        "gone": "serve pid 8 on vm is gone (its process no longer runs)",
        "stopped": "serve pid 7 on elsewhere is stopped",
    }
    # After an outage every loop is silent: only what the host itself shows is dead.
    assert set(loops.dead(rows, silence_counts=False, **seen)) == {"gone", "stopped"}  # type: ignore[arg-type]


def waiting(schedules: int = 0, tasks: int = 0) -> Waiting:
    return Waiting(schedules_due=schedules, tasks_parked=tasks)


def test_due_schedules_with_no_live_scheduler_hold_and_a_scheduler_ends_it() -> None:
    dispatcher = loop(kind="dispatcher", runs=("dispatcher",))
    holding, judged = loops.conditions(
        live=[dispatcher], waiting=waiting(schedules=3), alert_rules=False
    )
    assert list(holding) == [loops.NO_SCHEDULER]
    assert "3 schedule(s) due and no scheduler is running" in holding[loops.NO_SCHEDULER]
    assert judged == [loops.NO_SCHEDULER, loops.NO_WORKER]
    holding, _ = loops.conditions(
        live=[dispatcher, loop(kind="scheduler", runs=("scheduler",))],
        waiting=waiting(schedules=3),
        alert_rules=False,
    )
    assert holding == {}
    holding, _ = loops.conditions(live=[dispatcher], waiting=waiting(), alert_rules=False)
    assert holding == {}


def test_parked_tasks_with_no_worker_and_rules_with_no_alerter_hold() -> None:
    holding, judged = loops.conditions(live=[loop()], waiting=waiting(tasks=100), alert_rules=True)
    assert sorted(holding) == [loops.NO_ALERTER, loops.NO_WORKER]
    assert "100+ Python task job(s) waiting" in holding[loops.NO_WORKER]
    assert loops.NO_ALERTER in judged
    worker = loop(kind="worker", runs=("worker",))
    alerter = loop(kind="alerter", runs=("alerter",))
    holding, _ = loops.conditions(
        live=[worker, alerter], waiting=waiting(tasks=1), alert_rules=True
    )
    assert holding == {}
