"""Schedules as a user runs them: `corral schedules`, `corral backfill` and `corral serve`
as real processes on a real SQLite file; and seed 002's backfill of 730 daily intervals
through a 2-slot pool."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TypeVar

import pytest

from corral import model, store
from tests.support.cli import Run, corral_env
from tests.support.crash import stop
from tests.support.wait import PATIENCE

T = TypeVar("T")


def side_by_side(*calls: Callable[[], T]) -> list[T]:
    """The results of `calls`, made at once from threads: `corral` commands that do not
    depend on each other, each a process of its own as a user's would be."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return [done.result() for done in [pool.submit(call) for call in calls]]


def test_schedules_add_list_show_preview_and_bad_input(corral: Run) -> None:
    made = corral(
        "schedules",
        "add",
        "nightly",
        "--cron",
        "30 2 * * *",
        "--tz",
        "Europe/Berlin",
        "--payload",
        '{"format": "pdf"}',
        "--label",
        "env=prod",
        "--json",
        "--",
        "echo",
        "hi",
    )
    schedule = json.loads(made.stdout)
    assert (schedule["cron"], schedule["tz"], schedule["paused"]) == (
        "30 2 * * *",
        "Europe/Berlin",
        False,
    )
    # What reads, or is refused, does not wait for the others: side by side.
    bad = [
        (["--cron", "61 * * * *"], "cron:"),
        (["--cron", "0 9 * * *", "--tz", "Mars/Olympus"], "tz:"),
        (["--every", "500ms"], "every:"),
        (["--every", "1m", "--start", "soon"], "start:"),
        (["--every", "1m", "--payload", "[1]"], "payload:"),
    ]
    listed_out, shown_out, preview_out, leap, *refusals = side_by_side(
        partial(corral, "schedules", "list", "--json"),
        partial(corral, "schedules", "show", "nightly", "--json"),
        partial(
            corral,
            "schedules",
            "preview",
            "--cron",
            "30 2 * * *",
            "--tz",
            "Europe/Berlin",
            "--from",
            "2026-03-28",
            "--count",
            "2",
            "--json",
        ),
        partial(
            corral,
            "schedules",
            "preview",
            "--cron",
            "0 0 29 2 *",
            "--from",
            "2028-02-28",
            "--count",
            "2",
            "--json",
        ),
        *[
            partial(corral, "schedules", "add", "bad", *args, "--", "true", check=False)
            for args, _ in bad
        ],
    )
    listed = json.loads(listed_out.stdout)
    assert [s["name"] for s in listed] == ["nightly"]
    shown = json.loads(shown_out.stdout)
    assert len(shown["upcoming"]) == 5
    assert shown["firings"] == []
    preview = json.loads(preview_out.stdout)
    assert [p["at"] for p in preview] == ["2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00"]
    assert preview[0]["moved"] is None
    assert "does not exist" in preview[1]["moved"]
    assert [p["utc"] for p in json.loads(leap.stdout)] == [
        "2028-02-29T00:00:00+00:00",
        "2032-02-29T00:00:00+00:00",
    ]
    for (args, field), refused in zip(bad, refusals, strict=True):
        assert refused.returncode == 2, (args, refused.stderr)
        assert field in refused.stderr, (args, refused.stderr)
    assert len(json.loads(corral("schedules", "list", "--json").stdout)) == 1, "nothing stored"
    corral("schedules", "pause", "nightly")
    assert json.loads(corral("schedules", "show", "nightly", "--json").stdout)["paused"]
    corral("schedules", "resume", "nightly")
    corral("schedules", "update", "nightly", "--cron", "0 3 * * *")
    corral("schedules", "update", "nightly", "--payload", '{"format": "csv"}', "--queue", "q")
    updated = json.loads(corral("schedules", "show", "nightly", "--json").stdout)
    assert updated["template"]["payload"] == {"format": "csv"}
    assert updated["template"]["queue"] == "q"
    assert updated["template"]["spec"] == {"command": ["echo", "hi"]}, "what runs stays"
    corral("schedules", "update", "nightly", "--label", "team=b", "--heartbeat")
    corral("schedules", "update", "nightly", "--deadline", "2m")
    merged = json.loads(corral("schedules", "show", "nightly", "--json").stdout)["template"]
    assert merged["labels"] == {"env": "prod", "team": "b"}, "--label adds"
    assert merged["policy"]["heartbeat"] is True, "--deadline keeps the rest of the policy"
    assert merged["policy"]["limits"]["attempt_deadline"] == 120  # stored in seconds
    corral("schedules", "update", "nightly", "--deadline", "3m")  # a new one replaces it
    again = json.loads(corral("schedules", "show", "nightly", "--json").stdout)
    assert again["template"]["policy"]["limits"]["attempt_deadline"] == 180
    assert again["cron"] == "0 3 * * *"
    job_id = corral("schedules", "trigger", "nightly").stdout.strip()
    assert json.loads(corral("jobs", "show", job_id, "--json").stdout)["state"] == "queued"
    corral("schedules", "delete", "nightly")
    assert json.loads(corral("schedules", "list", "--json").stdout) == []


def test_serve_fires_a_schedule_and_its_job_reads_its_interval(
    corral: Run,
    tmp_path: Path,
) -> None:
    out = tmp_path / "seen.txt"
    corral(
        "schedules",
        "add",
        "tick",
        "--every",
        "1s",
        "--overlap",
        "forbid",
        "--",
        "sh",
        "-c",
        f'echo "$CORRAL_SCHEDULE $CORRAL_INTERVAL_START $CORRAL_INTERVAL_END" >> {out}',
    )
    later = corral("submit", "--delay", "2s", "--json", "--", "true")
    later_id = str(json.loads(later.stdout)["id"])
    assert json.loads(corral("jobs", "show", later_id, "--json").stdout)["state"] == "scheduled"
    with open(tmp_path / "serve.log", "w") as log:  # a file never fills up and blocks
        proc = subprocess.Popen(
            [sys.executable, "-m", "corral", "serve"],
            cwd=tmp_path,
            env=corral_env(),
            stdout=subprocess.DEVNULL,
            stderr=log,
            text=True,
        )
    try:
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            lines = out.read_text().splitlines() if out.exists() else []
            done = json.loads(corral("jobs", "show", later_id, "--json").stdout)["state"]
            if len(lines) >= 3 and done == "succeeded":
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"not fired 3 times and the later job not done: {lines}, {done}")
    finally:
        stop(proc)
    name, start, end = lines[0].split()
    assert name == "tick"
    assert start < end
    shown = json.loads(corral("schedules", "show", "tick", "--json").stdout)
    assert {f["outcome"] for f in shown["firings"]} <= {"fired", "overlap", "missed"}
    assert all(f["lateness_seconds"] >= 0 for f in shown["firings"])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_backfill_of_730_days_through_a_2_slot_pool(
    corral: Run,
    tmp_path: Path,
) -> None:
    (tmp_path / "corral.toml").write_text("[pools]\nbackfill = 2\n")
    corral("schedules", "add", "daily", "--cron", "0 0 * * *", "--", "true")
    args = ("backfill", "daily", "--from", "2024-01-01", "--to", "2025-12-31", "--json")
    dry = json.loads(corral(*args, "--dry-run").stdout)
    assert dry == {"created": 730, "existing": 0, "dry_run": True}
    made = json.loads(corral(*args, "--pool", "backfill", "--code-version", "v1.4.2").stdout)
    assert made == {"created": 730, "existing": 0, "dry_run": False}
    again = json.loads(corral(*args, "--pool", "backfill", "--code-version", "v1.4.2").stdout)
    assert again == {"created": 0, "existing": 730, "dry_run": False}, "idempotent"
    (tmp_path / "live.jsonl").write_text('{"spec": {"command": ["true"]}, "queue": "live"}\n' * 5)
    live = json.loads(corral("submit", "--from-file", "live.jsonl", "--json").stdout)
    assert live["created"] == 5
    others = [job["id"] for job in live["jobs"]]
    # Two slots: a tick claims at most two, so ticks come often.
    fast = {
        "CORRAL_TIMEOUTS__DISPATCH_INTERVAL": "50ms",
        "CORRAL_TIMEOUTS__TICK_DEADLINE": "40ms",
        "CORRAL_TIMEOUTS__TICK_MARGIN": "10ms",
    }
    with open(tmp_path / "serve.log", "w") as log:  # a file never fills up and blocks
        proc = subprocess.Popen(
            [sys.executable, "-m", "corral", "serve"],
            cwd=tmp_path,
            env=corral_env(fast),
            stdout=subprocess.DEVNULL,
            stderr=log,
            text=True,
        )
    url = f"sqlite:///{tmp_path / 'corral.db'}"
    try:
        deadline = time.monotonic() + 500
        while time.monotonic() < deadline:
            counts = asyncio.run(_counts(url))
            if counts.get("succeeded", 0) == 735:
                break
            time.sleep(0.25)
        else:
            raise AssertionError(f"not all done: {counts}")
    finally:
        stop(proc)
    jobs, spans, attempts = asyncio.run(_read(url))
    backfilled = [j for j in jobs if j.pool == "backfill"]
    assert len(backfilled) == 730
    assert {j.code_version for j in backfilled} == {"v1.4.2"}
    starts = sorted(j.payload["corral"]["interval_start"] for j in backfilled)
    assert starts[0] == "2024-01-01T00:00:00Z"
    assert starts[-1] == "2025-12-30T00:00:00Z"
    assert max_overlap(spans) <= 2, "the pool ran more than 2 at once"
    last_backfill_end = max(end for _, end in spans)
    live_ends = [attempts[i].finished_at for i in others]
    assert all(end is not None and end.timestamp() < last_backfill_end for end in live_ends), (
        "jobs outside the pool waited for the backfill"
    )


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant."""
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = open_now = 0
    for _, step in points:
        open_now += step
        most = max(most, open_now)
    return most


async def _counts(url: str) -> dict[str, int]:
    db = store.Store.connect(url)
    try:
        return await db.jobs.count_by_state()
    finally:
        await db.close()


async def _read(
    url: str,
) -> tuple[list[model.Job], list[tuple[float, float]], dict[int, model.Attempt]]:
    db = store.Store.connect(url)
    try:
        jobs = await db.jobs.list(limit=10_000)
        spans = []
        attempts = {}
        for j in jobs:
            [attempt] = await db.attempts.list(job_id=j.id)
            attempts[j.id] = attempt
            if j.pool == "backfill":
                # A slot is taken from the claim (the attempt's creation) to the end.
                assert attempt.finished_at
                spans.append((attempt.created_at.timestamp(), attempt.finished_at.timestamp()))
        return jobs, spans, attempts
    finally:
        await db.close()
