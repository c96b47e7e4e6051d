"""A real `corral serve` killed with SIGKILL while its HTTP request is in flight: the new
corral never sends that attempt again; it calls it lost past recovery_grace, and the job's
next attempt carries a higher fence and the same Idempotency-Key. The job ends once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from corral import model
from tests.support.crash import Site, run_to_the_end

LIMITS = {
    # A lost attempt is called lost within seconds: the chain of limits shrunk to fit.
    "CORRAL_TIMEOUTS__HTTP_REQUEST_TIMEOUT": "2s",
    "CORRAL_TIMEOUTS__STEP_DEADLINE": "3s",
    "CORRAL_TIMEOUTS__ATTEMPT_DEADLINE": "4s",
    "CORRAL_TIMEOUTS__RECOVERY_GRACE": "6s",
    "CORRAL_EXECUTORS__HTTP__ALLOW_NETWORKS": '["127.0.0.0/8"]',
    "CORRAL_RETRY__BASE": "100ms",
}


class Receiver(ThreadingHTTPServer):
    """Holds the first request it gets until `release` is set; answers the others at once.
    Keeps (Idempotency-Key, Corral-Fence) of every request, and writes each to `ledger` as
    the crash tests' run ledger (`job id,attempt,fence`)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.seen: list[tuple[str, int]] = []
        self.holding = threading.Event()
        self.release = threading.Event()
        self.ledger: Path | None = None

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # the held request's client was killed: its answer has nowhere to go


class Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        got = self.headers
        self.server.seen.append((got["Idempotency-Key"], int(got["Corral-Fence"])))
        if self.server.ledger is not None:
            with self.server.ledger.open("a") as ledger:
                ledger.write(
                    f"{got['Corral-Job-Id']},{got['Corral-Attempt']},{got['Corral-Fence']}\n"
                )
        if len(self.server.seen) == 1:
            self.server.holding.set()
            self.server.release.wait(60)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()


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
