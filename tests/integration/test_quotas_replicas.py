"""One tenant's submit_rate holds across API replicas: two real `corral api` processes on
one PostgreSQL database, hammered together with one tenant's token, accept no more jobs
over the window than the tenant's bucket allows (a minute's worth at the start, then its
rate), and refuse the rest with 429 and Retry-After, each replica alike."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral import client, config, model, store
from corral.clock import SystemClock
from tests.conftest import pg_empty
from tests.support.cli import clean_env
from tests.support.crash import stop
from tests.support.net import free_port
from tests.support.wait import eventually

RATE = 30
"""The tenant's submit_rate: jobs a minute, and its bucket's size."""
WINDOW = 4.0
"""Seconds the replicas are hammered for."""
MOST = 400
"""The most requests each hammer sends (a bound, whatever the machine's speed)."""
TASK = {"task": "report", "task_version": 1, "payload": {"n": 1}}
"""A Python task's job: granted to every tenant, it parks until a worker reads it."""


@pytest.fixture
def pg(pg_url: str) -> str:
    pg_empty(pg_url)
    return pg_url


@pytest.fixture
def replicas(pg: str, tmp_path: Path) -> Iterator[list[str]]:
    """Two `corral api` processes on the database `pg`, tenant a's submit_rate RATE: their
    base URLs."""
    (tmp_path / "corral.toml").write_text(f"[tenants.a]\nsubmit_rate = {RATE}\n")
    env = clean_env({"CORRAL_DATABASE_URL": pg, "CORRAL_STATE_DIR": str(tmp_path / "state")})
    ports = [free_port(), free_port()]
    procs = []
    with open(tmp_path / "api.log", "a") as log:
        for port in ports:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "corral", "api", "--http", f"127.0.0.1:{port}"],
                    cwd=tmp_path,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    text=True,
                )
            )
    try:
        yield [f"http://127.0.0.1:{port}" for port in ports]
    finally:
        for proc in procs:
            stop(proc)


async def _token(url: str) -> str:
    db = store.Store.connect(url)
    c = client.Client(store=db, executors={}, settings=config.Settings(), clock=SystemClock())
    _, secret = await c.token_create(name="a-op", tenant="a", role="operator")
    await db.close()
    return secret


async def _ready(http: httpx.AsyncClient) -> bool:
    try:
        return (await http.get("/readyz")).status_code == 200
    except httpx.TransportError:
        return False


async def _hammer(http: httpx.AsyncClient, until: float) -> list[httpx.Response]:
    """Single jobs submitted one after another until `until` (monotonic) or MOST sent."""
    got = []
    while time.monotonic() < until and len(got) < MOST:
        got.append(await http.post("/api/v1/jobs", json=TASK))
    return got


@pytest.mark.postgres
@pytest.mark.slow
async def test_two_replicas_hold_one_submit_rate_together(pg: str, replicas: list[str]) -> None:
    secret = await _token(pg)
    headers = {"Authorization": f"Bearer {secret}"}
    async with (
        httpx.AsyncClient(base_url=replicas[0], headers=headers, timeout=30) as one,
        httpx.AsyncClient(base_url=replicas[1], headers=headers, timeout=30) as two,
    ):
        for http in (one, two):
            await eventually(lambda http=http: _ready(http), what=f"{http.base_url} ready")
        began = time.monotonic()
        answers = await asyncio.gather(_hammer(one, began + WINDOW), _hammer(two, began + WINDOW))
        spent = time.monotonic() - began
    accepted = [r for got in answers for r in got if r.status_code == 201]
    refused = [r for got in answers for r in got if r.status_code != 201]
    allowance = RATE + spent * RATE / 60
    assert RATE <= len(accepted) <= allowance + 1, (len(accepted), spent)
    assert refused, "the hammers never went past the bucket: raise WINDOW"
    for r in refused:
        assert r.status_code == 429, r.text
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["field"] == "submit_rate"
    for got in answers:  # each replica refused some: they take from one bucket
        assert any(r.status_code == 429 for r in got)
    db = store.Store.connect(pg)
    try:
        stored = await db.jobs.list(model.JobFilter(tenant="a"), limit=1000)
    finally:
        await db.close()
    assert len(stored) == len(accepted)
