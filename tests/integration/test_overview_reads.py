"""The overview's reads under many viewers, on both databases: the views that find the kept
drawing old at once share one read of the store, and none shares a read begun before a
change made through the app."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from corral import client, model, store
from corral.testing import FrozenClock
from corral.web import overview as shown_overview
from tests.integration.test_dashboard import count_of
from tests.support.api import noop_client, over_http, sign_in
from tests.support.forms import csrf
from tests.support.wait import eventually

J = model.JobState
NOOP = {"spec": {}, "executor": "noop"}


@pytest.fixture
async def c(db: store.Store) -> client.Client:
    made = noop_client(db)
    await made.user_add("ada", password="correct horse", tenant="a", role="operator")
    return made


@pytest.fixture
async def http(c: client.Client) -> AsyncIterator[httpx.AsyncClient]:
    async with over_http(c) as made:
        yield made


class Held:
    """The client's overview read, counted and held until let go."""

    def __init__(self, c: client.Client, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads = 0
        self.go = asyncio.Event()
        real = c.overview

        async def held(**kwargs: Any) -> Any:
            self.reads += 1
            await self.go.wait()
            return await real(**kwargs)

        monkeypatch.setattr(c, "overview", held)


async def test_views_that_find_the_overview_old_share_one_read(
    http: httpx.AsyncClient, c: client.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(c.clock, FrozenClock)
    await c.submit(**NOOP, tenant="a")
    await sign_in(http, name="ada", password="correct horse")
    assert count_of((await http.get("/ui/")).text, J.QUEUED) == "1"
    await c.submit(**NOOP, tenant="a")  # elsewhere than through the app
    c.clock.advance(shown_overview.KEEP_SECONDS)
    held = Held(c, monkeypatch)
    keeper = http._transport.app.state.overview  # type: ignore[attr-defined]
    asked, shared = [], keeper.shared
    monkeypatch.setattr(keeper, "shared", lambda *a: asked.append(1) or shared(*a))
    views = [asyncio.create_task(http.get("/ui/")) for _ in range(4)]
    await eventually(lambda: len(asked) == 4, what="the four views waiting for a read")
    held.go.set()
    pages = await asyncio.gather(*views)
    assert held.reads == 1, "one read for the four views"
    assert {count_of(p.text, J.QUEUED) for p in pages} == {"2"}


async def test_a_view_let_go_does_not_stop_the_read_the_others_wait_for(
    http: httpx.AsyncClient, c: client.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first view begins the shared read; it is let go (its client went away) while the
    read waits: the other view still gets the overview, from that one read."""
    await sign_in(http, name="ada", password="correct horse")
    held = Held(c, monkeypatch)
    keeper = http._transport.app.state.overview  # type: ignore[attr-defined]
    asked, shared = [], keeper.shared
    monkeypatch.setattr(keeper, "shared", lambda *a: asked.append(1) or shared(*a))
    first = asyncio.create_task(http.get("/ui/"))
    await eventually(lambda: held.reads == 1, what="the first view reading")
    second = asyncio.create_task(http.get("/ui/"))
    await eventually(lambda: len(asked) == 2, what="the second view waiting for that read")
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    held.go.set()
    assert (await second).status_code == 200
    assert held.reads == 1


async def test_a_view_after_a_change_never_shares_a_read_begun_before_it(
    http: httpx.AsyncClient, c: client.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id, _ = await c.submit(**NOOP, tenant="a")
    await sign_in(http, name="ada", password="correct horse")
    form = await http.get("/ui/jobs")
    held = Held(c, monkeypatch)
    before = asyncio.create_task(http.get("/ui/"))
    await eventually(lambda: held.reads == 1, what="a view reading")
    cancel = await http.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": csrf(form)})
    assert cancel.status_code == 303
    after = asyncio.create_task(http.get("/ui/"))
    await eventually(lambda: held.reads == 2, what="a read of its own, begun after the change")
    held.go.set()
    assert count_of((await after).text, J.CANCELLED) == "1"
    assert (await before).status_code == 200
