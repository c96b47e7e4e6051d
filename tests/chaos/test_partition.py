"""One of two dispatchers cut off from PostgreSQL for 30s by a silent partition (packets
dropped, not refused), then healed: nothing is lost, stuck or run twice, the other
dispatcher keeps launching throughout, and every process resumes within 10s of the heal.

The cut dispatcher runs in a network namespace of its own and reaches a private PostgreSQL
cluster over a veth pair; the other dispatcher and a reconciler reach it on 127.0.0.1. All
three share one state folder (the process executor's run folders), so each sees and
completes what the others launched. Jobs keep arriving throughout, and each appends to a
ledger who launched it and when. On the private cluster, the cut dispatcher's transactions
that update attempts take a little longer (a trigger), so the cut is likely to catch it
holding row locks, the case that used to freeze everyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from corral import model, store
from tests.support.crash import Report, Site
from tests.support.partition import Cluster, Namespace, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

CUT_SECONDS = 30.0
RESUME_WITHIN = 10.0  # every process does its work again this long after the heal
SLACK = 3.0  # what a loaded machine adds to a stall (ticks late, processes slow to start)
LIMITS = {
    "CORRAL_TIMEOUTS__DATABASE_CONNECT_TIMEOUT": "2s",
    "CORRAL_TIMEOUTS__DATABASE_TCP_TIMEOUT": "3s",
    "CORRAL_TIMEOUTS__DATABASE_LOCK_TIMEOUT": "1s",
    "CORRAL_TIMEOUTS__DATABASE_STATEMENT_TIMEOUT": "3s",
    "CORRAL_TIMEOUTS__DATABASE_IDLE_TIMEOUT": "3s",
    "CORRAL_TIMEOUTS__DATABASE_TRANSACTION_TIMEOUT": "4s",
    "CORRAL_TIMEOUTS__LAUNCH_GRACE": "5s",
    "CORRAL_TIMEOUTS__LEASE_TIMEOUT": "5s",
    "COLUMNS": "500",  # one log record, one line
}
LOCK_TIMEOUT = 1.0
CUT, FREE, RECONCILER = "cut", "free", "reconciler"
FAILURES = ("tick failed", "writing completions failed", "poll failed", "pass failed", "given up")
UNREACHABLE = ("cannot be reached", "got no answer", "no answer from the database")
SLOW_ATTEMPT_WRITES = """
CREATE FUNCTION corral_test_slow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF current_setting('application_name') = 'corral-cut' THEN PERFORM pg_sleep(0.3); END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER corral_test_slow AFTER UPDATE ON attempts
  FOR EACH STATEMENT EXECUTE FUNCTION corral_test_slow();
"""
FAST_AGAIN = """
CREATE OR REPLACE FUNCTION corral_test_slow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RETURN NULL; END $$;
"""
"""Once the cut is in place, attempt writes take their usual time again (replacing the
function takes no lock on the table, so it waits for nobody)."""


@dataclass
class Run:
    """One corral process, its stderr lines kept with the (wall) time each arrived."""

    role: str
    proc: subprocess.Popen[str]
    lines: list[tuple[float, str]] = field(default_factory=list)
    _reader: threading.Thread | None = None

    def start_reading(self, log: Path) -> None:
        def read() -> None:
            assert self.proc.stderr is not None
            with open(log, "a") as out:
                for line in self.proc.stderr:
                    self.lines.append((time.time(), line.rstrip()))
                    out.write(f"{time.time():.3f} {line}")

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()

    def failures(
        self, after: float, before: float = float("inf"), said: Sequence[str] = FAILURES
    ) -> list[tuple[float, str]]:
        """The loops' complaints that a round failed (or, with `said`, lines saying that)."""
        return [
            (t, line)
            for t, line in self.lines
            if after < t < before and any(say in line for say in said)
        ]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=30)  # it reads to the end of the pipe
        if self.proc.stderr is not None:
            self.proc.stderr.close()


class Submitter:
    """Submits two jobs every quarter second from this process (never cut off)."""

    def __init__(self, url: str, command: list[str]) -> None:
        self.url, self.command = url, command
        self.ids: list[int] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> Submitter:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    async def _run(self) -> None:
        from corral.clock import SystemClock

        db = store.Store.connect(self.url)
        job = model.NewJob(executor="process", spec={"command": self.command})
        try:
            while not self._stop.is_set():
                try:
                    made = await db.jobs.submit(new=[job, job], now=SystemClock().now())
                    self.ids += [job_id for job_id, _ in made]
                except Exception as exc:  # noted: the test fails on it
                    self.errors.append(repr(exc))
                await asyncio.sleep(0.25)
        finally:
            await db.close()


def launches(ledger: Path) -> list[tuple[int, int, int, str, float]]:
    """(job, attempt, fence, who launched it, when it started), one per run."""
    rows = [line.split(",") for line in ledger.read_text().split()]
    return [(int(j), int(a), int(f), who, float(at)) for j, a, f, who, at in rows]


def longest_gap(times: Sequence[float], start: float, end: float) -> float:
    marks = [start, *sorted(t for t in times if start < t < end), end]
    return max(b - a for a, b in itertools.pairwise(marks))


def wait_for(predicate: object, seconds: float, what: str, runs: Sequence[Run] = ()) -> float:
    """Poll until `predicate()` holds; returns when (wall time). Fails fast if a run exits."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return time.time()
        for r in runs:
            assert r.proc.poll() is None, f"the {r.role} exited ({r.proc.returncode})"
        time.sleep(0.1)
    raise AssertionError(f"not {what} after {seconds}s")


@pytest.fixture
def partition() -> Iterator[tuple[Namespace, Cluster]]:
    if (why := unavailable()) is not None:
        pytest.skip(f"partition chaos test: {why}")
    try:
        made = Namespace.created()
        ns = made.__enter__()
    except OSError as exc:
        pytest.skip(f"partition chaos test: cannot create a network namespace here: {exc}")
    try:
        with Cluster.started(listen=[ns.host_ip], trust=f"{ns.inner_ip}/32") as cluster:
            yield ns, cluster
    finally:
        made.__exit__(None, None, None)


def test_a_dispatcher_cut_off_for_30s(tmp_path: Path, partition: tuple[Namespace, Cluster]) -> None:
    ns, cluster = partition
    site = Site(tmp_path, cluster.url())
    site.corral("db", "upgrade")
    engine = create_engine(cluster.url())
    with engine.begin() as conn:
        conn.exec_driver_sql(SLOW_ATTEMPT_WRITES)
    ledger = tmp_path / "partition-ledger.txt"
    ledger.touch()
    line = f'"$CORRAL_JOB_ID,$CORRAL_ATTEMPT,$CORRAL_FENCE,$CHAOS_ROLE,$(date +%s.%N)" >> {ledger}'
    runs: list[Run] = []

    def start(role: str, command: str, url: str, inside: bool = False) -> Run:
        argv = [sys.executable, "-m", "corral", command, "--health-file", f"{role}.health"]
        env = site.env(**LIMITS, CORRAL_DATABASE_URL=url, CHAOS_ROLE=role)
        proc = subprocess.Popen(
            ns.inside(argv) if inside else argv,
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        run = Run(role, proc)
        run.start_reading(tmp_path / f"{role}.log")
        runs.append(run)
        return run

    with contextlib.ExitStack() as cleanup:
        cleanup.callback(engine.dispose)
        cleanup.callback(lambda: [r.stop() for r in runs])
        submitter = cleanup.enter_context(
            Submitter(cluster.url(), ["sh", "-c", f"echo {line}; sleep 0.2"])
        )
        cut = start(CUT, "dispatcher", cluster.url(ns.host_ip, application_name="corral-cut"), True)
        start(FREE, "dispatcher", cluster.url())
        start(RECONCILER, "reconciler", cluster.url())

        def launched_by(role: str, after: float = 0.0) -> list[float]:
            return [at for *_, who, at in launches(ledger) if who == role and at > after]

        wait_for(lambda: launched_by(CUT) and launched_by(FREE), 120, "both launching", runs)
        time.sleep(3)  # steady traffic (a fixed span of it, not a synchronisation)
        cut_at = time.time()
        ns.cut()
        caught = holds_locks(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql(FAST_AGAIN)
        time.sleep(CUT_SECONDS)  # the partition itself
        ns.heal()
        healed_at = time.time()
        first_complaint = min([t for t, _ in cut.failures(cut_at)] or [float("inf")])
        resumed = wait_for(
            lambda: launched_by(CUT, healed_at), 60, "the cut dispatcher launching again", runs
        )
        time.sleep(RESUME_WITHIN + 1)  # let every process show it works again
        submitter.stop()
        ids = list(submitter.ids)
        wait_for(lambda: all_final(site.url), 180, "every job final", runs)
        free_gap = longest_gap(launched_by(FREE), cut_at, healed_at)
        figures = {
            "jobs": len(ids),
            "caught_in_a_transaction": caught,
            "cut_launches_during_the_cut": len(launched_by(CUT, cut_at))
            - len(launched_by(CUT, healed_at)),
            "free_launches_during_the_cut": len(launched_by(FREE, cut_at))
            - len(launched_by(FREE, healed_at)),
            "free_longest_gap_during_the_cut_s": round(free_gap, 2),
            "cut_resumed_after_s": round(resumed - healed_at, 2),
            "relaunched_by_the_reconciler": len(launched_by(RECONCILER)),
            "cut_first_complaint_after_s": round(first_complaint - cut_at, 2),
            "cut_complaints_during_the_cut": len(cut.failures(cut_at, healed_at)),
            "cut_calls_given_up": sum("given up" in ln for _, ln in cut.lines),
            "lock_waits_past_lock_timeout": sum(
                "waited too long for a lock" in ln for r in runs for _, ln in r.lines
            ),
        }
        print("partition figures:", json.dumps(figures))
        for r in runs:
            r.stop()
        report = Report(site.url, ids)

    assert not submitter.errors, submitter.errors[:3]
    ran = launches(ledger)
    report.check([(j, a, f) for j, a, f, _, _ in ran])
    assert all(j.state == model.JobState.SUCCEEDED for j in report.jobs), "these jobs never fail"
    twice = [job for job, n in Counter(j for j, *_ in ran).items() if n > 1]
    assert not twice, f"jobs that ran twice: {twice}"
    assert sorted({j for j, *_ in ran}) == sorted(ids), "every job ran"
    # The other dispatcher kept launching: never stalled longer than one lock wait.
    assert free_gap <= LOCK_TIMEOUT + SLACK, figures
    # Every process resumed within RESUME_WITHIN of the heal.
    assert resumed - healed_at <= RESUME_WITHIN, figures
    for r in runs:  # lock waits past lock_timeout may happen (and be tried again) at any time
        late = r.failures(healed_at + RESUME_WITHIN, said=UNREACHABLE)
        assert not late, f"the {r.role} still cut off {RESUME_WITHIN}s after the heal: {late[:3]}"
    # The cut one said so, soon: a call gets no answer for at most the transaction limit.
    assert first_complaint - cut_at <= 4.0 + SLACK, figures


def all_final(url: str) -> bool:
    async def count() -> dict[str, int]:
        db = store.Store.connect(url)
        try:
            return await db.jobs.count_by_state()
        finally:
            await db.close()

    states = asyncio.run(count())
    return all(state in model.FINAL_JOB_STATES for state in states)


def holds_locks(engine: object) -> bool:
    """Whether the cut dispatcher's session was inside a transaction when the cut came (as
    the server sees it, a moment later)."""
    time.sleep(0.2)
    with engine.connect() as conn:  # type: ignore[attr-defined]
        found = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name = 'corral-cut' AND xact_start IS NOT NULL"
            )
        ).scalar_one()
    return bool(found)
