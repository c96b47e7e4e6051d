"""Callbacks through crashes: a real `corral serve` dies (failpoint `after_job_end`, as a
SIGKILL would) right after the transaction that ended a job and made its callback job, and
is SIGKILLed again while a callback's request is in flight. A real receiver on 127.0.0.1
still gets one signed result per job: deliveries may repeat, each with the one
Idempotency-Key of its job's callback, so counting the keys counts the results."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import defaultdict
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from corral import failpoints, model, store
from tests.chaos.test_http_kills import LIMITS
from tests.support.crash import Site, wait_exit
from tests.support.crash import stop as stop_corral
from tests.support.net import in_thread
from tests.support.wait import eventually_sync

J = model.JobState
SUCCEEDING, FAILING = 4, 2


class Receiver(ThreadingHTTPServer):
    """Keeps each delivery (its Idempotency-Key, whether its signature verifies under
    `secret`, and the result it carried); holds the first one with `hold` set until
    `release` is."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.secret = ""
        self.hold = False
        self.holding = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.got: list[tuple[str, bool, dict[str, Any]]] = []

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a held request's sender was killed: its answer has nowhere to go


class Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        from standardwebhooks.webhooks import Webhook, WebhookVerificationError

        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            Webhook(self.server.secret).verify(data, dict(self.headers.items()))
            signed = True
        except WebhookVerificationError:
            signed = False
        with self.server.lock:
            self.server.got.append((self.headers["Idempotency-Key"], signed, json.loads(data)))
            held = self.server.hold and not self.server.holding.is_set()
            if held:
                self.server.holding.set()
        if held:
            self.server.release.wait(60)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with in_thread(Receiver()) as server:
        try:
            yield server
        finally:
            server.release.set()


def _submit(site: Site, url: str) -> list[int]:
    ids = []
    for n in range(SUCCEEDING):
        made = site.corral("submit", "--callback", url, "--", "echo", f"result {n}", **LIMITS)
        ids.append(int(made.stdout.split()[-1]))
    for _ in range(FAILING):
        made = site.corral(
            "submit", "--failure-callback", url, "--max-attempts", "1", "--",
            "sh", "-c", "echo no; exit 3",
            **LIMITS,
        )  # fmt: skip
        ids.append(int(made.stdout.split()[-1]))
    return ids


def _callback_jobs(url: str) -> list[model.Job]:
    async def go() -> list[model.Job]:
        db = store.Store.connect(url)
        try:
            return [j for j in await db.jobs.list(limit=1000) if j.callback_of is not None]
        finally:
            await db.close()

    return asyncio.run(go())


def _last_attempts(url: str, ids: list[int]) -> dict[int, tuple[int, int]]:
    """Each job's last attempt: its number and its fence."""

    async def go() -> dict[int, tuple[int, int]]:
        db = store.Store.connect(url)
        try:
            out = {}
            for job_id in ids:
                _, attempts, _, _ = await db.jobs.record(job_id=job_id)
                last = max(attempts, key=lambda a: a.id)
                out[job_id] = (last.attempt_no, last.id)
            return out
        finally:
            await db.close()

    return asyncio.run(go())


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_one_signed_result_per_job_through_kills(
    tmp_path: Path, db_url: str, receiver: Receiver
) -> None:
    site = Site(tmp_path, db_url)
    site.corral("db", "upgrade", **LIMITS)
    receiver.secret = site.corral("secrets", "create", "--json").stdout
    receiver.secret = json.loads(receiver.secret)["secret"]
    url = f"http://127.0.0.1:{receiver.server_address[1]}/results"
    ids = _submit(site, url)

    # 1: dies in the first moment after a job's end (and its callback job) committed.
    crashing = site.start("serve", CORRAL_FAILPOINTS="after_job_end:crash", **LIMITS)
    assert wait_exit(crashing, 120) == failpoints.CRASH_EXIT_CODE
    made = _callback_jobs(site.url)
    assert made, "the crash came before any callback job was made"
    assert receiver.got == [], "a callback was sent before the crash"

    # 2: SIGKILLed while a callback's request is held by the receiver.
    receiver.hold = True
    killed = site.start("serve", **LIMITS)
    try:
        assert receiver.holding.wait(120), "no callback was sent after the restart"
    finally:
        killed.kill()
        killed.wait()
    receiver.release.set()

    # 3: runs until every job has ended and every callback has been delivered.
    def delivered() -> bool:
        made = _callback_jobs(site.url)
        return len(made) == len(ids) and all(j.state == J.SUCCEEDED for j in made)

    last = site.start("serve", **LIMITS)
    try:
        eventually_sync(delivered, within=180, every=0.3, what="every callback delivered")
    finally:
        stop_corral(last)

    by_key: dict[str, set[int]] = defaultdict(set)
    for key, signed, result in receiver.got:
        assert signed, f"a delivery of {key} is not signed with the tenant's secret"
        by_key[key].add(result["job"])
    assert sorted(job for jobs in by_key.values() for job in jobs) == sorted(ids)
    assert all(len(jobs) == 1 for jobs in by_key.values()), "one key, one job's result"
    assert len(receiver.got) > len(ids), "the killed delivery was not sent again"
    print(f"{len(ids)} results, {len(receiver.got)} deliveries, {len(by_key)} keys")
    states = {result["job"]: result["state"] for _, _, result in receiver.got}
    assert sorted(states.values()) == ["failed"] * FAILING + ["succeeded"] * SUCCEEDING
    # The result is of the job's last attempt (a job running when serve was killed ran
    # again: its first attempt was lost).
    last = _last_attempts(site.url, ids)
    for _, _, result in receiver.got:
        ok = result["state"] == "succeeded"
        assert result["output"]["stdout"].startswith("result " if ok else "no\n")
        assert result["exit_code"] == (0 if ok else 3)
        assert (result["attempt"], result["fence"]) == last[result["job"]]
