"""The dashboard's overview shows corral's loops and the work nobody can do to a session of
all tenants only: corral's own processes (hosts, pids) are the operator's, never a
tenant's. On both databases, over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from corral import client, loops, store
from tests.support.api import noop_client, over_http, sign_in


@pytest.fixture
async def c(db: store.Store) -> client.Client:
    made = noop_client(db)
    await made.user_add("root", password="correct horse", tenant=None, role="admin")
    await made.user_add("ada", password="correct horse", tenant="a", role="admin")
    return made


@pytest.fixture
async def http(c: client.Client) -> AsyncIterator[httpx.AsyncClient]:
    async with over_http(c) as made:
        yield made


async def overview_as(http: httpx.AsyncClient, name: str) -> str:
    signed = await sign_in(http, to="/ui/", name=name, password="correct horse")
    assert signed.status_code == 303
    page = await http.get("/ui/?fresh=1")
    assert page.status_code == 200
    return page.text


async def test_the_loops_and_their_warnings_show_to_a_session_of_all_tenants_only(
    c: client.Client, http: httpx.AsyncClient
) -> None:
    dispatcher = c.loops.pulse(kind="dispatcher", runs=("dispatcher",), executors=("noop",))
    await dispatcher.start()
    await c.schedule_create("tick", every="1m", spec={"command": ["true"]}, executor="noop")
    everyone = await overview_as(http, "root")
    assert 'id="loops"' in everyone
    assert f"<td>{dispatcher.loop.pid}</td>" in everyone
    assert "no scheduler is running" in everyone
    http.cookies.clear()
    tenant = await overview_as(http, "ada")
    assert 'id="loops"' not in tenant
    assert f"<td>{dispatcher.loop.pid}</td>" not in tenant
    assert "no scheduler is running" not in tenant
    await dispatcher.stop()
    status = await c.loops.status()
    assert [state for _, state in status.loops] == [loops.Liveness.STOPPED]
