"""A real `corral serve` killed with SIGKILL while its HTTP requests are in flight: the new
corral never sends those attempts again; it calls them lost as soon as the loops table shows
their sender dead (not after recovery_grace), and each job's next attempt carries a higher
fence and the same Idempotency-Key. Every job ends once; no fence is sent twice."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from corral import model, store
from corral.clock import SystemClock
from corral.executors import http_spec
from tests.support.crash import Site, run_to_the_end, seeded
from tests.support.net import in_thread

LIMITS = {
    # A lost attempt is called lost within seconds: the chain of limits shrunk to fit.
    "CORRAL_TIMEOUTS__HTTP_REQUEST_TIMEOUT": "2s",
    "CORRAL_TIMEOUTS__STEP_DEADLINE": "3s",
    "CORRAL_TIMEOUTS__ATTEMPT_DEADLINE": "4s",
    "CORRAL_TIMEOUTS__RECOVERY_GRACE": "6s",
    "CORRAL_EXECUTORS__HTTP__ALLOW_NETWORKS": '["127.0.0.0/8:1024-65535"]',
    "CORRAL_RETRY__BASE": "100ms",
}


class Receiver(ThreadingHTTPServer):
    """Holds the first request it gets until `release` is set (with `hold_first`); answers
    the others after `delay` seconds. Keeps (Idempotency-Key, Corral-Fence) of every
    request, and writes each to `ledger` as the crash tests' run ledger (`job id,attempt,
    fence`)."""

    daemon_threads = True

    def __init__(self, *, hold_first: bool = True, delay: float = 0.0) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.seen: list[tuple[str, int]] = []
        self.holding = threading.Event()
        self.release = threading.Event()
        self.ledger: Path | None = None
        self.hold_first = hold_first
        self.delay = delay
        self.lock = threading.Lock()

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # the held request's client was killed: its answer has nowhere to go


class Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        got = self.headers
        with self.server.lock:
            self.server.seen.append((got["Idempotency-Key"], int(got["Corral-Fence"])))
            first = len(self.server.seen) == 1
            if self.server.ledger is not None:
                with self.server.ledger.open("a") as ledger:
                    ledger.write(
                        f"{got['Corral-Job-Id']},{got['Corral-Attempt']},{got['Corral-Fence']}\n"
                    )
        if first and self.server.hold_first:
            self.server.holding.set()
            self.server.release.wait(60)
        elif self.server.delay:
            self.server.release.wait(self.server.delay)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def receiver(request: pytest.FixtureRequest) -> Iterator[Receiver]:
    with in_thread(Receiver(**getattr(request, "param", {}))) as server:
        try:
            yield server
        finally:
            server.release.set()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_serve_killed_mid_request_sends_each_attempt_once(
    tmp_path: Path, db_url: str, receiver: Receiver
) -> None:
    site = Site(tmp_path, db_url)
    receiver.ledger = site.ledger
    site.corral("db", "upgrade", **LIMITS)
    url = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
    made = site.corral("submit", "--http", "POST", url, "--json-body", '{"n": 1}', **LIMITS)
    job_id = int(made.stdout.split()[-1])
    proc = site.start("serve", **LIMITS)
    try:
        assert receiver.holding.wait(90), "the request never came"
    finally:
        proc.kill()  # SIGKILL while the receiver holds the request
        proc.wait()
    receiver.release.set()
    report = run_to_the_end(site, [job_id], "serve", **LIMITS)
    states = [a.state for a in sorted(report.attempts, key=lambda a: a.id)]
    assert states == [model.AttemptState.LOST, model.AttemptState.SUCCEEDED]
    assert [j.state for j in report.jobs] == [model.JobState.SUCCEEDED]
    fences = sorted(a.id for a in report.attempts)
    assert receiver.seen == [(f"corral-job-{job_id}", fence) for fence in fences]


JOBS, KILLS, WINDOW = 200, 10, 25.0
BLIND = {
    # recovery_grace as it is by default: a blind attempt must not wait for it.
    "CORRAL_TIMEOUTS__RECOVERY_GRACE": "6m",
    "CORRAL_TIMEOUTS__RECONCILE_INTERVAL": "1s",
    "CORRAL_EXECUTORS__ENABLED": '["http"]',
    "CORRAL_EXECUTORS__HTTP__ALLOW_NETWORKS": '["127.0.0.0/8:1024-65535"]',
    "CORRAL_RETRY__BASE": "100ms",
}


def _submit_http(url: str, target: str, count: int) -> list[int]:
    spec = http_spec.check_spec({"method": "POST", "url": target, "json": {"n": 1}})

    async def go() -> list[int]:
        db = store.Store.connect(url)
        try:
            jobs = [model.NewJob(executor="http", spec=spec) for _ in range(count)]
            made = await db.jobs.submit(new=jobs, now=SystemClock().now())
            return [job_id for job_id, _ in made]
        finally:
            await db.close()

    return asyncio.run(go())


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("receiver", [{"hold_first": False, "delay": 0.2}], indirect=True)
def test_requests_cut_off_by_kills_are_retried_within_seconds_of_the_restart(
    tmp_path: Path, receiver: Receiver
) -> None:
    """200 HTTP jobs, `corral serve` SIGKILLed 10 times in 25 s while requests are in
    flight: after the last restart every job ends well inside recovery_grace (6 minutes),
    since each attempt cut off is lost as soon as its sender is seen dead; each job
    succeeds once, and no fence is ever sent twice."""
    site = Site(tmp_path, f"sqlite:///{tmp_path / 'corral.db'}")
    receiver.ledger = site.ledger
    site.corral("db", "upgrade")
    target = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
    ids = _submit_http(site.url, target, JOBS)
    rnd = seeded()
    ends = time.monotonic() + WINDOW
    for _ in range(KILLS):
        proc = site.start("serve", **BLIND)
        time.sleep(max(0.0, min(rnd.uniform(1.5, 3.0), ends - time.monotonic())))
        proc.kill()
        proc.wait()
    restarted = time.monotonic()
    report = run_to_the_end(site, ids, "serve", **BLIND)
    took = time.monotonic() - restarted
    lost = sum(1 for a in report.attempts if a.state == model.AttemptState.LOST)
    print(f"blind kills: {lost} attempts lost to kills; all ended {took:.1f}s after the restart")
    assert lost > 0, "no request was cut off: the kills missed"
    assert [j.state for j in report.jobs] == [model.JobState.SUCCEEDED] * JOBS
    sent = Counter(fence for _, fence in receiver.seen)
    assert max(sent.values()) == 1, "a fence was sent twice"
    assert took < 120, f"the last jobs ended {took:.0f}s after the restart: recovery waited"
