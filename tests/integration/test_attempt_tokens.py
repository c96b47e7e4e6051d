"""Attempt tokens: a job's calls to corral (heartbeat, payload, checkpoint, publish pointer)
over the API with a credential good for its own attempt only, refused once a newer
attempt exists."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from corral import client, config, errors, launching, model, store
from corral.api import create_app
from corral.store import Finish
from corral.testing import FrozenClock
from corral.worker.api import ApiReach, AttemptApi
from tests.support.noop import NoopExecutor

A, J = model.AttemptState, model.JobState
KEY = "k" * 48


class Setup:
    def __init__(self, c: client.Client, transport: httpx.ASGITransport) -> None:
        self.c = c
        self.transport = transport

    def api(self, token: str) -> AttemptApi:
        return AttemptApi(ApiReach("http://corral.test", token), transport=self.transport)

    async def running(self, **job: Any) -> model.Claimed:
        """A job submitted and claimed: its current attempt."""
        await self.c.submit(executor="noop", spec={}, max_attempts=3, **job)
        [claimed] = await self.c.store.jobs.claim(
            now=self.c.clock.now(), limit=1, executors=["noop"]
        )
        return claimed

    async def token(self, claimed: model.Claimed) -> str:
        key = await client.tokens.attempt_key(self.c.settings, self.c.store, self.c.clock)
        return launching.attempt_token(key, claimed.job.id, claimed.attempt.id)


@pytest.fixture
async def setup(db: store.Store) -> Setup:
    c = client.Client(
        store=db,
        executors={"noop": NoopExecutor()},
        settings=config.Settings(),
        clock=FrozenClock(),
    )
    return Setup(c, httpx.ASGITransport(app=create_app(c)))


def test_a_token_names_its_attempt_and_no_other_key_or_change_passes() -> None:
    token = launching.attempt_token(KEY, 12, 345)
    assert token.startswith(launching.ATTEMPT_TOKEN_PREFIX)
    assert launching.attempt_token_read(KEY, token) == (12, 345)
    assert launching.attempt_token_read("x" * 48, token) is None
    forged = token.replace("_12_345_", "_12_346_")
    assert launching.attempt_token_read(KEY, forged) is None
    for other in ("", "corral_attempt_", "corral_attempt_1_2", "corral_abc", token + "0"):
        assert launching.attempt_token_read(KEY, other) is None


def test_the_environment_has_the_token_and_never_the_database_url_with_an_api() -> None:
    labels = {model.JOB_ID: "7", model.ATTEMPT: "1", model.FENCE: "9"}
    reach = launching.Reach(api_url="http://corral:8080", attempt_key=KEY)
    env = launching.attempt_env(labels, name="n", tenant="t", reach=reach)
    assert launching.attempt_token_read(KEY, env["CORRAL_ATTEMPT_TOKEN"]) == (7, 9)
    assert env["CORRAL_API_URL"] == "http://corral:8080"
    assert "CORRAL_DATABASE_URL" not in env
    s = config.Settings(database_url="sqlite:///x.db", api_url="http://corral:8080")
    assert s.database_url_for_jobs is None, "api_url set: jobs never get the database's URL"


async def test_an_attempt_calls_with_its_token_until_a_newer_attempt_exists(setup: Setup) -> None:
    claimed = await setup.running(payload={"n": 1})
    await setup.c.store.attempts.record_running(
        fences=[claimed.attempt.id], now=setup.c.clock.now(), reason="test"
    )
    async with setup.api(await setup.token(claimed)) as api:
        await api.heartbeat()
        assert await api.payload() == {"n": 1}
        assert await api.checkpoint_load() is None
        await api.checkpoint_save({"page": 3})
        assert await api.checkpoint_load() == (claimed.attempt.id, {"page": 3})
        location = "file:///data/sales/_staging/fence=1-ab"
        pointer = await api.pointer_swap(dataset="sales", location=location, code_version="v1")
        assert isinstance(pointer, launching.Pointer)
        assert (pointer.fence, pointer.location) == (claimed.attempt.id, location)
        assert await api.pointer_get("sales") == pointer
        assert await api.pointer_get("other") is None

    # The attempt fails; the job retries under a new fence: the old token is refused.
    failed = Finish(claimed.attempt.id, A.FAILED, 1, "boom")
    await setup.c.store.attempts.finish(finishes=[failed], now=setup.c.clock.now())
    setup.c.clock.advance(3600)  # type: ignore[attr-defined]
    [newer] = await setup.c.store.jobs.claim(now=setup.c.clock.now(), limit=1, executors=["noop"])
    assert newer.attempt.id > claimed.attempt.id
    async with setup.api(await setup.token(claimed)) as stale:
        for call in (
            stale.heartbeat(),
            stale.payload(),
            stale.checkpoint_load(),
            stale.checkpoint_save({"page": 0}),
            stale.pointer_get("sales"),
            stale.pointer_swap(dataset="sales", location="file:///old", code_version=None),
        ):
            with pytest.raises(errors.StaleFence, match="is stale"):
                await call
    assert await setup.c.store.sinks.checkpoint_load(job_id=claimed.job.id) == (
        claimed.attempt.id,
        {"page": 3},
    ), "the stale attempt changed nothing"
    async with setup.api(await setup.token(newer)) as api:
        await api.heartbeat()
        swapped = await api.pointer_swap(dataset="sales", location="file:///new", code_version=None)
        assert isinstance(swapped, launching.Pointer)
        assert swapped.fence == newer.attempt.id


async def test_a_pointer_published_by_a_newer_fence_is_refused_naming_it(setup: Setup) -> None:
    older = await setup.running(queue="one")
    newer = await setup.running(queue="two")  # another job: fences are global, so higher
    async with setup.api(await setup.token(newer)) as api:
        await api.pointer_swap(dataset="d", location="file:///new", code_version=None)
    async with setup.api(await setup.token(older)) as api:
        assert await api.pointer_swap(dataset="d", location="file:///old", code_version=None) == (
            newer.attempt.id
        )


async def test_an_attempt_reads_and_swaps_its_own_tenant_s_pointers_only(setup: Setup) -> None:
    """Tenant b's job names tenant a's dataset: it reads nothing, and its swap makes b's own
    pointer of that name, leaving a's where it was (a's job still reads its own)."""
    theirs = await setup.running(queue="one", tenant="a")
    mine = await setup.running(queue="two", tenant="b")  # a newer fence than a's
    async with setup.api(await setup.token(theirs)) as api:
        a_reports = await api.pointer_swap(
            dataset="reports", location="file:///a", code_version=None
        )
        assert isinstance(a_reports, launching.Pointer)
        assert a_reports.tenant == "a"
    async with setup.api(await setup.token(mine)) as api:
        assert await api.pointer_get("reports") is None, "another tenant's dataset is not found"
        b_reports = await api.pointer_swap(
            dataset="reports", location="file:///b", code_version=None
        )
        assert isinstance(b_reports, launching.Pointer)
        assert (b_reports.tenant, b_reports.location) == ("b", "file:///b")
        assert await api.pointer_get("reports") == b_reports
    async with setup.api(await setup.token(theirs)) as api:
        assert await api.pointer_get("reports") == a_reports, "a's pointer did not move"
    got = await setup.c.store.sinks.pointer_get(dataset="reports", tenant="a")
    assert got == a_reports


async def test_attempt_tokens_and_person_tokens_each_open_only_their_own_routes(
    setup: Setup,
) -> None:
    claimed = await setup.running()
    token = await setup.token(claimed)
    _, person = await setup.c.token_create(name="ops", tenant=None, role="admin")
    async with httpx.AsyncClient(transport=setup.transport, base_url="http://corral.test") as http:
        as_attempt = {"Authorization": f"Bearer {token}"}
        as_person = {"Authorization": f"Bearer {person}"}
        assert (await http.get("/api/v1/jobs", headers=as_attempt)).status_code == 401
        r = await http.post("/api/v1/attempt/heartbeat", headers=as_person)
        assert (r.status_code, r.json()["field"]) == (401, "authorization")
        assert (await http.post("/api/v1/attempt/heartbeat")).status_code == 401
        forged = token[:-1] + ("0" if token[-1] != "0" else "1")
        r = await http.post(
            "/api/v1/attempt/heartbeat", headers={"Authorization": f"Bearer {forged}"}
        )
        assert r.status_code == 401
        r = await http.post("/api/v1/attempt/heartbeat", headers=as_attempt)
        assert r.status_code == 200, r.text
        assert r.json()["fence"] == claimed.attempt.id
    with pytest.raises(errors.ConfigError, match="refused CORRAL_ATTEMPT_TOKEN"):
        async with setup.api(person) as api:
            await api.heartbeat()


async def test_every_process_on_a_store_shares_one_attempt_key(db: store.Store) -> None:
    clock = FrozenClock()
    s = config.Settings()
    first = await client.tokens.attempt_key(s, db, clock)
    assert len(first) >= 32
    assert await client.tokens.attempt_key(s, db, clock) == first
    assert await client.tokens.attempt_key(config.Settings(attempt_key=KEY), db, clock) == KEY


def test_only_this_processs_own_attempt_goes_through_the_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from corral.worker import own_api

    for name in ("CORRAL_API_URL", "CORRAL_ATTEMPT_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CORRAL_JOB_ID", "7")
    monkeypatch.setenv("CORRAL_ATTEMPT", "1")
    monkeypatch.setenv("CORRAL_FENCE", "9")
    assert own_api(9) is None, "no API given: the store"
    monkeypatch.setenv("CORRAL_API_URL", "http://127.0.0.1:8080/")
    monkeypatch.setenv("CORRAL_ATTEMPT_TOKEN", "corral_attempt_7_9_x")
    assert own_api(9) == ApiReach("http://127.0.0.1:8080", "corral_attempt_7_9_x")
    assert own_api(None) is not None
    assert own_api(10) is None, "another attempt's writes: not with this one's token"
