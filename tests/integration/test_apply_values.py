"""Values of the wrong type in documents (`corral apply`) on both databases: a list, a
mapping or a number where a field wants something else is refused naming the file, the
document and (for a channel's type) the field, never a crash; through the API, a 422."""

from __future__ import annotations

from typing import Any

import pytest

from corral import client, config, documents, errors, store, tenant_alerts
from corral.client import bodies, monitors
from corral.executors import registry
from corral.testing import FrozenClock
from tests.support.api import serving

HOOK = "https://93.184.216.34/hooks/T000/B000"  # an address the guard allows, never sent to
BASE: dict[str, dict[str, Any]] = {
    "Flow": {"rate": "10/1s", "parallelism": 2},
    "AlertChannel": {"type": "webhook", "url": HOOK, "secret": "whsec_MfKQ9r8GKYqrTwjUPD8I"},
    "AlertRule": {"on": ["failed"], "channels": ["oncall"], "match": {"schedule": "n"}},
    "Monitor": {"period": "1h", "grace": "5m", "channels": ["oncall"]},
    "Schedule": {"every": "1h", "spec": {"command": ["true"]}},
}
FIELDS = {
    "Flow": ("rate", "parallelism"),
    "AlertChannel": ("type", "url", "secret", "webhook_url", "to"),
    "AlertRule": tenant_alerts.RULE_FIELDS,
    "Monitor": tuple(f for f in monitors.FIELDS if f not in ("name", "tenant")),
    "Schedule": tuple(f for f in (*bodies.RULE_FIELDS, *bodies.TEMPLATE_FIELDS) if f != "tenant"),
}
BAD = (["webhook"], {"a": [1]}, 7)
CHANNEL_TYPE = "type: required, one of email, slack, webhook"


@pytest.fixture
async def c(db: store.Store) -> client.Client:
    """A client that checks process and HTTP jobs as `corral apply` does, and a channel
    `oncall` for rules and monitors to name."""
    settings = config.Settings(
        public_url="https://corral.example.com", executors={"enabled": ["process", "http"]}
    )
    clock = FrozenClock()
    checkers = {kind: registry.checker(kind, settings, clock) for kind in ("process", "http")}
    made = client.Client(store=db, executors={}, checkers=checkers, settings=settings, clock=clock)
    raw = {"kind": "AlertChannel", "name": "oncall", **BASE["AlertChannel"]}
    await made.apply("a", [documents.document(raw, "base.yaml", 1)])
    return made


@pytest.mark.parametrize("kind", sorted(BASE))
async def test_a_value_of_the_wrong_type_is_refused_naming_its_document(
    c: client.Client, kind: str
) -> None:
    said = {}
    for field in FIELDS[kind]:
        for bad in BAD:
            raw = {"kind": kind, "name": "n", **BASE[kind], field: bad}
            try:
                await c.apply("a", [documents.document(raw, "x.yaml", 1)], dry_run=True)
            except errors.InvalidInput as refused:  # a value a field takes (parallelism 7) is not
                said[(field, repr(bad))] = str(refused)
    assert said
    where = f"x.yaml: document 1 ({kind} 'n'): "
    assert {k: v for k, v in said.items() if not v.startswith(where)} == {}


@pytest.mark.parametrize("bad", BAD)
async def test_a_channel_s_type_that_is_no_kind_is_refused_naming_the_field(
    c: client.Client, bad: object
) -> None:
    raw = {"kind": "AlertChannel", "name": "pager", **BASE["AlertChannel"], "type": bad}
    with pytest.raises(errors.InvalidInput) as refused:
        await c.apply("a", [documents.document(raw, "alerts.yaml", 2)])
    assert str(refused.value) == f"alerts.yaml: document 2 (AlertChannel 'pager'): {CHANNEL_TYPE}"
    assert [ch.name for ch in await c.tenant_channels("a")] == ["oncall"]


async def test_the_api_answers_a_channel_type_that_is_no_string_with_422(
    db: store.Store,
) -> None:
    async with serving(db, [("a-op", "a", "operator")]) as api:
        doc = {"kind": "AlertChannel", "name": "pager", "type": ["webhook"], "url": HOOK}
        r = await api.http.post("/api/v1/apply", json={"documents": [doc]}, headers=api.as_("a-op"))
        assert r.status_code == 422, r.text
        assert r.json()["error"] == f"documents: document 1 (AlertChannel 'pager'): {CHANNEL_TYPE}"
        body = {"name": "pager", "kind": {"webhook": True}, "url": HOOK}
        r = await api.http.post("/api/v1/alerts/channels", json=body, headers=api.as_("a-op"))
        assert (r.status_code, r.json()["field"]) == (422, "kind"), r.text
        assert await api.c.tenant_channels("a") == []
