"""A real `corral alerter` killed (os._exit, as SIGKILL) after writing its messages to
the outbox and before delivering any: the next alerter delivers each message, once."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from corral import failpoints, model, store
from corral.store import Finish
from corral.testing import FrozenClock
from tests.support.cli import clean_env, run_corral
from tests.support.net import in_thread
from tests.support.wait import PATIENCE, eventually_sync


class Receiver(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.keys: list[str] = []


class Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self.server.keys.append(body["key"])
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with in_thread(Receiver()) as server:
        yield server


def test_an_alerter_killed_before_delivering_delivers_after_its_restart_once(
    tmp_path: Path, receiver: Receiver
) -> None:
    url = f"sqlite:///{tmp_path}/corral.db"
    port = receiver.server_address[1]
    (tmp_path / "corral.toml").write_text(
        f"""
database_url = "{url}"
[executors.http]
allow_networks = ["127.0.0.0/8:1024-65535"]
[alerts.channels.hook]
kind = "webhook"
url = "http://127.0.0.1:{port}/alerts"
[alerts.rules.all]
on = ["quarantined"]
channels = ["hook"]
"""
    )
    asyncio.run(_three_quarantined(url))
    env = clean_env()
    crashed = run_corral(
        tmp_path, "alerter", env={**env, failpoints.ENV: "after_alerts_written:crash"}
    )
    assert crashed.returncode == failpoints.CRASH_EXIT_CODE, crashed.stderr
    assert receiver.keys == []  # written, not sent
    again = subprocess.Popen(
        [sys.executable, "-m", "corral", "alerter"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        eventually_sync(lambda: len(receiver.keys) >= 3, what="three alerts delivered")
    finally:
        again.terminate()
        _, stderr = again.communicate(timeout=PATIENCE)
    assert again.returncode == 0, stderr
    assert len(receiver.keys) == 3
    assert len(set(receiver.keys)) == 3
    history = run_corral(tmp_path, "alerts", "history", "--json", env=env, check=True)
    sent = json.loads(history.stdout)
    assert [(a["state"], len(a["tries"])) for a in sent] == [("delivered", 1)] * 3


async def _three_quarantined(url: str) -> None:
    db = store.Store.connect(url)
    await db.database.migrate()
    clock = FrozenClock()
    # The alerter has read everything so far (a new one starts after the newest event).
    await db.alerts.write(
        name="alerter", read_from=0, read_to=0, messages=[], digested=[], now=clock.now()
    )
    for _ in range(3):
        await db.jobs.submit(
            new=[model.NewJob(executor="noop", spec={}, queue=f"q{_}")], now=clock.now()
        )
        [c] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
        failed = Finish(
            c.attempt.id, model.AttemptState.FAILED, 1, None, model.FailureClass.PERMANENT
        )
        await db.attempts.finish(finishes=[failed], now=clock.now())
    await db.close()
