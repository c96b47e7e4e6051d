"""Process jobs reach corral through the attempt API on a Unix socket in corral's state
folder, answered by the process that dispatches them (`corral serve`, `corral dispatcher`),
with their attempt token: never with the database's URL, by default."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from corral import config, launching, model, store
from corral.api.server import serve_attempts
from corral.worker.api import ApiReach, AttemptApi
from tests.integration.conftest import Corral, J
from tests.support.cli import clean_env, run_corral
from tests.support.wait import PATIENCE, eventually

ENV_THEN_BEAT = (
    'env | grep "^CORRAL_" | sort > env.txt;'
    f' {sys.executable} -m corral heartbeat && {sys.executable} -c "'
    "from corral import sinks; sinks.save_checkpoint({'step': 2}); print(sinks.load_checkpoint())"
    '"'
)


async def test_a_process_job_heartbeats_and_checkpoints_through_the_socket(
    corral: Corral, tmp_path: Path
) -> None:
    job_id = await corral.submit(f"cd {tmp_path} && {ENV_THEN_BEAT}", policy={"heartbeat": True})
    view = await corral.wait(job_id, J.SUCCEEDED, J.FAILED, J.QUARANTINED)
    assert view.job.state is J.SUCCEEDED, view
    env = dict(line.split("=", 1) for line in (tmp_path / "env.txt").read_text().splitlines())
    sock = corral.client.settings.attempt_socket
    assert env["CORRAL_API_URL"] == f"unix:{sock}"
    assert env["CORRAL_ATTEMPT_TOKEN"].startswith(launching.ATTEMPT_TOKEN_PREFIX)
    assert "CORRAL_DATABASE_URL" not in env
    assert stat.S_ISSOCK(os.stat(sock).st_mode)
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o666  # any job's user: the token decides
    assert await corral.client.store.sinks.checkpoint_load(job_id=job_id) == (
        view.attempts[0].id,
        {"step": 2},
    )


async def test_the_socket_answers_an_attempt_s_own_calls_and_nothing_else(
    corral: Corral,
) -> None:
    sock = str(corral.client.settings.attempt_socket)
    await eventually(lambda: os.path.exists(sock), what="the attempt socket")
    transport = httpx.AsyncHTTPTransport(uds=sock)
    async with httpx.AsyncClient(transport=transport, base_url="http://corral") as http:
        assert (await http.get("/api/v1/jobs")).status_code == 404
        assert (await http.get("/ui/")).status_code == 404
        refused = await http.post("/api/v1/attempt/heartbeat")
        assert refused.status_code == 401
        assert "CORRAL_ATTEMPT_TOKEN" in refused.json()["error"]
        forged = await http.post(
            "/api/v1/attempt/heartbeat",
            headers={"Authorization": f"Bearer {launching.ATTEMPT_TOKEN_PREFIX}1_1_0000"},
        )
        assert forged.status_code == 401


@pytest.fixture
async def db_of(tmp_path: Path, sqlite_url: str) -> AsyncIterator[store.Store]:
    db = store.Store.connect(sqlite_url)
    yield db
    await db.close()


async def test_a_state_folder_deeper_than_a_socket_path_holds_still_works(
    tmp_path: Path, sqlite_url: str, db_of: store.Store
) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    settings = config.Settings(
        database_url=sqlite_url, state_dir=deep, attempt_key="k" * 40
    ).serving_attempts()
    assert len(str(settings.attempt_socket)) > 107
    job_id, fence = await _claimed_job(db_of)
    stop = asyncio.Event()
    serving = asyncio.create_task(serve_attempts(settings, stop))
    try:
        await eventually(lambda: settings.attempt_socket.exists(), what="the socket")
        token = launching.attempt_token("k" * 40, job_id, fence)
        reach = ApiReach(str(settings.local_api_url), token)
        async with AttemptApi(reach) as api:
            assert await api.payload() == {"n": 1}
    finally:
        stop.set()
        await asyncio.wait_for(serving, PATIENCE)
    assert not settings.attempt_socket.exists()  # removed by the corral that made it


async def test_a_dead_corral_s_socket_is_replaced_and_a_live_one_s_is_left_alone(
    tmp_path: Path, sqlite_url: str
) -> None:
    settings = config.Settings(database_url=sqlite_url, state_dir=tmp_path / "state")
    path = settings.attempt_socket
    path.parent.mkdir(parents=True)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # a socket file that nothing answers: a corral that was SIGKILLed
    first_stop, second_stop = asyncio.Event(), asyncio.Event()
    first = asyncio.create_task(serve_attempts(settings, first_stop))
    second = None
    try:
        await eventually(lambda: _answers(path), what="the first corral answering")
        made = os.stat(path).st_ino
        second = asyncio.create_task(serve_attempts(settings, second_stop))
        await eventually(lambda: _answers(path), what="still answered")
        assert os.stat(path).st_ino == made
        first_stop.set()
        await asyncio.wait_for(first, PATIENCE)
        await eventually(
            lambda: _answers(path) and os.stat(path).st_ino != made,
            within=3 * PATIENCE,
            what="the second corral taking the socket over",
        )
    finally:
        first_stop.set()
        second_stop.set()
        await asyncio.wait_for(asyncio.gather(first, *([second] if second else [])), PATIENCE)


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
        return True


async def _claimed_job(db: store.Store) -> tuple[int, int]:
    """A job with a payload whose first attempt runs: its id and that attempt's fence."""
    now = datetime.now(UTC)
    new = model.NewJob(executor="process", spec={"command": ["true"]}, payload={"n": 1})
    [(job_id, _)] = await db.jobs.submit(new=[new], now=now)
    [claimed] = await db.jobs.claim(now=now, limit=1, executors=["process"])
    return job_id, claimed.attempt.id


def test_heartbeat_in_a_pod_without_api_url_says_so(tmp_path: Path) -> None:
    env = clean_env(
        {
            "KUBERNETES_SERVICE_HOST": "10.0.0.1",
            "CORRAL_JOB_ID": "7",
            "CORRAL_ATTEMPT": "1",
            "CORRAL_FENCE": "9",
            "CORRAL_LAUNCH_NAME": "corral-7-1",
        }
    )
    said = run_corral(tmp_path, "heartbeat", env=env)
    assert said.returncode == 2, said
    assert "runs on Kubernetes" in said.stderr
    assert "set api_url" in " ".join(said.stderr.split())
