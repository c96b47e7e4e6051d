"""Helpers for crash tests: corral as real processes on a real database, a ledger of runs."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from corral import model, store
from tests.support.cli import clean_env, run_corral
from tests.support.wait import eventually_sync

# Short limits so recovery happens within seconds; jobs never come near the deadline.
FAST = {
    "CORRAL_TIMEOUTS__DISPATCH_INTERVAL": "100ms",
    "CORRAL_TIMEOUTS__TICK_DEADLINE": "80ms",
    "CORRAL_TIMEOUTS__TICK_MARGIN": "20ms",
    "CORRAL_TIMEOUTS__OBSERVE_INTERVAL": "200ms",
    "CORRAL_TIMEOUTS__RECONCILE_INTERVAL": "300ms",
    # On PostgreSQL a store call (connecting included: at least 2s) must fit inside both.
    "CORRAL_TIMEOUTS__LAUNCH_GRACE": "3s",
    "CORRAL_TIMEOUTS__LEASE_TIMEOUT": "3s",
    "CORRAL_TIMEOUTS__DATABASE_CONNECT_TIMEOUT": "2s",
    "CORRAL_TIMEOUTS__DATABASE_TRANSACTION_TIMEOUT": "2500ms",
    "CORRAL_TIMEOUTS__ATTEMPT_DEADLINE": "60s",
    "CORRAL_TIMEOUTS__RECOVERY_GRACE": "90s",
    "CORRAL_TIMEOUTS__CANCEL_GRACE": "1s",
    "CORRAL_TIMEOUTS__MARGIN": "500ms",  # room for heartbeat_interval inside the 3s lease
    "CORRAL_LOG_LEVEL": "WARNING",
    # Small ticks with few launches in flight: a kill lands mid-tick more often.
    "CORRAL_CLAIM_BATCH_LIMIT": "20",
    "CORRAL_LAUNCH_CONCURRENCY": "4",
}


def seeded() -> random.Random:
    """A random source for a chaos test, its seed printed (CORRAL_CHAOS_SEED repeats it)."""
    seed = int(os.environ.get("CORRAL_CHAOS_SEED", str(int(time.time()))))
    print(f"chaos seed {seed} (set CORRAL_CHAOS_SEED to repeat)")
    return random.Random(seed)


class Site:
    """A working folder with a database, a run-folder root and a ledger file."""

    def __init__(self, root: Path, database_url: str) -> None:
        self.root = root
        self.url = database_url
        self.ledger = root / "ledger.txt"
        self.ledger.touch()

    def env(self, **extra: str) -> dict[str, str]:
        env = clean_env(FAST)
        env.update(CORRAL_DATABASE_URL=self.url, CORRAL_STATE_DIR=str(self.root / "state"))
        env.update(extra)
        return env

    def corral(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return run_corral(self.root, *args, env=self.env(**extra), check=True)

    def start(self, command: str = "serve", **extra: str) -> subprocess.Popen[str]:
        with open(self.root / "corral.log", "a") as log:  # a file never fills up and blocks
            return subprocess.Popen(
                [sys.executable, "-m", "corral", command],
                cwd=self.root,
                env=self.env(**extra),
                stdout=subprocess.DEVNULL,
                stderr=log,
                text=True,
            )

    def submit(self, count: int, sleep: float = 0.1) -> list[int]:
        """Jobs that append `job id,attempt,fence` to the ledger, then sleep a little."""
        line = '"$CORRAL_JOB_ID,$CORRAL_ATTEMPT,$CORRAL_FENCE"'
        return self.submit_shell(count, f"echo {line} >> {self.ledger}; sleep {sleep}")

    def submit_shell(self, count: int, cmd: str) -> list[int]:
        """`count` jobs that each run `sh -c cmd`."""
        return asyncio.run(_submit(self.url, cmd, count))

    def ledger_entries(self) -> list[tuple[int, int, int]]:
        rows = [line.split(",") for line in self.ledger.read_text().split()]
        return [(int(j), int(a), int(f)) for j, a, f in rows]


@pytest.fixture
def site(db_url: str, tmp_path: Path) -> Site:
    """A Site in the test's folder, on its database (each backend in turn); a test module
    takes it as its own fixture with `site = crash.site`."""
    return Site(tmp_path, db_url)


async def _submit(url: str, cmd: str, count: int) -> list[int]:
    from corral.clock import SystemClock

    db = store.Store.connect(url)
    jobs = [
        model.NewJob(executor="process", spec={"command": ["sh", "-c", cmd]}) for _ in range(count)
    ]
    ids = [job_id for job_id, _ in await db.jobs.submit(new=jobs, now=SystemClock().now())]
    await db.close()
    return ids


def wait_exit(proc: subprocess.Popen[str], seconds: float = 60) -> int:
    try:
        proc.wait(timeout=seconds)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
    return proc.returncode


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
    wait_exit(proc, 30)


class Report:
    """Everything the store says about some jobs, and the checks every crash test makes."""

    def __init__(self, url: str, job_ids: Sequence[int]) -> None:
        self.jobs, self.attempts, self.events = asyncio.run(_load(url, job_ids))

    def all_final(self) -> bool:
        return all(j.state in model.FINAL_JOB_STATES for j in self.jobs)

    def check(self, ledger: Sequence[tuple[int, int, int]]) -> None:
        """The promises: every job ended, exactly once; no attempt ran twice; nothing stuck;
        every run was an attempt the store knows; each run log replays to its job's state."""
        assert self.all_final(), [
            (j.id, j.state) for j in self.jobs if j.state not in model.FINAL_JOB_STATES
        ]
        runs = Counter((j, a) for j, a, _ in ledger)
        assert max(runs.values(), default=1) == 1, (
            f"ran twice: {[k for k, n in runs.items() if n > 1]}"
        )
        known = {(a.job_id, a.attempt_no, a.id) for a in self.attempts}
        assert set(ledger) <= known, f"unknown runs: {set(ledger) - known}"
        stuck = [a for a in self.attempts if a.state in model.ACTIVE_ATTEMPT_STATES]
        assert not stuck, f"stuck attempts: {stuck}"
        for job in self.jobs:
            assert replay(self.events[job.id]) == job.state, f"job {job.id} events do not replay"
        succeeded = sorted(j.id for j in self.jobs if j.state == model.JobState.SUCCEEDED)
        won = [a for a in self.attempts if a.state == model.AttemptState.SUCCEEDED]
        assert sorted(a.job_id for a in won) == succeeded, "one succeeded attempt per succeeded job"
        ran = {(j, a) for j, a, _ in ledger}
        assert all((a.job_id, a.attempt_no) in ran for a in won), "a success that never ran"

    def count(self, prefix: str) -> int:
        return sum(e.reason.startswith(prefix) for events in self.events.values() for e in events)


def replay(events: Sequence[model.Event]) -> str | None:
    """The job state its events lead to; raises if one starts from the wrong state."""
    state: str | None = None
    for e in events:
        if e.entity != "job" or e.from_state == e.to_state:
            continue
        assert e.from_state == state, f"event {e.id}: from {e.from_state}, but the job was {state}"
        state = e.to_state
    return state


async def _load(
    url: str, job_ids: Sequence[int]
) -> tuple[list[model.Job], list[model.Attempt], dict[int, list[model.Event]]]:
    db = store.Store.connect(url)
    jobs = [await db.jobs.get(job_id=i) for i in job_ids]
    attempts = [a for i in job_ids for a in await db.attempts.list(job_id=i)]
    events = {i: await db.events.list(job_id=i) for i in job_ids}
    await db.close()
    return jobs, attempts, events


def run_to_the_end(site: Site, ids: Sequence[int], *commands: str, **extra: str) -> Report:
    """Run corral (`serve`, or the given commands side by side, with `extra` in their
    environment) until every job is final, then check every promise against the store and
    the ledger."""
    procs = [site.start(c, **extra) for c in commands or ("serve",)]
    try:
        eventually_sync(
            lambda: Report(site.url, ids).all_final(), within=180, every=0.2, what="all jobs final"
        )
    finally:
        for p in procs:
            stop(p)
    report = Report(site.url, ids)
    report.check(site.ledger_entries())
    return report
