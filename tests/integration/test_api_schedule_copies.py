"""`POST /api/v1/schedules/{name}/duplicate` and `POST /api/v1/schedules/preview` on both
databases: a copy made in the schedule's own tenant (another tenant's schedule is not
found, a name taken is 409, the tenant's max_schedules holds), and a rule previewed before
it is saved, each refusal naming its field."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from corral import config, store
from corral.tenancy import TenantSettings
from tests.support.api import JOB, Api, serving

TOKENS = [
    ("a-op", "a", "operator"),
    ("a-view", "a", "viewer"),
    ("b-op", "b", "operator"),
    ("admin", None, "admin"),
]
RULE = {"cron": "0 9 * * 1-5", "tz": "Europe/Berlin", "catchup": "all", "jitter": "10s"}


@pytest.fixture
async def api(db: store.Store) -> AsyncIterator[Api]:
    async with serving(db, TOKENS) as made:
        yield made


async def made(api: Api, name: str, who: str = "a-op", **more: Any) -> dict[str, Any]:
    body = {"name": name, **RULE, **JOB, "labels": {"team": "data"}, **more}
    answer = await api.http.post("/api/v1/schedules", json=body, headers=api.as_(who))
    assert answer.status_code == 201, answer.text
    made: dict[str, Any] = answer.json()
    return made


def same(schedule: dict[str, Any]) -> dict[str, Any]:
    """A schedule's JSON but what is its own (its id, name, times of its making)."""
    mine = ("id", "name", "created_at", "updated_at", "next_due", "upcoming")
    return {k: v for k, v in schedule.items() if k not in mine}


async def test_a_copy_has_the_rule_options_and_template_and_fires_on_its_own(api: Api) -> None:
    original = await made(api, "nightly")
    copied = await api.http.post(
        "/api/v1/schedules/nightly/duplicate", json={"name": "nightly-2"}, headers=api.as_("a-op")
    )
    assert copied.status_code == 201, copied.text
    copy = copied.json()
    assert (copy["name"], copy["tenant"]) == ("nightly-2", "a")
    assert same(copy) == same(original)
    assert copy["upcoming"] == original["upcoming"]
    audited = await api.c.store.tokens.audit_list(tenant="a")
    assert (audited[0].action, audited[0].target, audited[0].details) == (
        "schedules.duplicate", "a/nightly-2", {"source": "nightly"},
    )  # fmt: skip
    await api.c.schedule_pause("nightly", tenant="a")
    again = await api.http.post(
        "/api/v1/schedules/nightly/duplicate", json={"name": "nightly-3"}, headers=api.as_("a-op")
    )
    assert again.json()["paused"] is False  # a copy is a new schedule, firing from now


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"name": "nightly"}, 409, "name"),
        ({}, 422, "name"),
        ({"name": 7}, 422, "name"),
        ({"name": "no spaces"}, 422, "name"),
        ({"name": "x", "tenant": "b"}, 422, "tenant"),
    ],
)
async def test_a_copy_refused_names_the_field(
    api: Api, body: dict[str, Any], status: int, field: str
) -> None:
    await made(api, "nightly")
    refused = await api.http.post(
        "/api/v1/schedules/nightly/duplicate", json=body, headers=api.as_("a-op")
    )
    assert refused.status_code == status, refused.text
    assert refused.json()["field"] == field
    assert [s.name for s in await api.c.schedules()] == ["nightly"]


async def test_another_tenant_s_schedule_is_not_copied(api: Api) -> None:
    await made(api, "theirs", who="b-op")
    for who, query in (("a-op", ""), ("a-op", "?tenant=b")):
        refused = await api.http.post(
            f"/api/v1/schedules/theirs/duplicate{query}", json={"name": "mine"},
            headers=api.as_(who),
        )  # fmt: skip
        assert refused.status_code == 404, who
    viewer = await api.http.post(
        "/api/v1/schedules/theirs/duplicate", json={"name": "mine"}, headers=api.as_("a-view")
    )
    assert viewer.status_code == 403
    by_admin = await api.http.post(
        "/api/v1/schedules/theirs/duplicate?tenant=b", json={"name": "theirs-2"},
        headers=api.as_("admin"),
    )  # fmt: skip
    assert by_admin.status_code == 201
    assert by_admin.json()["tenant"] == "b"
    assert sorted((s.tenant, s.name) for s in await api.c.schedules()) == [
        ("b", "theirs"), ("b", "theirs-2"),
    ]  # fmt: skip


async def test_a_copy_past_max_schedules_is_refused(db: store.Store) -> None:
    one = config.Settings(tenants={"a": TenantSettings(max_schedules=1)})
    async with serving(db, TOKENS, settings=one) as api:
        await made(api, "nightly")
        refused = await api.http.post(
            "/api/v1/schedules/nightly/duplicate", json={"name": "n2"}, headers=api.as_("a-op")
        )
        assert refused.status_code == 403
        assert "max_schedules" in refused.json()["error"]
        assert len(await api.c.schedules()) == 1


async def test_a_rule_is_previewed_before_it_is_saved(api: Api) -> None:
    body = {"cron": "30 2 * * *", "tz": "Europe/Paris", "start": "2027-03-27", "count": 3}
    seen = []
    for who in ("a-view", "b-op"):  # it reads nothing of a tenant: the same for each
        answer = await api.http.post("/api/v1/schedules/preview", json=body, headers=api.as_(who))
        assert answer.status_code == 200, answer.text
        seen.append(answer.json())
    assert seen[0] == seen[1]
    assert [n["at"] for n in seen[0]] == [
        "2027-03-27T02:30:00+01:00", "2027-03-28T03:00:00+02:00", "2027-03-29T02:30:00+02:00",
    ]  # fmt: skip
    assert seen[0][1]["moved"].startswith("02:30 does not exist on 2027-03-28")
    every = {"every": "10m", "start": "2030-01-01T00:00:00Z", "until": "2030-01-01T00:25:00Z"}
    ends = await api.http.post("/api/v1/schedules/preview", json=every, headers=api.as_("a-view"))
    assert [n["utc"] for n in ends.json()] == [
        "2030-01-01T00:00:00+00:00", "2030-01-01T00:10:00+00:00", "2030-01-01T00:20:00+00:00",
    ]  # fmt: skip
    assert (await api.http.post("/api/v1/schedules/preview", json=body)).status_code == 401
    assert await api.c.schedules() == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * * * *", "tz": "Mars/Olympus"}, "tz"),
        ({"every": "0s"}, "every"),
        ({"every": 10}, "every"),
        ({"cron": "* * * * *", "every": "1m"}, None),
        ({"cron": "* * * * *", "start": "then"}, "start"),
        ({"every": "1m", "start": "2030-01-02", "until": "2030-01-01"}, "until"),
        ({"every": "1m", "count": 0}, "count"),
        ({"every": "1m", "count": 1001}, "count"),
        ({"every": "1m", "queue": "q"}, "queue"),
        ({"every": "1m", "tz": None}, "tz"),
    ],
)
async def test_a_rule_previewed_wrong_names_the_field(
    api: Api, body: dict[str, Any], field: str | None
) -> None:
    refused = await api.http.post("/api/v1/schedules/preview", json=body, headers=api.as_("a-op"))
    assert refused.status_code == 422, refused.text
    assert refused.json().get("field") == field, refused.text
