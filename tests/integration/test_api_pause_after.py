"""A schedule's pause_after through `/api/v1/schedules` on both databases: set, changed,
shown with the one in effect (its own, or its tenant's default), refused naming the field
when it is no whole number of 0 or more, and another tenant's schedule not found (404)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from corral import config, store
from corral.tenancy import TenantSettings
from tests.support.api import JOB, Api, serving

TOKENS = [("a-op", "a", "operator"), ("b-op", "b", "operator")]
SETTINGS = config.Settings(tenants={"a": TenantSettings(pause_after=4)})


@pytest.fixture
async def api(db: store.Store) -> AsyncIterator[Api]:
    async with serving(db, TOKENS, settings=SETTINGS) as made:
        yield made


async def create(api: Api, name: str, who: str = "a-op", **more: Any) -> Any:
    body = {"name": name, "every": "10m", **JOB, **more}
    return await api.http.post("/api/v1/schedules", json=body, headers=api.as_(who))


async def test_pause_after_is_set_changed_and_shown_with_the_one_in_effect(api: Api) -> None:
    made = await create(api, "own", pause_after=3)
    assert made.status_code == 201, made.text
    assert (made.json()["pause_after"], made.json()["pause_after_in_effect"]) == (3, 3)
    default = (await create(api, "default")).json()
    assert (default["pause_after"], default["pause_after_in_effect"]) == (None, 4)
    never = (await create(api, "never", pause_after=0)).json()
    assert (never["pause_after"], never["pause_after_in_effect"]) == (0, 0)
    changed = await api.http.patch(
        "/api/v1/schedules/own", json={"pause_after": 7}, headers=api.as_("a-op")
    )
    assert changed.status_code == 200, changed.text
    assert changed.json()["pause_after"] == 7
    back = await api.http.patch(
        "/api/v1/schedules/own", json={"pause_after": None}, headers=api.as_("a-op")
    )
    assert (back.json()["pause_after"], back.json()["pause_after_in_effect"]) == (None, 4)
    kept = await api.http.patch(
        "/api/v1/schedules/never", json={"jitter": "5s"}, headers=api.as_("a-op")
    )
    assert kept.json()["pause_after"] == 0  # a change of another key keeps it
    shown = await api.http.get("/api/v1/schedules/never", headers=api.as_("a-op"))
    assert shown.json()["pause_after_in_effect"] == 0
    assert (await api.c.schedule("own", tenant="a")).pause_after is None


@pytest.mark.parametrize("bad", [-1, "3", 1.5, True])
async def test_a_bad_pause_after_is_refused_naming_the_field(api: Api, bad: Any) -> None:
    refused = await create(api, "bad", pause_after=bad)
    assert refused.status_code == 422, refused.text
    assert refused.json()["field"] == "pause_after"
    assert "pause_after" in refused.json()["error"]
    await create(api, "good", pause_after=2)
    patched = await api.http.patch(
        "/api/v1/schedules/good", json={"pause_after": bad}, headers=api.as_("a-op")
    )
    assert patched.status_code == 422
    assert patched.json()["field"] == "pause_after"
    assert (await api.c.schedule("good", tenant="a")).pause_after == 2


async def test_another_tenant_can_neither_see_nor_set_it(api: Api) -> None:
    assert (await create(api, "theirs", who="b-op", pause_after=2)).status_code == 201
    for query in ("", "?tenant=b"):
        seen = await api.http.get(f"/api/v1/schedules/theirs{query}", headers=api.as_("a-op"))
        assert seen.status_code == 404
        set_ = await api.http.patch(
            f"/api/v1/schedules/theirs{query}", json={"pause_after": 0}, headers=api.as_("a-op")
        )
        assert set_.status_code == 404
    assert (await api.c.schedule("theirs", tenant="b")).pause_after == 2
    listed = await api.http.get("/api/v1/schedules", headers=api.as_("a-op"))
    assert listed.json() == []
